"""Liveness: are the controller's threads alive, and do its loops make progress?

The interface for a `/healthz` check is two methods: `alive() -> bool` and `reason() -> str`
(empty when alive, else what is wrong, e.g. "thread binder died" or "watch-claim made no
progress for 191s"). Threads are registered with `track`; loops call `step(name)` whenever
they make progress (the worker on every pass, a watch on every event, every reopen and every
failed attempt), and a loop registered with `expect` fails the check when it has not stepped
for `stuck_after_s` seconds. An API server that is down does not fail the check (a watch that
retries is stepping): restarting the controller would not bring the server back.
"""

from __future__ import annotations

import threading
import time


class Liveness:
    """See the module docstring. Thread-safe; `step` is cheap (one dict store)."""

    def __init__(self, *, stuck_after_s: float = 180.0) -> None:
        self.stuck_after_s = stuck_after_s
        self._threads: list[threading.Thread] = []
        self._steps: dict[str, float] = {}
        self._lock = threading.Lock()

    def track(self, thread: threading.Thread) -> None:
        """Fail the check once `thread` is no longer alive."""
        with self._lock:
            self._threads.append(thread)

    def threads(self) -> list[threading.Thread]:
        """The threads tracked (a stopped controller's are joined by whoever stops it in-process)."""
        with self._lock:
            return list(self._threads)

    def expect(self, name: str) -> None:
        """Fail the check when loop `name` does not `step` for `stuck_after_s` from now on."""
        self.step(name)

    def step(self, name: str) -> None:
        """Loop `name` made progress now."""
        self._steps[name] = time.monotonic()

    def last_step(self, name: str) -> float | None:
        """`time.monotonic()` of loop `name`'s last step, or None when it never stepped."""
        return self._steps.get(name)

    def reason(self) -> str:
        """What is wrong ("" when nothing is)."""
        with self._lock:
            dead = [t.name for t in self._threads if not t.is_alive()]
        if dead:
            return f"thread {', '.join(sorted(dead))} died; the controller must be restarted"
        now = time.monotonic()
        stuck = sorted((name, now - at) for name, at in list(self._steps.items()) if now - at > self.stuck_after_s)
        if stuck:
            return "; ".join(f"{name} made no progress for {age:.0f}s" for name, age in stuck)
        return ""

    def alive(self) -> bool:
        """True while every tracked thread lives and every expected loop steps."""
        return not self.reason()
