"""Card health from XID events: fatal XIDs make a card Unhealthy, a quiet period heals it.

Application XIDs (13, 31, 43, 45, 68, 109: an application's illegal access, a page fault of one
context, a preempted channel, ...) are counted and shown, never fatal: the card is fine, one
program was not. Any other XID makes the card Unhealthy with the XID in its condition. After
`recovery_quiet_s` seconds without another fatal XID the card is Healthy again (NVIDIA's device
plugin never recovers a card, which its users complain about; a card that is really broken keeps
reporting XIDs, or vanishes, which inventory reports on its own).

`HealthTracker` is plain state (no I/O, a clock given in): `watch_xids` feeds it from the backend
on its own thread, inventory reads it when it writes the GPU objects.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from elasticgpu.agent.discovery import DiscoveryBackend, XidEvent

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class CardHealth:
    """The health of one card now."""

    healthy: bool
    """False while a fatal XID is younger than the quiet period."""
    reason: str
    """`NoFatalXid`, `Recovered` or `Xid<code>` (one CamelCase word for the condition)."""
    message: str
    """What happened and what happens next, for people."""
    last_fatal: XidEvent | None = None
    """The newest fatal XID ever seen on the card (while the agent runs)."""
    last_application: XidEvent | None = None
    """The newest application XID seen on the card."""


class HealthTracker:
    """XID history per card and the health it implies. Thread-safe."""

    def __init__(self, *, recovery_quiet_s: float, clock: Callable[[], float] = time.time) -> None:
        self._quiet_s = recovery_quiet_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last_fatal: dict[str, XidEvent] = {}
        self._last_application: dict[str, XidEvent] = {}
        self._counts: dict[tuple[str, int], int] = {}

    def record(self, events: Iterable[XidEvent]) -> bool:
        """Take XID events; True when one of them was fatal (inventory should write at once)."""
        fatal = False
        with self._lock:
            for event in events:
                self._counts[(event.gpu_uuid, event.xid)] = self._counts.get((event.gpu_uuid, event.xid), 0) + 1
                if event.fatal:
                    self._last_fatal[event.gpu_uuid] = event
                    fatal = True
                    logger.warning("card %s: fatal XID %d %s", event.gpu_uuid, event.xid, event.message)
                else:
                    self._last_application[event.gpu_uuid] = event
                    logger.info("card %s: application XID %d (not fatal) %s", event.gpu_uuid, event.xid,
                                event.message)
        return fatal

    def restore(self, uuid: str, *, xid: int, timestamp: float) -> None:
        """Take a fatal XID from before a restart (read back from the GPU object), unless a newer one is known.

        Without it, a restarted agent would call a card Healthy that is still in its quiet period.
        """
        with self._lock:
            known = self._last_fatal.get(uuid)
            if known is None or known.timestamp < timestamp:
                self._last_fatal[uuid] = XidEvent(gpu_uuid=uuid, xid=xid, timestamp=timestamp,
                                                  message="seen before the agent restarted")

    def health(self, uuid: str) -> CardHealth:
        """The card's health now."""
        with self._lock:
            fatal = self._last_fatal.get(uuid)
            application = self._last_application.get(uuid)
        if fatal is None:
            return CardHealth(healthy=True, reason="NoFatalXid", message="no fatal XID seen on this card",
                              last_application=application)
        seen = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(fatal.timestamp))
        note = f" ({fatal.message})" if fatal.message else ""
        if self._clock() - fatal.timestamp < self._quiet_s:
            return CardHealth(
                healthy=False, reason=f"Xid{fatal.xid}", last_fatal=fatal, last_application=application,
                message=f"fatal XID {fatal.xid} at {seen}{note}: no new reservations; the card is Healthy again"
                f" after {self._quiet_s:g} s without another fatal XID",
            )
        return CardHealth(
            healthy=True, reason="Recovered", last_fatal=fatal, last_application=application,
            message=f"recovered: no fatal XID for {self._quiet_s:g} s since XID {fatal.xid} at {seen}",
        )

    def counts(self) -> dict[tuple[str, int], int]:
        """XIDs seen per (card uuid, code) since the agent started."""
        with self._lock:
            return dict(self._counts)


def watch_xids(
    backend: DiscoveryBackend,
    tracker: HealthTracker,
    *,
    stop: threading.Event,
    on_fatal: Callable[[], None],
    wait_s: float = 1.0,
) -> None:
    """Feed the tracker from the backend until `stop` is set; call `on_fatal` after a fatal XID. Never dies."""
    failures = 0
    while not stop.is_set():
        try:
            events = backend.wait_xid_events(wait_s)
            failures = 0
        except Exception:  # a worker never dies: log once per streak, back off, go on
            failures += 1
            if failures == 1:
                logger.exception("waiting for XID events failed; retrying with backoff")
            stop.wait(min(30.0, 0.5 * 2**failures))
            continue
        if events and tracker.record(events):
            on_fatal()
