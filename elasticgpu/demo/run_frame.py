"""What every run of the demo shares, however the product is installed (`running`: as processes;
`chart`: as the chart's pods): its folder in the temp dir (owned by its pid, swept once its owner
is gone), its phases' timings, and its interrupts. Both runs import it; it imports neither, so the
data flows one way: running -> chart -> run_frame (issue 51).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TMP_PREFIX = "egdemo-"  # short: unix socket paths must stay under 108 bytes
OWNER_FILE = "owner.pid"
"""In each run's folder: the pid of the demo that made it (`sweep_stale_dirs`)."""


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
    harness's own stay)."""

    def __init__(self) -> None:
        self.count = 0
        self.shielded = False
        """Set while cleaning up: an interrupt then only counts (the run ends right after anyway)."""
        self.installed: list[tuple[int, Any]] = []

    def __call__(self, signum: int, frame: object) -> None:
        self.count += 1
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

    def restore(self) -> None:
        """Put back the handlers `install` replaced."""
        for signum, previous in self.installed:
            signal.signal(signum, previous)
        self.installed.clear()


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
