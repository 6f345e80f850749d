"""The /dev/shm a card's MPS daemon shares with its clients: a tmpfs per card, and the wrapper that runs a
control command with it at /dev/shm (see mps_daemons' `shm` and `start`)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from elasticgpu.agent.isolation import mps_finding, tmpfs

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
    NeedsAdmin saying why it cannot be mounted."""
    if size_mib < 1:
        raise NeedsAdmin(f"the MPS /dev/shm size is {size_mib} MiB: set --mps-shm-size-mib to 1 or more")
    _tool("mount")
    try:
        tmpfs.mount(shm, size_mib=size_mib, source=SHM_SOURCE, timeout_s=timeout_s)
    except tmpfs.MountFailed as e:
        # No fallback to a plain folder: its memory would be unbounded (or on disk), and the clients'
        # shared memory would outlive the daemon in the node's state folder.
        raise NeedsAdmin(f"{e}: the agent needs CAP_SYS_ADMIN in the host's mount namespace (it runs as root on "
                         f"the host) to give the card's MPS daemon and clients their shared /dev/shm") from e


def unmount(shm: Path, *, card: str, timeout_s: float) -> None:
    """Unmount and remove `shm` (a mount a container still holds stays alive there: lazily unmounted when
    busy)."""
    if not tmpfs.unmount(shm, timeout_s=timeout_s):
        log.warning("the MPS /dev/shm of card %s at %s could not be unmounted; the next sync tries again", card, shm)
