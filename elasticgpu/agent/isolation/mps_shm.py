"""The /dev/shm a card's MPS daemon shares with its clients: a tmpfs per card, and the wrapper that runs a
control command with it at /dev/shm (see mps_daemons' `shm` and `start`)."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
from pathlib import Path

from elasticgpu.agent.isolation import mps_finding

log = logging.getLogger(__name__)

SHM_SOURCE = "elasticgpu-mps-shm"
"""The source name of the agent's shm tmpfs mounts (in /proc/mounts: tells them from others)."""
TOOLS = ("unshare", "mount", "umount", "sh")
"""What the daemon's own /dev/shm takes on the node (util-linux and a shell)."""
# The wrapper the control binary is exec'd through, inside `unshare --mount`: the card's shm folder at
# /dev/shm of the new namespace only (propagation private: the host's /dev/shm is untouched), then exec.
_BIND_AND_EXEC = 'mount=$1 shm=$2; shift 2; "$mount" --bind "$shm" /dev/shm && exec "$@"'


class NeedsAdmin(RuntimeError):
    """A daemon cannot start until the node's admin acts (a tool missing, a tmpfs that cannot be mounted)."""


def problem() -> str | None:
    """Why the node cannot give a daemon its own /dev/shm (a tool missing from the agent's PATH), or None."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return (f"{', '.join(missing)} not found in the agent's PATH: the MPS daemon's /dev/shm needs "
                f"util-linux (unshare, mount, umount) and sh on the node")
    return None


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise NeedsAdmin(problem() or f"{name} not found in the agent's PATH")
    return found


def wrapped(shm: Path, argv: list[str]) -> list[str]:
    """`argv` run in a mount namespace of its own with `shm` at /dev/shm (an exec chain: nothing runs in the
    agent's process between fork and exec)."""
    return [_tool("unshare"), "--mount", "--propagation", "private", "--", _tool("sh"), "-c", _BIND_AND_EXEC,
            mps_finding.WRAPPER_NAME, _tool("mount"), str(shm), *argv]


def mount(shm: Path, *, size_mib: int, timeout_s: float) -> None:
    """`shm` is a tmpfs of `size_mib` (kept when it already is one: the card's containers hold it). Raises
    RuntimeError saying why it cannot be mounted."""
    if os.path.ismount(shm):
        return
    if size_mib < 1:  # tmpfs takes size=0 as no limit at all
        raise NeedsAdmin(f"the MPS /dev/shm size is {size_mib} MiB: set --mps-shm-size-mib to 1 or more")
    shm.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run([_tool("mount"), "-t", "tmpfs", "-o",
                               f"size={size_mib}m,mode=1777,nosuid,nodev,noexec", SHM_SOURCE, str(shm)],
                              stdin=subprocess.DEVNULL, capture_output=True, start_new_session=True,
                              timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"mounting a tmpfs of {size_mib} MiB at {shm} failed: {e}") from e
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip()[:200]
        # No fallback to a plain folder: its memory would be unbounded (or on disk), and the clients'
        # shared memory would outlive the daemon in the node's state folder.
        raise NeedsAdmin(f"mounting a tmpfs of {size_mib} MiB at {shm} failed ({said}): the agent needs "
                         f"CAP_SYS_ADMIN in the host's mount namespace (it runs as root on the host) "
                         f"to give the card's MPS daemon and clients their shared /dev/shm")


def unmount(shm: Path, *, card: str, timeout_s: float) -> None:
    """Unmount and remove `shm` (a mount a container still holds stays alive there: lazily unmounted when
    busy)."""
    for _ in range(4):  # a mount stacked on another (two agents by mistake) comes off one at a time
        if not os.path.ismount(shm):
            break
        umount = shutil.which("umount") or "umount"
        try:
            done = subprocess.run([umount, str(shm)], stdin=subprocess.DEVNULL, capture_output=True,
                                  start_new_session=True, timeout=timeout_s, check=False)
            if done.returncode != 0:
                subprocess.run([umount, "-l", str(shm)], stdin=subprocess.DEVNULL, capture_output=True,
                               start_new_session=True, timeout=timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired):
            break
    if os.path.ismount(shm):
        log.warning("the MPS /dev/shm of card %s at %s could not be unmounted; the next sync tries again", card, shm)
        return
    with contextlib.suppress(FileNotFoundError, OSError):
        shm.rmdir()
