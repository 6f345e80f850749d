"""The work queue of the controller: object keys waiting to be synced.

Keys are FIFO and never queued twice; a key can come back after a delay; the periodic
resync's keys wait in a background lane that is served only when no other key waits; which
keys the resync queues at all is `settled.SettledKeys`'s answer.

A key whose sync failed comes back through `add_after_failure`, as with client-go's default
controller rate limiter: after the larger of its own exponential backoff (`base_delay_s`
doubling per failure in a row, at most `max_delay_s`, reset by `forget` after a success) and
the wait for a token of a bucket shared by every retry (`rate_per_s`, `burst`).
"""

from __future__ import annotations

import heapq
import random
import threading
import time
from collections import deque
from collections.abc import Iterable

from elasticgpu.controller.flow.machinery.settled import SettledKeys
from elasticgpu.controller.settings import RetrySettings

Key = tuple[str, ...]
"""("claim", namespace, name), ("egpu", name), ("gpu", name) or ("pod", namespace, name)."""


class TokenBucket:
    """`rate_per_s` tokens a second, at most `burst` saved up; a taker that finds none waits for
    the next (the debt is kept: takers queue up behind each other, as golang's rate.Limiter)."""

    def __init__(self, *, rate_per_s: float, burst: int) -> None:
        self._rate = rate_per_s
        self._burst = float(burst)
        self._tokens = float(burst)
        self._at = time.monotonic()

    def take(self) -> float:
        """Take one token; the seconds to wait before using it (0 when one was there). Not
        thread-safe: the queue calls it under its lock."""
        now = time.monotonic()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 or self._rate <= 0 else -self._tokens / self._rate


class WorkQueue:
    """FIFO of keys without duplicates, with delayed requeues and a background lane.

    Keys added with `background=True` (the periodic resync's requeue of every object) are served
    only when no other key waits: a resync of 50,000 Bound claims must not put a claim created
    now behind all of them. A background key added again normally moves to the front lane."""

    def __init__(self, retry: RetrySettings | None = None) -> None:
        self._retry = retry or RetrySettings()
        self._failures: dict[Key, int] = {}
        """Failures in a row of each key that failed and has not synced since."""
        self._bucket = TokenBucket(rate_per_s=self._retry.rate_per_s, burst=self._retry.burst)
        self._items: deque[Key] = deque()
        self._background: deque[tuple[Key, int]] = deque()
        self._queued: set[Key] = set()
        self._background_only: dict[Key, int] = {}
        """Keys waiting in the background lane only, with the number of their entry there: an
        entry left behind by a key moved to the front lane must not stand in for a later one."""
        self._entries = 0
        self._delayed: list[tuple[float, Key, bool]] = []
        """(due, key, recheck) by due time; `recheck`: a time-based look (a heartbeat that will
        expire), not a retry: `waiting` does not count it."""
        self._rechecks = 0
        self._cond = threading.Condition()
        self.settled = SettledKeys()
        """Which keys the periodic resync may leave alone: a key queued now (not later, not on the
        background lane) is unsettled, its object or an input having changed (`settled.py`)."""

    def add(self, key: Key, *, delay_s: float = 0.0, background: bool = False, recheck: bool = False) -> None:
        """Queue `key` now, or after `delay_s` seconds; `background`: behind every other key;
        `recheck`: a delayed look at an object whose state changes with time alone, which
        `waiting` does not count (nothing is left to do until it is due)."""
        if delay_s <= 0:
            if background:
                self.settled.seen(key)
            else:
                self.settled.unsettle(key)
        with self._cond:
            if delay_s > 0:
                heapq.heappush(self._delayed, (time.monotonic() + delay_s, key, recheck))
                self._rechecks += recheck
            else:
                self._push(key, background=background)
            self._cond.notify()

    def backoff_s(self, failures: int) -> float:
        """The per-key delay after `failures` failures in a row (without jitter)."""
        retry = self._retry
        return min(retry.base_delay_s * 2 ** min(failures - 1, 64), retry.max_delay_s) if failures > 0 else 0.0

    def add_after_failure(self, key: Key) -> float:
        """Queue `key` again after its sync failed: after its backoff (jittered) or the retry
        bucket's wait, whichever is longer. Returns the delay in seconds."""
        with self._cond:
            failures = self._failures.get(key, 0) + 1
            self._failures[key] = failures
            delay = self.backoff_s(failures)
            jitter = self._retry.jitter
            if jitter > 0:
                delay *= random.uniform(1 - jitter, 1 + jitter)
            delay = max(delay, self._bucket.take())
        self.add(key, delay_s=delay)
        return delay

    def forget(self, key: Key) -> None:
        """`key` synced: its next failure starts the backoff again from the base delay."""
        if key in self._failures:  # a dict read: most syncs succeed and need not take the lock
            with self._cond:
                self._failures.pop(key, None)

    def failures(self, key: Key) -> int:
        """Failures in a row of `key` since it last synced."""
        with self._cond:
            return self._failures.get(key, 0)

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
                    _, key, recheck = heapq.heappop(self._delayed)
                    self._rechecks -= recheck
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
        """Keys queued now or for later (rechecks not counted)."""
        with self._cond:
            return len(self._queued) + len(self._delayed) - self._rechecks
