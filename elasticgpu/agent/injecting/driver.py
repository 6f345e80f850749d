"""The NVIDIA driver's user-space files a CUDA container needs, found on the node for the CDI spec.

What `nvidia-ctk cdi generate` (pkg/nvcdi/driver-nvml.go of the NVIDIA container toolkit) puts
into its spec-wide edits, for the capabilities a CUDA image asks for (compute, utility):

    libraries   <name>.so.<driver version> of the compute and utility libraries below, in the
                host's library folders, each also at its soname (libcuda.so.1 -> the same file),
                so the container's loader finds them without the toolkit's create-symlinks hook
    binaries    nvidia-smi, nvidia-debugdump, nvidia-persistenced, nvidia-cuda-mps-control,
                nvidia-cuda-mps-server
    firmware    /lib/firmware/nvidia/<driver version>/ (the GSP firmware the driver loads)
    IPC         the persistenced and fabric manager sockets (when present; never the node's MPS pipe folder)
    hook        `nvidia-ctk hook update-ldcache --folder <each library folder>` when nvidia-ctk
                is on the node, so images whose loader does not search the multiarch folder
                by default (and `ldconfig -p` users) find them too

Every file is mounted read-only (`ro`, `nosuid`, `nodev`, `bind`) at its own path inside the
container. Two roots, as the toolkit's `--driver-root` and host root: `driver_root` is where the
driver is installed on the node (`/`, or `/run/nvidia/driver` with the GPU Operator's driver
container); `host_root` is where the agent sees the node's `/` (`/`, or e.g. `/host` when its
DaemonSet mounts the node's root there). Files are looked up under host_root + driver_root; the
spec names them by their node path (driver_root + path), which is what the runtime opens.

The version comes from NVML (`Snapshot.driver.driver_version`); the simulated backend writes a
stand-in driver root with fake files of the version its YAML gives, so tests see the mounts
inside a real container.
"""

from __future__ import annotations

import logging
import os
import re
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

# Compute and utility libraries, as the toolkit's lists name them (libnvidia-container's
# "utility" and "compute" sets; nvidia-ctk takes every *.so.<version> of the driver's folders).
# Value: the soname the loader asks for, when it is not the versioned file name itself; the
# library's own DT_SONAME wins when it has one (elf_soname), as nvidia-ctk's create-symlinks hook.
LIBRARIES: dict[str, str | None] = {
    "libcuda": "libcuda.so.1",
    "libcudadebugger": "libcudadebugger.so.1",
    "libnvidia-ml": "libnvidia-ml.so.1",
    "libnvidia-cfg": "libnvidia-cfg.so.1",
    "libnvidia-ptxjitcompiler": "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-nvvm": "libnvidia-nvvm.so.4",
    "libnvidia-opencl": "libnvidia-opencl.so.1",
    "libnvidia-allocator": "libnvidia-allocator.so.1",
    "libnvidia-fatbinaryloader": None,
    "libnvidia-compiler": None,
    "libnvidia-gpucomp": None,
    "libnvidia-pkcs11": None,
    "libnvidia-pkcs11-openssl3": None,
}
BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
            "nvidia-cuda-mps-server")
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
                "/lib/x86_64-linux-gnu", "/lib64", "/usr/local/nvidia/lib64")
BINARY_DIRS = ("/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/nvidia/bin")
FIRMWARE_DIRS = ("/lib/firmware", "/usr/lib/firmware")
IPC_PATHS = ("/var/run/nvidia-persistenced/socket", "/var/run/nvidia-fabricmanager/socket")
"""The node's daemon sockets a CUDA process may ask. Not the node's MPS pipe folder (/tmp/nvidia-mps), which
NVIDIA's toolkit mounts: a daemon someone else runs there would answer every tenant of the node (`quit`
included); the MPS mode gives each card a pipe folder of its own (isolation/mps.py)."""
READ_ONLY = ("ro", "nosuid", "nodev", "bind")
IPC_OPTIONS = ("nosuid", "nodev", "bind")  # a socket is connected to, the MPS pipes are written


@dataclass(frozen=True, kw_only=True)
class Mount:
    """A bind mount of a node file into the container."""

    host_path: str
    container_path: str
    options: tuple[str, ...] = READ_ONLY

    def to_spec(self) -> dict[str, Any]:
        """The CDI `mounts` entry."""
        return {"hostPath": self.host_path, "containerPath": self.container_path, "options": list(self.options)}


@dataclass(frozen=True, kw_only=True)
class DriverFiles:
    """What the CDI spec adds for the driver: mounts, and the ldcache hook when it can run."""

    version: str = ""
    mounts: tuple[Mount, ...] = ()
    library_dirs: tuple[str, ...] = ()
    """Container folders holding the libraries (the ldcache hook's `--folder`s)."""
    nvidia_ctk: str | None = None
    """nvidia-ctk's path on the node, None when it is not there (no hook)."""
    missing: tuple[str, ...] = field(default=(), compare=False)
    """What a CUDA container needs but was not found (libcuda, nvidia-smi), for the log."""

    def hooks(self) -> list[dict[str, Any]]:
        """The CDI `hooks` entries: update-ldcache, as nvidia-ctk writes it."""
        if self.nvidia_ctk is None or not self.library_dirs:
            return []
        args = ["nvidia-ctk", "hook", "update-ldcache"]
        for folder in self.library_dirs:
            args += ["--folder", folder]
        return [{"hookName": "createContainer", "path": self.nvidia_ctk, "args": args}]


def elf_soname(path: str) -> str | None:
    """The DT_SONAME of a 64-bit little-endian ELF shared library, None when it is none (or unreadable)."""
    try:
        with open(path, "rb") as f:
            header = f.read(64)
            if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
                return None
            shoff, = struct.unpack_from("<Q", header, 0x28)
            shentsize, shnum = struct.unpack_from("<HH", header, 0x3A)
            f.seek(shoff)
            table = f.read(shentsize * shnum)
            sections = [struct.unpack_from("<IIQQQQIIQQ", table, i * shentsize) for i in range(shnum)]
            for _, kind, _, _, offset, size, link, _, _, _ in sections:
                if kind != 6 or link >= len(sections):  # SHT_DYNAMIC; its sh_link is its string table
                    continue
                f.seek(offset)
                dynamic = f.read(size)
                for i in range(0, len(dynamic) - 15, 16):
                    tag, value = struct.unpack_from("<qQ", dynamic, i)
                    if tag == 14:  # DT_SONAME
                        f.seek(sections[link][4] + value)
                        return f.read(256).split(b"\0", 1)[0].decode() or None
                    if tag == 0:  # DT_NULL
                        break
    except (OSError, struct.error, UnicodeDecodeError):
        return None
    return None


def _join(root: str, path: str) -> str:
    return os.path.normpath(os.path.join(root, path.lstrip("/")))


def find(*, version: str, driver_root: str = "/", host_root: str = "/",
         nvidia_ctk: str = "/usr/bin/nvidia-ctk") -> DriverFiles:
    """The driver files of `version` under the driver root (see the module docstring)."""
    if not re.fullmatch(r"[\w.-]+", version):  # it becomes part of file names: nothing else may be in it
        return DriverFiles(missing=(f"the driver version (NVML gave {version!r})",))
    seen = _join(host_root, driver_root)  # where the agent looks
    mounts: list[Mount] = []
    library_dirs: list[str] = []
    found: set[str] = set()

    def add(path_in_root: str, *, as_path: str | None = None, options: tuple[str, ...] = READ_ONLY) -> None:
        mounts.append(Mount(host_path=_join(driver_root, path_in_root), container_path=as_path or path_in_root,
                            options=options))

    for folder in LIBRARY_DIRS:
        if not os.path.isdir(_join(seen, folder)):
            continue
        for name, soname in LIBRARIES.items():
            if name in found:
                continue  # the first folder that has it wins, as the loader's search order would
            versioned = f"{folder}/{name}.so.{version}"
            if os.path.isfile(_join(seen, versioned)):
                found.add(name)
                add(versioned)
                soname = elf_soname(_join(seen, versioned)) or soname
                if soname is not None and soname != f"{name}.so.{version}" and "/" not in soname:
                    add(versioned, as_path=f"{folder}/{soname}")
                if folder not in library_dirs:
                    library_dirs.append(folder)
    for binary in BINARIES:
        for folder in BINARY_DIRS:
            if os.path.isfile(_join(seen, f"{folder}/{binary}")):
                found.add(binary)
                add(f"{folder}/{binary}")
                break
    for folder in FIRMWARE_DIRS:
        firmware = f"{folder}/nvidia/{version}"
        if os.path.isdir(_join(seen, firmware)):
            add(firmware)
            break
    for path in IPC_PATHS:
        if os.path.exists(_join(host_root, path)):  # daemons of the node, not of the driver root
            mounts.append(Mount(host_path=path, container_path=path, options=IPC_OPTIONS))
    ctk = nvidia_ctk if nvidia_ctk and os.access(_join(host_root, nvidia_ctk), os.X_OK) else None
    missing = tuple(what for what in ("libcuda", "libnvidia-ml", "nvidia-smi") if what not in found)
    return DriverFiles(version=version, mounts=tuple(mounts), library_dirs=tuple(library_dirs), nvidia_ctk=ctk,
                       missing=missing)


def find_binary(name: str, *, driver_root: str = "/", host_root: str = "/") -> str | None:
    """The driver's binary `name` (e.g. nvidia-cuda-mps-control) as the agent sees it under host_root +
    driver_root, looked for in the folders the spec's binaries come from; None when absent."""
    seen = _join(host_root, driver_root)
    for folder in BINARY_DIRS:
        path = _join(seen, f"{folder}/{name}")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


class DriverLocator:
    """`find`, cached per driver version for `rescan_s` seconds, logging what it could not find once."""

    def __init__(self, *, driver_root: Callable[[], str], host_root: str = "/", nvidia_ctk: str = "/usr/bin/nvidia-ctk",
                 rescan_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        """`driver_root`: asked on every scan (the simulated backend makes its own)."""
        self._driver_root = driver_root
        self._host_root = host_root
        self._nvidia_ctk = nvidia_ctk
        self._rescan_s = rescan_s
        self._clock = clock
        self._cached: tuple[str, float, DriverFiles] | None = None
        self._logged: tuple[object, ...] | None = None

    def files(self, version: str) -> DriverFiles:
        """The driver files of `version` (rescanned at most every `rescan_s` s, or when it changes)."""
        now = self._clock()
        if self._cached is not None and self._cached[0] == version and now - self._cached[1] < self._rescan_s:
            return self._cached[2]
        root = self._driver_root()
        files = find(version=version, driver_root=root, host_root=self._host_root, nvidia_ctk=self._nvidia_ctk)
        self._cached = (version, now, files)
        what = (version, root, files.missing, files.nvidia_ctk)
        if what != self._logged:
            self._logged = what
            if files.missing:
                log.warning("driver %s under %s: %s not found; claimed containers get the devices but may not run "
                            "CUDA: set --driver-root to where the driver is installed", version or "?", root,
                            ", ".join(files.missing))
            if files.nvidia_ctk is None:
                log.info("nvidia-ctk not found at %s: the CDI spec has no update-ldcache hook; the driver libraries "
                         "are mounted at their sonames, which the loader of Debian/Ubuntu/RHEL-based images finds; "
                         "other images need the NVIDIA container toolkit or their own ldconfig", self._nvidia_ctk)
        return files
