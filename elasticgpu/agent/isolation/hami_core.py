"""Mode HAMiCore: HAMi-core's CUDA interception library, installed on the node by its admin.

The library is never shipped nor fetched by elasticgpu (its license is unresolved): the admin puts
`libvgpu.so` on the node and gives its path (`--hami-core-library`); a node without the file does
not offer the mode, so such claims never bind there. Each container gets:

    /usr/local/vgpu/libvgpu.so     the node's library, read-only
    /etc/ld.so.preload             a file naming it, read-only (every dynamically linked process of
                                   the container loads it, children included)
    /tmp/vgpu                      a folder of its own (<state>/cache/<pod uid>_<container>), for
                                   CUDA_DEVICE_MEMORY_SHARED_CACHE: HAMi-core's accounting shared by
                                   the container's processes, never by two containers; a tmpfs of
                                   `cache_size_mib` (the container writes it: bounded, and never on
                                   the node's disk), unmounted once the container is gone
    CUDA_DEVICE_MEMORY_LIMIT_<i>   the claim's MiB per device ordinal (`<n>m`)
    CUDA_DEVICE_SM_LIMIT(_<i>)     the claim's cores

What escapes it (docs/isolation.md): static binaries and anything that does not go through the
CUDA driver API via the dynamic loader.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path

from elasticgpu.agent.isolation import base, none, tmpfs

log = logging.getLogger(__name__)

CONTAINER_LIBRARY = "/usr/local/vgpu/libvgpu.so"
CONTAINER_PRELOAD = "/etc/ld.so.preload"
CONTAINER_CACHE_DIR = "/tmp/vgpu"
CACHE_FILE = "vgpu.cache"
ENV_SHARED_CACHE = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
CACHE_SIZE_MIB = 16
"""MiB of a container's cache tmpfs: HAMi-core's shared region (one file, about 1 MiB for its 1024 process slots
of 16 devices) with room to spare."""
CACHE_SOURCE = "elasticgpu-hami-cache"
"""The source name of the cache mounts (in /proc/mounts)."""
_CACHE_NAME = re.compile(r"^[A-Za-z0-9-]+_[A-Za-z0-9._-]+$")


def _folder_name(pod_uid: str, container: str) -> str:
    """`<pod uid>_<container>`, each part reduced to letters, digits, `.` and `-` (the uid has no `_`)."""
    return f"{re.sub(r'[^A-Za-z0-9-]', '-', pod_uid)}_{re.sub(r'[^A-Za-z0-9.-]', '-', container).lstrip('.')}"


class HamiCoreRoom:
    """base.Room of mode HAMiCore (see the module docstring)."""

    mode = base.MODE_HAMI_CORE

    def __init__(self, *, library: str, host_root: str, state_dir: Path, idle_grace_s: float = 30.0,
                 cache_size_mib: int = CACHE_SIZE_MIB) -> None:
        """`library`: the node path of libvgpu.so ("" when the admin gave none); `host_root`: where the
        agent sees the node's `/`; `state_dir`: the mode's folder on the node (preload file, caches);
        `idle_grace_s`: a cache folder prepared this recently is kept though the runtime does not list its
        container yet (it may still be creating it)."""
        self._library = library
        self._idle_grace_s = idle_grace_s
        self._cache_size_mib = cache_size_mib
        self._seen = os.path.join(host_root, library.lstrip("/")) if library else ""
        self._state_dir = state_dir
        self.preload_file = state_dir / "ld.so.preload"
        self._preload_checked = False

    def problem(self) -> str | None:
        """Why the node cannot offer HAMi-core, or None."""
        if not self._library:
            return "no HAMi-core library is configured on this node (--hami-core-library)"
        if not os.path.isfile(self._seen):
            return f"the HAMi-core library {self._library} (--hami-core-library) is not on this node"
        return None

    def cache_dir(self, slice_: base.Slice) -> Path:
        """The container's own cache folder on the node (names reduced to safe characters: never a path)."""
        return self._state_dir / "cache" / _folder_name(slice_.pod_uid, slice_.container)

    def prepare(self, slice_: base.Slice) -> str | None:
        """The preload file and the container's cache folder exist; `Unavailable` without the library."""
        if (problem := self.problem()) is not None:
            raise base.Unavailable(problem)
        want = f"{CONTAINER_LIBRARY}\n"
        try:
            # Checked once per agent (then only that it is still there): this runs on every create.
            if not (self._preload_checked and self.preload_file.is_file()) and (
                    not self.preload_file.is_file() or self.preload_file.read_text() != want):
                self._state_dir.mkdir(parents=True, exist_ok=True)
                temporary = self.preload_file.with_suffix(".tmp")
                temporary.write_text(want)
                temporary.chmod(0o644)
                temporary.replace(self.preload_file)
            self._preload_checked = True
            cache = self.cache_dir(slice_)
            cache.mkdir(mode=0o700, parents=True, exist_ok=True)
            # A tmpfs (mode 1777: the container's processes may run as any user): what the container writes
            # there is bounded and never fills the node's disk.
            tmpfs.mount(cache, size_mib=self._cache_size_mib, source=CACHE_SOURCE, timeout_s=10.0)
            os.utime(cache)  # prepared now: `sync` keeps it through the grace
        except tmpfs.MountFailed as e:
            raise base.Unavailable(f"cannot give the container its HAMi-core cache: {e} (the agent needs "
                                   f"CAP_SYS_ADMIN in the host's mount namespace)", retryable=False) from e
        except (OSError, RuntimeError) as e:
            raise base.Unavailable(f"cannot write HAMi-core's files under {self._state_dir}: {e}",
                                   retryable=True) from e
        return None

    def contribute(self, slice_: base.Slice) -> base.Contribution:
        """The library, the preload file, the container's own cache and the claim's limits."""
        return base.Contribution(
            envs=(*none.hami_env(slice_, per_device_sm=True),
                  (ENV_SHARED_CACHE, f"{CONTAINER_CACHE_DIR}/{CACHE_FILE}")),
            mounts=(
                base.Mount(host_path=self._library, container_path=CONTAINER_LIBRARY),
                base.Mount(host_path=str(self.preload_file), container_path=CONTAINER_PRELOAD),
                base.Mount(host_path=str(self.cache_dir(slice_)), container_path=CONTAINER_CACHE_DIR,
                           readonly=False),
            ),
            annotations=base.marked(self.mode, slice_),
        )

    def sync(self, containers: Sequence[base.RunningContainer]) -> None:
        """Remove the cache folders of containers the runtime no longer has."""
        keep = {_folder_name(c.pod_uid, c.name) for c in containers
                if c.annotations.get(base.ANNOTATION_MODE) == self.mode}
        folder = self._state_dir / "cache"
        try:
            entries = list(folder.iterdir())
        except FileNotFoundError:
            return
        now = time.time()
        for entry in entries:
            if entry.is_dir() and _CACHE_NAME.match(entry.name) and entry.name not in keep and (
                    now - entry.stat().st_mtime >= self._idle_grace_s):
                if tmpfs.unmount(entry, timeout_s=10.0):
                    log.debug("HAMi-core cache of %s removed: its container is gone", entry.name)
                else:
                    log.warning("HAMi-core cache of %s at %s could not be unmounted; the next sync tries again",
                                entry.name, entry)

    def close(self) -> None:
        """Nothing runs."""
