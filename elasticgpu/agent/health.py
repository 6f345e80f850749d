"""Card health from XID events, by what NVIDIA documents each XID to mean (`elasticgpu.api.xids`).

- informational XIDs (63 row remap recorded, 92 corrected-ECC rate) and application XIDs (13, 31,
  43, 45, 68, 109: one program's error) are counted and shown, never fail the card;
- transient XIDs (94 contained ECC) make the card Unhealthy (no new reservations) until
  `recovery_quiet_s` seconds pass without another;
- every other XID (48, 64, 74, 79, 95, 119/120, ...; unknown ones too) needs a reset: the card stays
  Unhealthy, however quiet (it gets no work, so quiet proves nothing), until the backend reports
  the reset (`CardReset`: NVML re-enumerated the card or a pending recovery action cleared; the
  simulated backend's `reset` entry) or the node booted after the XID.

`HealthTracker` is plain state (no I/O, a clock given in): `watch_xids` feeds it XIDs and resets
from the backend on its own thread, inventory reads it when it writes the GPU objects.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from elasticgpu.agent.discovery import CardReset, DiscoveryBackend, XidEvent
from elasticgpu.api import xids

logger = logging.getLogger(__name__)


def host_boot_time(stat: Path = Path("/proc/stat")) -> float | None:
    """When the host booted (time.time() scale), from `btime` in /proc/stat; None when unknown."""
    try:
        for line in stat.read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _when(timestamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))


@dataclass(frozen=True, kw_only=True)
class CardHealth:
    """The health of one card now."""

    healthy: bool
    """False while a reset-required XID awaits its reset, or a transient XID is younger than the quiet period."""
    reason: str
    """`NoFatalXid`, `Recovered`, `Reset` or `Xid<code>` (one CamelCase word for the condition)."""
    message: str
    """What happened and what happens next, for people."""
    last_fatal: XidEvent | None = None
    """The newest XID that failed the card (transient or reset-required) while the agent runs."""
    last_application: XidEvent | None = None
    """The newest application XID seen on the card."""
    last_informational: XidEvent | None = None
    """The newest informational XID seen on the card (never fails it)."""


class HealthTracker:
    """XID history per card and the health it implies. Thread-safe."""

    def __init__(
        self,
        *,
        recovery_quiet_s: float,
        clock: Callable[[], float] = time.time,
        boot_time: Callable[[], float | None] = host_boot_time,
    ) -> None:
        self._quiet_s = recovery_quiet_s
        self._clock = clock
        self._boot_time = boot_time
        self._lock = threading.Lock()
        self._awaiting_reset: dict[str, XidEvent] = {}  # the newest reset-required XID not cleared by a reset
        self._last_transient: dict[str, XidEvent] = {}
        self._last_fatal: dict[str, XidEvent] = {}
        self._last_reset: dict[str, tuple[CardReset, XidEvent]] = {}
        self._last_application: dict[str, XidEvent] = {}
        self._last_informational: dict[str, XidEvent] = {}
        self._counts: dict[tuple[str, int], int] = {}

    def record(self, events: Iterable[XidEvent]) -> bool:
        """Take XID events; True when one of them failed a card (inventory should write at once)."""
        fatal = False
        with self._lock:
            for event in events:
                self._counts[(event.gpu_uuid, event.xid)] = self._counts.get((event.gpu_uuid, event.xid), 0) + 1
                kind = event.kind
                if kind is xids.XidKind.RESET:
                    self._awaiting_reset[event.gpu_uuid] = event
                elif kind is xids.XidKind.TRANSIENT:
                    self._last_transient[event.gpu_uuid] = event
                elif kind is xids.XidKind.APPLICATION:
                    self._last_application[event.gpu_uuid] = event
                else:
                    self._last_informational[event.gpu_uuid] = event
                if event.fatal:
                    self._last_fatal[event.gpu_uuid] = event
                    fatal = True
                    logger.warning("card %s: XID %d (%s, %s) %s", event.gpu_uuid, event.xid,
                                   xids.classify(event.xid).name, kind.value, event.message)
                else:
                    logger.info("card %s: %s XID %d (not fatal) %s", event.gpu_uuid, kind.value, event.xid,
                                event.message)
        return fatal

    def awaiting_reset(self) -> set[str]:
        """Uuids of the cards that stay Unhealthy until they are reset."""
        with self._lock:
            return set(self._awaiting_reset)

    def record_resets(self, resets: Iterable[CardReset]) -> bool:
        """Take reset evidence; True when it made a card Healthy again (inventory should write at once).

        A reset older than the card's newest reset-required XID clears nothing: that XID came after it.
        """
        changed = False
        with self._lock:
            for reset in resets:
                waiting = self._awaiting_reset.get(reset.gpu_uuid)
                if waiting is None or reset.timestamp < waiting.timestamp:
                    continue
                del self._awaiting_reset[reset.gpu_uuid]
                self._last_reset[reset.gpu_uuid] = (reset, waiting)
                changed = True
                logger.info("card %s: reset (%s) after XID %d: Healthy again", reset.gpu_uuid, reset.how, waiting.xid)
        return changed

    def restore(self, uuid: str, *, xid: int, timestamp: float) -> None:
        """Take an XID that failed the card before a restart (read back from the GPU object).

        Without it, a restarted agent would call a card Healthy that still needs its reset or is in its
        quiet period. A reset-required XID older than the host's boot was cleared by the reboot; an XID
        the table now calls informational or application (an older agent failed the card for it) is
        dropped.
        """
        event = XidEvent(gpu_uuid=uuid, xid=xid, timestamp=timestamp, message="seen before the agent restarted")
        kind = event.kind
        if kind is xids.XidKind.RESET:
            booted = self._boot_time()
            if booted is not None and booted > timestamp:
                logger.info("card %s: XID %d at %s was before the node booted (%s): cleared by the reboot",
                            uuid, xid, _when(timestamp), _when(booted))
                return
            target = self._awaiting_reset
        elif kind is xids.XidKind.TRANSIENT:
            target = self._last_transient
        else:
            return
        with self._lock:
            known = target.get(uuid)
            if known is None or known.timestamp < timestamp:
                target[uuid] = event
                self._last_fatal.setdefault(uuid, event)

    def health(self, uuid: str) -> CardHealth:
        """The card's health now."""
        with self._lock:
            waiting = self._awaiting_reset.get(uuid)
            transient = self._last_transient.get(uuid)
            fatal = self._last_fatal.get(uuid)
            reset = self._last_reset.get(uuid)
            seen = {"last_fatal": fatal, "last_application": self._last_application.get(uuid),
                    "last_informational": self._last_informational.get(uuid)}
        if waiting is not None:
            info = xids.classify(waiting.xid)
            note = f" ({waiting.message})" if waiting.message else ""
            return CardHealth(
                healthy=False, reason=f"Xid{waiting.xid}", **seen,
                message=f"XID {waiting.xid} at {_when(waiting.timestamp)}: {info.name}{note}. The card needs a reset:"
                f" {info.action}. No new reservations until the agent sees the reset (the card re-enumerated or"
                " NVML's pending recovery action cleared).",
            )
        if transient is not None and self._clock() - transient.timestamp < self._quiet_s:
            note = f" ({transient.message})" if transient.message else ""
            return CardHealth(
                healthy=False, reason=f"Xid{transient.xid}", **seen,
                message=f"XID {transient.xid} at {_when(transient.timestamp)}: {xids.classify(transient.xid).name}"
                f"{note}: no new reservations; the card is Healthy again after {self._quiet_s:g} s without"
                " another",
            )
        # Healthy: say why, the newest of a reset and a transient recovery first.
        if reset is not None and (transient is None or reset[0].timestamp >= transient.timestamp):
            done, cleared = reset
            return CardHealth(
                healthy=True, reason="Reset", **seen,
                message=f"reset at {_when(done.timestamp)} ({done.how}) after XID {cleared.xid} at"
                f" {_when(cleared.timestamp)}",
            )
        if transient is not None:
            return CardHealth(
                healthy=True, reason="Recovered", **seen,
                message=f"recovered: no transient XID for {self._quiet_s:g} s since XID {transient.xid} at"
                f" {_when(transient.timestamp)}",
            )
        return CardHealth(healthy=True, reason="NoFatalXid", message="no XID that fails the card seen on it",
                          **seen)

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
    """Feed the tracker XIDs and resets from the backend until `stop` is set. Never dies.

    `on_fatal` is called whenever a card's health changed at once (an XID failed it, a reset healed
    it), so inventory writes now instead of at its next interval; a quiet period's end is found by
    inventory's own passes.
    """
    failures = 0
    while not stop.is_set():
        try:
            events = backend.wait_xid_events(wait_s)
            if events and tracker.record(events):
                on_fatal()
            # Asked every pass (not only while a card waits), so a reset from before an XID is never kept for it.
            if tracker.record_resets(backend.card_resets(tracker.awaiting_reset())):
                on_fatal()
            failures = 0
        except Exception:  # a worker never dies: log once per streak, back off, go on
            failures += 1
            if failures == 1:
                logger.exception("waiting for XID events or resets failed; retrying with backoff")
            stop.wait(min(30.0, 0.5 * 2**failures))
