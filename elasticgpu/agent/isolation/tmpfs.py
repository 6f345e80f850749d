"""A tmpfs of a fixed size the agent mounts for a container's shared folder: what a container may write
there is bounded by the size and lives in memory, never on the node's disk (the MPS /dev/shm of a card,
the HAMi-core cache of a container)."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)


class MountFailed(RuntimeError):
    """The tmpfs could not be mounted (the agent lacks CAP_SYS_ADMIN in the host's mount namespace, or the tool)."""


def mount(folder: Path, *, size_mib: int, source: str, timeout_s: float) -> None:
    """`folder` is a tmpfs of `size_mib` (`mode=1777,nosuid,nodev,noexec`; kept when it already is a mount: a
    container may hold it). Raises MountFailed when refused, RuntimeError when `mount` did not answer."""
    if os.path.ismount(folder):
        return
    if size_mib < 1:  # tmpfs takes size=0 as no limit at all
        raise MountFailed(f"a tmpfs of {size_mib} MiB would have no limit")
    tool = shutil.which("mount")
    if tool is None:
        raise MountFailed("mount (util-linux) is not in the agent's PATH")
    folder.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run([tool, "-t", "tmpfs", "-o", f"size={size_mib}m,mode=1777,nosuid,nodev,noexec", source,
                               str(folder)], stdin=subprocess.DEVNULL, capture_output=True, start_new_session=True,
                              timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:  # not a refusal: the next try may pass
        raise RuntimeError(f"mounting a tmpfs of {size_mib} MiB at {folder} failed: {e}") from e
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip()[:200]
        raise MountFailed(f"mounting a tmpfs of {size_mib} MiB at {folder} failed ({said})")


def unmount(folder: Path, *, timeout_s: float) -> bool:
    """Unmount `folder` (lazily when busy: a container still holding it keeps it alive) and remove it; True once
    it is gone or no longer a mount."""
    for _ in range(4):  # a mount stacked on another (two agents by mistake) comes off one at a time
        if not os.path.ismount(folder):
            break
        umount = shutil.which("umount") or "umount"
        try:
            done = subprocess.run([umount, str(folder)], stdin=subprocess.DEVNULL, capture_output=True,
                                  start_new_session=True, timeout=timeout_s, check=False)
            if done.returncode != 0:
                subprocess.run([umount, "-l", str(folder)], stdin=subprocess.DEVNULL, capture_output=True,
                               start_new_session=True, timeout=timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired):
            break
    if os.path.ismount(folder):
        return False
    with contextlib.suppress(FileNotFoundError, OSError):
        shutil.rmtree(folder)
    return True
