"""Telling systemd, the agent's supervisor on a node, when the agent is ready and that it is alive
(the `sd_notify` protocol: one datagram of `KEY=value` lines to the socket in `$NOTIFY_SOCKET`).

Why: kubelet reaches the runtime through the agent's socket, so kubelet must start only once that
socket serves (`Type=notify` and `Before=kubelet.service`: `READY=1` is sent when it does), and an
agent that hangs (a loop that died, a deadlock) must be restarted, not left holding the node's
runtime socket (`WatchdogSec=`: `WATCHDOG=1` is sent only while every loop is alive).

Outside systemd (no `$NOTIFY_SOCKET`) all of this is off and costs nothing. The protocol is a few
lines; the `sdnotify`/`systemd-python` packages would add a dependency (and a C build) for them.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

logger = logging.getLogger(__name__)

Check = Callable[[], str | None]
"""A check: None when all is well, else what is wrong (for `STATUS=` and the log)."""


@dataclass(frozen=True)
class ServiceManager:
    """Where to notify, and how often the watchdog wants to hear from us (None: no watchdog)."""

    address: str | None
    watchdog_interval_s: float | None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> ServiceManager:
        """Read `$NOTIFY_SOCKET` and `$WATCHDOG_USEC` (the latter only when `$WATCHDOG_PID` is unset
        or names this process: a child started by the agent must not ping for it)."""
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET") or None
        interval = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            interval = int(usec) / 1_000_000
        return cls(address=address, watchdog_interval_s=interval if address else None)

    @property
    def enabled(self) -> bool:
        """True under a supervisor that listens (systemd with `Type=notify` or `NotifyAccess=`)."""
        return self.address is not None

    def notify(self, **fields: str) -> bool:
        """Send `KEY=value` lines (`notify(READY="1", STATUS="...")`); False when it could not be
        sent (logged at debug: a supervisor that stopped listening is not the agent's failure)."""
        if self.address is None:
            return False
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        message = "\n".join(f"{key}={value}" for key, value in fields.items()).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(message, target)
        except OSError as e:
            logger.debug("could not notify the service manager at %s: %s", self.address, e)
            return False
        return True

    def run(self, stop: threading.Event, *, ready: Check, alive: Check, tick_s: float = 0.5) -> None:
        """Until `stop`: send `READY=1` once `ready()` holds, and `WATCHDOG=1` every half watchdog
        interval while `alive()` holds; then `STOPPING=1`. Never raises (a failed check is a
        problem reported, not a crash)."""
        if not self.enabled:
            return
        told_ready = False
        problem_said: str | None = None
        last_ping = float("-inf")
        period = self.watchdog_interval_s / 2 if self.watchdog_interval_s else None
        while not stop.is_set():
            if not told_ready:
                waiting = _safely(ready)
                if waiting is None and self.notify(READY="1", STATUS="serving"):
                    told_ready = True
                    logger.info("told the service manager the agent is ready")
            now = time.monotonic()
            if period is not None and now - last_ping >= period:
                problem = _safely(alive)
                if problem is None:
                    self.notify(WATCHDOG="1")
                    last_ping = now
                    if problem_said is not None:
                        logger.info("alive again: pinging the watchdog")
                        self.notify(STATUS="serving" if told_ready else "starting")
                    problem_said = None
                elif problem != problem_said:
                    # No ping: systemd restarts the agent when WatchdogSec passes without one.
                    logger.error("not pinging the watchdog: %s; systemd restarts the agent unless this passes", problem)
                    self.notify(STATUS=problem)
                    problem_said = problem
            stop.wait(min(tick_s, period) if period else tick_s)
        self.notify(STOPPING="1", STATUS="stopping")


def _safely(check: Check) -> str | None:
    try:
        return check()
    except Exception as e:  # a check that fails is a problem to report
        return f"check failed: {e!r}"
