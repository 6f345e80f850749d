"""Which process is a card's MPS control daemon, checked before the agent acts on it (issue 44).

The daemon's pid file lies in the pipe folder, which the card's MPS containers can write: a tenant could
name any process there, another card's daemon or another tenant's process, and the agent's `stop` would
kill it. So a pid is only ever taken for the card's daemon when the process itself says so:

    ours        not a zombie; its command line is the control binary's (not the shm wrapper's before its
                exec); its root is the agent's (a container's process has its own root, whatever it calls
                itself); and its environment, fixed at its exec by the agent, names the card's pipe folder
    identity    (pid, start time in clock ticks since boot): a pid reused after the daemon ended is never
                the daemon; the agent records this pair where only it writes (mps_folders' `daemon`)
    signal      through a pidfd opened before the last check, so the process checked is the one signalled
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"
WRAPPER_NAME = "elasticgpu-mps-shm-wrapper"
"""The shm wrapper's $0: in the command lines of `unshare` and `sh` until the exec (never taken for the daemon)."""


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (state first); empty when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return stat.rsplit(")", 1)[-1].split() if ")" in stat else []


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot: with the pid, its identity), or None when gone."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19])  # field 22 of stat; fields here start at field 3 (state)
    except (IndexError, ValueError):
        return None


def parent(pid: int) -> int | None:
    """The parent's pid, or None when gone."""
    fields = _stat_fields(pid)
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return None


def _same_root(pid: int) -> bool:
    try:
        theirs, mine = os.stat(f"/proc/{pid}/root"), os.stat("/proc/self/root")
    except OSError:
        return False
    return (theirs.st_dev, theirs.st_ino) == (mine.st_dev, mine.st_ino)


def is_control(pid: int) -> bool:
    """True for a live (not zombie) process whose command line is the control binary's, not the wrapper's."""
    fields = _stat_fields(pid)
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return (bool(fields) and fields[0] not in ("Z", "X") and CONTROL.encode() in cmdline
            and WRAPPER_NAME.encode() not in cmdline.split(b"\0"))


def ours(pid: int, pipe_dir: Path) -> bool:
    """True when `pid` is the control daemon of the card whose pipe folder is `pipe_dir` (module docstring)."""
    if pid <= 0 or not is_control(pid) or not _same_root(pid):
        return False
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"CUDA_MPS_PIPE_DIRECTORY={pipe_dir}".encode() in environ


def by_environment(pipe_dir: Path) -> int | None:
    """The card's live daemon found by a scan of /proc (its environment names `pipe_dir`), or None: when neither
    the agent's record nor the pid file leads to it."""
    try:
        entries = [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return None
    found: dict[int, int | None] = {}  # pid -> parent pid
    for pid in entries:
        try:
            if CONTROL.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
        except OSError:
            continue
        if ours(pid, pipe_dir):
            found[pid] = parent(pid)
    # The daemon, not a child it forked that has not yet exec'd (it has the daemon's command line).
    return min((pid for pid, up in found.items() if up not in found), default=None)


def kill(pid: int, started: int, pipe_dir: Path) -> bool:
    """SIGKILL the card's daemon `pid` (started at `started`), only if it still is that process and ours;
    True when signalled."""
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except OSError:  # a kernel without pidfds (before 5.3): the checks just before the signal must do
        handle = -1
    try:
        if not ours(pid, pipe_dir) or start_time(pid) != started:
            return False
        if handle >= 0:
            signal.pidfd_send_signal(handle, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False
    finally:
        if handle >= 0:
            with contextlib.suppress(OSError):
                os.close(handle)
