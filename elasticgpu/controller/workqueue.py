"""The work queue of the controller: object keys waiting to be synced.

Keys are FIFO and never queued twice; a key can come back after a delay; the periodic
resync's keys wait in a background lane that is served only when no other key waits.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Iterable

Key = tuple[str, ...]
"""("claim", namespace, name) or ("egpu", name)."""


class WorkQueue:
    """FIFO of keys without duplicates, with delayed requeues and a background lane.

    Keys added with `background=True` (the periodic resync's requeue of every object) are served
    only when no other key waits: a resync of 50,000 Bound claims must not put a claim created
    now behind all of them. A background key added again normally moves to the front lane."""

    def __init__(self) -> None:
        self._items: deque[Key] = deque()
        self._background: deque[tuple[Key, int]] = deque()
        self._queued: set[Key] = set()
        self._background_only: dict[Key, int] = {}
        """Keys waiting in the background lane only, with the number of their entry there: an
        entry left behind by a key moved to the front lane must not stand in for a later one."""
        self._entries = 0
        self._delayed: list[tuple[float, Key]] = []
        self._cond = threading.Condition()

    def add(self, key: Key, *, delay_s: float = 0.0, background: bool = False) -> None:
        """Queue `key` now, or after `delay_s` seconds; `background`: behind every other key."""
        with self._cond:
            if delay_s > 0:
                heapq.heappush(self._delayed, (time.monotonic() + delay_s, key))
            else:
                self._push(key, background=background)
            self._cond.notify()

    def _push(self, key: Key, *, background: bool) -> None:
        if key not in self._queued:
            self._queued.add(key)
            if background:
                self._entries += 1
                self._background_only[key] = self._entries
                self._background.append((key, self._entries))
            else:
                self._items.append(key)
        elif not background and key in self._background_only:
            del self._background_only[key]  # its entry in the background lane goes stale
            self._items.append(key)

    def _pop(self, *, background: bool = True) -> tuple[Key, bool] | None:
        """The next key and whether it came from the background lane (searched only when
        `background`); None when none waits."""
        while self._items:
            key = self._items.popleft()
            if key in self._queued and key not in self._background_only:
                self._queued.discard(key)
                return key, False
        while background and self._background:
            key, entry = self._background.popleft()
            if self._background_only.get(key) == entry:
                del self._background_only[key]
                self._queued.discard(key)
                return key, True
        return None

    def _next(self, timeout_s: float) -> tuple[Key, bool] | None:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                now = time.monotonic()
                while self._delayed and self._delayed[0][0] <= now:
                    _, key = heapq.heappop(self._delayed)
                    self._push(key, background=False)
                entry = self._pop()
                if entry is not None:
                    return entry
                wait = deadline - now
                if self._delayed:
                    wait = min(wait, self._delayed[0][0] - now)
                if wait <= 0:
                    return None
                self._cond.wait(wait)

    def get(self, timeout_s: float) -> Key | None:
        """The next key, or None after `timeout_s` without one."""
        entry = self._next(timeout_s)
        return entry[0] if entry is not None else None

    def take(self, *, limit: int, background_limit: int, timeout_s: float) -> list[Key]:
        """The next key and whatever else waits now, for one batch: up to `limit` keys of the
        front lane; a batch that starts in the background lane takes at most `background_limit`
        keys (front keys that arrive meanwhile join it first), so that a key queued while the
        resync's keys are worked off waits for a short batch only. Empty after `timeout_s`."""
        entry = self._next(timeout_s)
        if entry is None:
            return []
        first, background = entry
        keys = [first]
        with self._cond:
            while len(keys) < (background_limit if background else limit):
                more = self._pop(background=background)
                if more is None:
                    break
                keys.append(more[0])
        return keys

    def add_all(self, keys: Iterable[Key]) -> None:
        """Queue each of `keys` now, in order."""
        for key in keys:
            self.add(key)

    def __len__(self) -> int:
        with self._cond:
            return len(self._queued)

    def waiting(self) -> int:
        """Keys queued now or for later."""
        with self._cond:
            return len(self._queued) + len(self._delayed)
