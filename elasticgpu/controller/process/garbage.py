"""The controller's tuning of Python's cyclic garbage collector.

The picture (tens of thousands of models and bodies) is long-lived and acyclic, yet every
automatic full collection walked all of it. Start-up takes the full collections over
(`take_over_full_collections`) and freezes the survivors after the first list and after every
resync (`collect_and_freeze`); the first list itself runs with the collector off (`paused`).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


def take_over_full_collections() -> None:
    """Stop the cyclic garbage collector's automatic full collections (`collect_and_freeze`
    freezes the survivors at every resync instead).

    Every automatic full collection walked the whole picture: pauses of 180-240 ms with 3,000
    claims, every few seconds while claims arrived (`bench/binding.py`, measured with gc
    callbacks), and they were the whole p99 at low load. Young collections (generations 0 and
    1) run as before."""
    young, middle, _full = gc.get_threshold()
    gc.set_threshold(young, middle, 1_000_000)


def collect_and_freeze() -> None:
    """A young collection, then `gc.freeze`: what is alive now is never walked again. (A full
    collection here cost 200 ms after a burst of 1,500 claims: the stall the resync must not
    be.) The price: a reference cycle that outlives two young collections is never reclaimed.
    The picture holds none (plain dicts and pydantic models, replaced by new versions);
    `tests/controller/test_garbage.py` fails if binding starts to leave cycles behind."""
    gc.collect(1)
    gc.freeze()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """The collector off for the block, back as it was after (even when the block raises).

    For the first list: it builds the whole picture, every object a survivor, so each
    collection of it walked ever more of what it had built and freed nothing. At 40,000 cards and
    50,000 claims that was half of the first list's CPU, 25.9 s against 13.0 s with the collector
    off (`bench/first_list.py --gc on|off`). The list's own temporaries are acyclic (parsed
    JSON, models): reference counting frees them; `collect_and_freeze` follows the list."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
