"""The agent's parts that can fail at start, opened in the background: it never exits for them.

kubelet reaches the runtime of every pod of the node through the agent's CRI socket, so that
socket is served first (running.py) and nothing below may stop it:

    device backend   NVML (or the simulated backend's description file)   discovery.open_backend
    ledger           the SQLite file (a corrupt one is moved aside and     LedgerStore.open_or_set_aside
                     a new one rebuilt from the runtime's containers)
    API client       the kubeconfig or the in-cluster service account      kube.load_api_client

`Parts.run` opens each part that is not open yet, each on its own backoff (doubling from
`first_s` up to `longest_s`, times a random factor in [0.5, 1] so that the agents of a cluster
that lost the same thing do not retry in step), until all are open or the agent stops. A
failure is logged at warning when it differs from the last one logged for its part, the same
failure again at debug, the part's opening at info: one line per change of state, not one per
retry. Until every part is open, `not_ready()` says which are not and why: claim containers are
refused with that text (retryable), every other container passes.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class Part(Generic[T]):
    """One part: how to open it, and what happened so far."""

    what: str
    """What it is, for logs and refusals ("the device backend (nvml)")."""
    opener: Callable[[], T]
    value: T | None = None
    problem: str = "not opened yet"
    failures: int = 0
    next_at: float = 0.0
    logged: str | None = field(default=None, repr=False)


@dataclass(frozen=True, kw_only=True)
class BackoffSettings:
    """How often a part that failed to open is tried again."""

    first_s: float = 0.5
    """Wait after the first failure (seconds); it doubles with each failure in a row."""
    longest_s: float = 30.0
    """The longest wait (seconds) before the jitter: a part that comes back is found within it."""


class Parts:
    """The device backend, the ledger and the API client, opened in the background (see the module docstring)."""

    def __init__(
        self,
        *,
        backend: Part[Any],
        ledger: Part[Any],
        kube: Part[Any],
        backoff: BackoffSettings = BackoffSettings(),
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = lambda: random.uniform(0.5, 1.0),
    ) -> None:
        """`ledger`'s opener returns (store, where a corrupt file was moved or None)."""
        self._parts = {"backend": backend, "ledger": ledger, "kube": kube}
        self._backoff = backoff
        self._clock = clock
        self._jitter = jitter
        self.ready = threading.Event()
        """Set once every part is open."""
        self.set_aside: Path | None = None
        """Where a corrupt ledger file was moved; None when none was (cleared once the ledger is rebuilt)."""

    @property
    def backend(self) -> Any:
        """The device backend (discovery.DiscoveryBackend), or None while it is not open."""
        return self._parts["backend"].value

    @property
    def ledger(self) -> Any:
        """The ledger (LedgerStore), or None while it is not open."""
        value = self._parts["ledger"].value
        return None if value is None else value[0]

    @property
    def kube(self) -> Any:
        """The API client (kube.AgentKube), or None while it is not open."""
        return self._parts["kube"].value

    def not_ready(self) -> str | None:
        """Which parts are not open and why, or None when all are."""
        missing = [f"{part.what}: {part.problem}" for part in self._parts.values() if part.value is None]
        return "; ".join(missing) if missing else None

    def problem_of(self, name: str) -> str | None:
        """Why the part `name` (backend, ledger, kube) is not open, or None when it is."""
        part = self._parts[name]
        return None if part.value is not None else f"{part.what}: {part.problem}"

    def open_due(self) -> float | None:
        """Try every part whose retry is due; returns seconds until the next is due, None when all are open."""
        now = self._clock()
        waits = []
        for name, part in self._parts.items():
            if part.value is not None:
                continue
            if now < part.next_at:
                waits.append(part.next_at - now)
                continue
            try:
                value = part.opener()
            except Exception as e:  # each part's errors say what to fix; the agent keeps serving
                waits.append(self._failed(part, e, now))
                continue
            if name == "ledger" and value[1] is not None:
                self.set_aside = value[1]
            part.value = value
            log.info("%s is open%s", part.what, f" after {part.failures} failed attempt(s)" if part.failures else "")
            part.failures, part.logged = 0, None
        if all(part.value is not None for part in self._parts.values()):
            self.ready.set()
            return None
        return max(0.0, float(min(waits))) if waits else 0.0

    def _failed(self, part: Part[Any], error: Exception, now: float) -> float:
        part.failures += 1
        delay = float(min(self._backoff.longest_s, self._backoff.first_s * 2 ** (part.failures - 1)) * self._jitter())
        part.next_at = now + delay
        part.problem = f"{type(error).__name__}: {error}"
        if part.problem != part.logged:
            log.warning("%s cannot be opened (%s); the CRI socket is served meanwhile, claim containers are refused "
                        "until it opens; retrying with backoff", part.what, part.problem)  # fmt: skip
            part.logged = part.problem
        else:
            log.debug("%s cannot be opened yet (%s); next try in %.1f s", part.what, part.problem, delay)
        return delay

    def run(self, stop: threading.Event) -> None:
        """Open the parts until all are open or `stop` is set. Never raises."""
        while not stop.is_set():
            try:
                wait = self.open_due()
            except Exception:  # a bug of ours: keep the agent serving, try again later
                log.exception("opening the agent's parts failed")
                wait = self._backoff.longest_s
            if wait is None:
                return
            stop.wait(wait)

    def close(self) -> None:
        """Close the parts that were opened (the agent is stopping)."""
        kube, ledger, backend = self.kube, self.ledger, self.backend
        for closing in (kube, ledger, backend):
            if closing is not None:
                try:
                    closing.close()
                except Exception:
                    log.exception("closing %r failed", closing)
