"""The controller's tuning of Python's cyclic garbage collector.

The picture (tens of thousands of models and bodies) is long-lived and acyclic, yet every
automatic full collection walked all of it. Start-up takes the full collections over
(`take_over_full_collections`) and freezes the survivors after the first list and after every
resync (`collect_and_freeze`).
"""

from __future__ import annotations

import gc


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
