"""The moments a taker-in lets go of the picture's lock, where another thread's event can land.

A watch thread changes the picture only while it holds `Picture.lock`; so, against one thread that
takes something in (a watch's start over, the periodic relist), every place another thread's event
can land is one of the moments that thread releases the lock to depth 0. `ReleasePoints` stands in
for the lock and lands the event there itself, on the releasing thread, right after the release:
the same state another thread would have made, with no sleep and no chance. Counting the releases
enumerates every interleaving of the event with the taker-in, one `at` each.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType

from elasticgpu.controller.picture.picture import Picture


class ReleasePoints:
    """Stands in for `Picture.lock` (re-entrant) on one thread; runs `land` once, right after the
    `at`-th outermost release (1-based; 0: never). Also the longest outermost hold (`longest_s`)."""

    def __init__(self, lock: threading.RLock, *, at: int, land: Callable[[], object]) -> None:
        self.inner = lock
        self.at = at
        self.released = 0
        """Outermost releases so far (the event's own, while it lands, not counted)."""
        self.landed = False
        self.longest_s = 0.0
        self._land = land
        self._depth = 0
        self._since = 0.0
        self._landing = False

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self.inner.acquire(blocking, timeout)
        if got:
            if self._depth == 0:
                self._since = time.perf_counter()
            self._depth += 1
        return got

    def release(self) -> None:
        self._depth -= 1
        outermost = self._depth == 0
        if outermost and not self._landing:
            self.longest_s = max(self.longest_s, time.perf_counter() - self._since)
        self.inner.release()
        if not outermost or self._landing:
            return
        self.released += 1
        if self.released == self.at and not self.landed:
            self.landed = True
            self._landing = True
            try:
                self._land()
            finally:
                self._landing = False

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.release()


def probed(picture: Picture, probe: ReleasePoints, call: Callable[[], object]) -> None:
    """`call()` with `probe` standing in for `picture`'s lock; the lock put back after it. The
    picture's parts (records, quotas, nodes) keep the lock itself, the same lock: entered within a
    picture method they release nothing; entered alone (the quota map's `saw`) they are moments
    not counted: fewer interleavings enumerated, none that cannot happen."""
    picture.lock = probe  # type: ignore[assignment]
    try:
        call()
    finally:
        picture.lock = probe.inner
