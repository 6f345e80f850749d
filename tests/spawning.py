"""Child processes of the tests (etcd, the test API server, containerd, agents, controllers) that
die with the test process, started without running Python in the child.

Why not `preexec_fn`: the test process has grpc loaded, and a `preexec_fn` makes Popen fork()
and run Python in the child; grpc's fork handlers then run around that fork and can block it
forever (seen in CI: py-spy showed `fork` -> cygrpc, the run sat until its 90-minute limit).
Without `preexec_fn` (and with no uid/gid change) CPython spawns with vfork + exec, so no fork
handler runs and no Python code runs in the child.

Dying with the parent is asked by util-linux's `setpriv --pdeathsig TERM --`, which sets
PR_SET_PDEATHSIG and execs the command (the same pid, so `proc.pid`, `kill` and `killpg` still
reach the command itself). util-linux is Essential in Debian, so setpriv is on every Debian and
Ubuntu machine since util-linux 2.33 (Debian 10). Linux sends the signal when the *thread* that
spawned the child ends, so spawn from the main thread or a thread that outlives the child (as the
tests do: fixtures run on pytest's main thread).
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["DEATH_SIGNAL", "SpawnUnavailable", "death_prefix", "spawn"]

DEATH_SIGNAL = signal.SIGTERM
"""What a child receives when the test process dies without cleaning up: TERM, so containerd,
etcd and the agents shut down cleanly (unmounts, socket removal) instead of leaving state behind."""


class SpawnUnavailable(RuntimeError):
    """setpriv with --pdeathsig is missing: the tests would leave processes behind on a crash."""


@functools.cache
def death_prefix() -> tuple[str, ...]:
    """The command prefix `setpriv --pdeathsig TERM --`, checked once to work here.

    Raises `SpawnUnavailable` (naming the package to install) when setpriv is missing or too old."""
    found = shutil.which("setpriv")
    if found is None:
        raise SpawnUnavailable("setpriv not found: install util-linux (>= 2.33), which the test helpers use "
                               "to make child processes die with the test process")  # fmt: skip
    prefix = (found, "--pdeathsig", DEATH_SIGNAL.name.removeprefix("SIG"), "--")
    try:
        done = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as e:
        raise SpawnUnavailable(f"{found} --pdeathsig does not run here ({e}); install util-linux >= 2.33") from None
    if done.returncode != 0:
        raise SpawnUnavailable(f"{found} --pdeathsig failed ({done.stderr.decode(errors='replace').strip()}); "
                               "install util-linux >= 2.33")  # fmt: skip
    return prefix


def spawn(command: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
    """`subprocess.Popen(command, **popen)` whose child gets SIGTERM when the test process dies.

    Takes Popen's keyword arguments (stdout, env, cwd, text, start_new_session, ...) except
    `preexec_fn`, which is refused: it is what this helper exists to avoid."""
    if "preexec_fn" in popen:
        raise TypeError("spawn() refuses preexec_fn: it forks with Python in the child and can hang under grpc")
    prefix = death_prefix()
    proc = subprocess.Popen([*prefix, *command], **popen)
    _wait_armed(proc, os.path.realpath(prefix[0]))
    return proc


ARM_TIMEOUT_S = 10.0


def _wait_armed(proc: subprocess.Popen[Any], setpriv: str) -> None:
    """Return once setpriv has exec'd the command (so the death signal is set), or the child ended.

    Popen returns when setpriv is exec'd, before setpriv asks for the signal: a test process that
    died in that millisecond would leave the command running (seen in test_spawning). The exec
    shows as /proc/<pid>/exe turning from setpriv into the command."""
    deadline = time.monotonic() + ARM_TIMEOUT_S
    while proc.poll() is None:
        try:
            if os.readlink(f"/proc/{proc.pid}/exe") != setpriv:
                return
        except OSError:  # the child is gone (or a zombie): nothing left to arm
            return
        if time.monotonic() > deadline:
            raise SpawnUnavailable(f"{setpriv} did not exec {proc.args!r} within {ARM_TIMEOUT_S:.0f}s")
        time.sleep(0.0005)
