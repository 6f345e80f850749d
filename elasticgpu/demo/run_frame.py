"""What every run of the demo shares, however the product is installed (`running`: as processes;
`chart`: as the chart's pods): its folder in the temp dir (owned by its pid, swept once its owner
is gone), its phases' timings, and its interrupts. Both runs import it; it imports neither, so the
data flows one way: running -> chart -> run_frame (issue 51).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

TMP_PREFIX = "egdemo-"  # short: unix socket paths must stay under 108 bytes
OWNER_FILE = "owner.pid"
"""In each run's folder: the pid of the demo that made it (`sweep_stale_dirs`)."""
STUCK_AFTER_S = 60.0
"""How long after the first Ctrl-C the run may take to clean up before the watchdog ends it: a
cleanup stops each child within 15 s plus 15 s (SIGTERM, then SIGKILL), in parallel."""


class Phases:
    """Seconds per phase, printed at the end."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.done: list[tuple[str, float]] = []

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as phase `name` (recorded even when it fails)."""
        began = time.monotonic()
        try:
            yield
        finally:
            self.done.append((name, time.monotonic() - began))


class Interrupts:
    """Ctrl-C (SIGINT) and SIGTERM (a CI timeout, `kill`): the first unwinds the run like Ctrl-C
    (KeyboardInterrupt), so that cleanup stops every child and removes the folder; any later one
    is only counted. A second Ctrl-C once landed in the cleanup itself: a traceback, and 123 MB of
    containerd state left in /tmp (issue 36). Installed only over the default handlers (a test
    harness's own stay).

    The first one also arms a watchdog: a KeyboardInterrupt lands wherever the main thread is, and
    some places do not survive it (a gRPC channel closed while a call it interrupted is in flight
    can deadlock: grpc/grpc#19973, #20026; a lock taken and never released). If the run has not
    finished `stuck_after_s` later, the watchdog calls `abandon` (kill what the run started, remove
    its files, say so) and exits the process: the run ends, however it was interrupted."""

    def __init__(self, *, stuck_after_s: float | None = None) -> None:
        self.count = 0
        self.shielded = False
        """Set while cleaning up: an interrupt then only counts (the run ends right after anyway)."""
        self.installed: list[tuple[int, Any]] = []
        self.abandon: Callable[[], None] | None = None
        """What the watchdog does before it exits: set by the run once it has something to clean up."""
        self.stuck_after_s = stuck_after_s if stuck_after_s is not None else cleanup_deadline_s()
        self._watchdog: threading.Timer | None = None
        self._ending = threading.Lock()
        """Held by whoever ends the run: the run's own last lines, or the watchdog."""

    def __call__(self, signum: int, frame: object) -> None:
        self.count += 1
        if self.count == 1:
            self._arm()
        if self.count == 1 and not self.shielded:
            raise KeyboardInterrupt(signal.Signals(signum).name)

    def install(self) -> None:
        """Take SIGINT and SIGTERM where they still have Python's defaults (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL)):
            previous = signal.getsignal(signum)
            if previous is default:
                self.installed.append((signum, previous))
                signal.signal(signum, self)

    def finish(self) -> None:
        """The run is about to say its last line: the watchdog must not end it too. If the watchdog
        is ending it already, wait for that (the process exits there)."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        if not self._ending.acquire(timeout=self.stuck_after_s):
            return  # the watchdog did not exit: say the run's own last line after all

    def restore(self) -> None:
        """Put back the handlers `install` replaced, and disarm the watchdog."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        for signum, previous in self.installed:
            signal.signal(signum, previous)
        self.installed.clear()

    def _arm(self) -> None:
        if not self.installed or self.abandon is None:  # a harness's own handlers; nothing to clean up yet
            return
        self._watchdog = threading.Timer(self.stuck_after_s, self._give_up)
        self._watchdog.daemon = True
        self._watchdog.start()

    def _give_up(self) -> None:
        if not self._ending.acquire(blocking=False):
            return  # the run is saying its last line
        try:
            if self.abandon is not None:
                self.abandon()
        except BaseException:  # the process ends next whatever happened: the exit code says it
            pass
        finally:
            # os._exit skips the exit handlers, among them the kubernetes client's removal of its
            # certificate files in the temp dir: run them, but on a thread, so that one of them
            # waiting on what the main thread holds cannot keep the process alive.
            handlers = threading.Thread(target=atexit._run_exitfuncs, daemon=True)
            handlers.start()
            handlers.join(timeout=5)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(INTERRUPTED)


def cleanup_deadline_s() -> float:
    """`ELASTICGPU_DEMO_CLEANUP_DEADLINE_S`, else `STUCK_AFTER_S`: how long after the first Ctrl-C
    the run may take to clean up (a slower machine may want more)."""
    try:
        return float(os.environ.get("ELASTICGPU_DEMO_CLEANUP_DEADLINE_S", STUCK_AFTER_S))
    except ValueError:
        return STUCK_AFTER_S


def sweep_stale_dirs() -> None:
    """Remove the folders of earlier demos whose process is gone (killed before it could clean up:
    SIGKILL, a power cut); a folder of a demo still running, or without an owner, is left alone."""
    for directory in Path(tempfile.gettempdir()).glob(f"{TMP_PREFIX}*"):
        try:
            os.kill(int((directory / OWNER_FILE).read_text()), 0)
        except ProcessLookupError:
            shutil.rmtree(directory, ignore_errors=True)
        except (OSError, ValueError):  # no owner file, not ours to read, or its owner lives
            continue


INTERRUPTED = 130
"""The exit code after Ctrl-C (128 + SIGINT, as a shell reports it)."""
