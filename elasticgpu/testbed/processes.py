"""Child processes of the demo: started without Python code in the child, stopped for sure.

No `preexec_fn`: the demo's own process holds grpc threads (the CRI client), and grpc's fork
handlers can hang or abort a forked child. The death signal is asked for by util-linux's
`setpriv --pdeathsig KILL`, which then execs the command, so a child dies with the demo even
when the demo is killed with SIGKILL. Without setpriv, each child runs in its own session and
the demo kills those sessions on the way out.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

STOP_TIMEOUT_S = 15.0
"""Seconds a child gets to exit on SIGTERM before its process group is killed."""


class DemoError(RuntimeError):
    """A step of the demo failed; the message is the one line the user sees."""


_death_prefix: list[str] | None = None


def death_prefix() -> list[str]:
    """`setpriv --pdeathsig KILL --` where it works (util-linux 2.33+), else nothing."""
    global _death_prefix
    if _death_prefix is None:
        found = shutil.which("setpriv")
        command = [found, "--pdeathsig", "KILL", "--"] if found else []
        try:
            works = (
                bool(command) and subprocess.run([*command, "true"], capture_output=True, timeout=10).returncode == 0
            )
        except (OSError, subprocess.SubprocessError):
            works = False
        _death_prefix = command if works else []
    return _death_prefix


@dataclass
class Child:
    """One child process and its log file."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def running(self) -> bool:
        """True while the process has not exited."""
        return self.process.poll() is None

    def tail(self, lines: int = 15) -> str:
        """The last lines of its log."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def check_alive(self, what: str) -> None:
        """Raise DemoError naming the child and its log if it has exited."""
        if not self.running():
            raise DemoError(
                f"{self.name} exited with {self.process.returncode} while waiting for {what}; "
                f"last line of its log: {self.tail(1) or '(empty)'}"
            )

    def terminate(self) -> None:
        """SIGTERM its process group (no wait)."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)

    def stop(self) -> None:
        """SIGTERM its process group, SIGKILL after `STOP_TIMEOUT_S`."""
        self.terminate()
        if self.process.poll() is not None:
            return
        try:
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=STOP_TIMEOUT_S)


Spawn = Callable[..., "subprocess.Popen[bytes]"]
"""How a child is started: `Popen`'s signature without `preexec_fn` (`spawn_dying_with_us`, or the
tests' `tests.spawning.spawn`)."""


def spawn_dying_with_us(command: Sequence[str], **popen: Any) -> subprocess.Popen[bytes]:
    """`subprocess.Popen([*death_prefix(), *command], **popen)`."""
    return subprocess.Popen([*death_prefix(), *command], **popen)


class Children:
    """Every child the demo started; `stop_all` stops them (see there in which order)."""

    def __init__(self, *, spawn: Spawn = spawn_dying_with_us, tmp: Path | None = None) -> None:
        """`tmp`: the children's TMPDIR (the run's own folder, removed with it): what a child killed in
        the middle of its work leaves there (the kubernetes client's certificate files, say) goes too."""
        self.started: list[Child] = []
        self._spawn = spawn
        self._tmp = tmp

    def start(
        self,
        name: str,
        command: Sequence[str],
        *,
        log: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> Child:
        """Start `command` with its output into `log`, in its own session, dying with the demo."""
        with log.open("ab") as out:
            process = self._spawn(
                list(command),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **({"TMPDIR": str(self._tmp)} if self._tmp else {}), **(env or {})},
                cwd=cwd,
                start_new_session=True,
            )
        child = Child(name, process, log)
        self.started.append(child)
        return child

    def forget(self, child: Child) -> None:
        """Stop `child` and drop it from `started`: a start that failed and was made again
        (free_ports) is no child of the run, and its exit must not fail waits over `started`."""
        child.stop()
        self.started.remove(child)

    def stop_all(self) -> None:
        """Stop every child: the product's processes together (they shut down in parallel), then
        the runtime, then the API server and etcd (which the others talk to until they are gone)."""
        infrastructure = ("containerd", "API server", "etcd")
        product = [c for c in self.started if c.name not in infrastructure]
        for child in product:
            child.terminate()
        for child in product:
            child.stop()
        for name in infrastructure:
            for child in self.started:
                if child.name == name:
                    child.stop()


def wait_until(
    check: Callable[[], T | None],
    what: str,
    *,
    timeout_s: float,
    children: Sequence[Child] = (),
    interval_s: float = 0.2,
    hopeless: Callable[[], str] | None = None,
) -> T:
    """Poll `check` until it returns a truthy value; DemoError naming `what` after `timeout_s`, or
    at once when one of `children` exits or `hopeless()` says why waiting cannot succeed (a
    failure that is certain is told when it is, not at the deadline). Errors of `check` count as
    "not yet"; the last is told."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        for child in children:
            child.check_alive(what)
        try:
            reason = hopeless() if hopeless is not None else ""
        except Exception:  # it cannot tell yet: a server still starting answers 429, 503
            reason = ""
        if reason:
            raise DemoError(f"gave up waiting for {what}: {reason}")
        try:
            result = check()
            if result:
                return result
        except Exception as error:  # a server still starting answers with all sorts of errors (429, 503, refused)
            last = f" (last error: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})"
        if time.monotonic() > deadline:
            raise DemoError(f"timed out after {timeout_s:.0f} s waiting for {what}{last}")
        time.sleep(interval_s)
