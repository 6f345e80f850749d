"""A node whose isolation modes the tests control: a stand-in MPS control binary under a driver root, a
stand-in libvgpu.so, and the agent's rooms over them (the CRI hooks of tests/agent/cri use them)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from elasticgpu.agent import isolation

# The stand-in control binary: `-d` records the start and forks a server that writes the pid file in the
# pipe folder, its card's uuid into its /dev/shm (SHM_FILE: where the real server's shared memory with its
# clients goes) and stays alive (its command line names the binary, as the real daemon's does); with no
# argument it reads commands from stdin, one a line, as the real one, and records each with its card: `quit`
# ends the server (the one it started: as the real `quit` reaches its daemon through the pipe, whatever a
# container wrote into the pid file), `get_server_list` answers the pids listed in <pipe>/servers (MPS servers
# the test pretends run), one a line.
STAND_IN_CONTROL = """#!/bin/sh
record={record}
case "$1" in
-d)
    echo "start $CUDA_VISIBLE_DEVICES $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY" >> "$record"
    "$0" serve </dev/null >/dev/null 2>&1 &
    exit 0 ;;
serve)
    echo "$CUDA_VISIBLE_DEVICES" > /dev/shm/{shm_file}
    echo $$ > "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid"
    echo $$ > "$CUDA_MPS_LOG_DIRECTORY/stand-in-server.pid"
    trap 'exit 0' TERM
    while :; do sleep 0.1; done ;;
*)
    while read -r command; do
        echo "$command $CUDA_VISIBLE_DEVICES" >> "$record"
        [ "$command" = quit ] && kill "$(cat "$CUDA_MPS_LOG_DIRECTORY/stand-in-server.pid")"
        [ "$command" = get_server_list ] && cat "$CUDA_MPS_PIPE_DIRECTORY/servers" 2>/dev/null
    done
    exit 0 ;;
esac
"""


SHM_FILE = "elasticgpu-stand-in-server"
"""The file the stand-in server writes into its /dev/shm."""


def mounts_under(folder: Path) -> list[str]:
    """The mount points at or under `folder` (this process's mount namespace), one line per mount."""
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        point = line.split()[1].replace("\\040", " ")
        if point == str(folder) or point.startswith(f"{folder}/"):
            found.append(point)
    return found


class IsolationNode:
    """The stand-ins and the rooms over them."""

    def __init__(self, directory: Path, *, with_mps: bool = True, with_library: bool = True,
                 idle_grace_s: float = 0.0, check_interval_s: float = 0.1, shm_size_mib: int = 8) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.driver_root = directory / "driver-root"
        self.control = self.driver_root / "usr/bin/nvidia-cuda-mps-control"
        self.record = directory / "mps-record.txt"
        self.record.touch()
        if with_mps:
            self.control.parent.mkdir(parents=True)
            self.control.write_text(STAND_IN_CONTROL.format(record=self.record, shm_file=SHM_FILE))
            self.control.chmod(0o755)
        self.library = directory / "hami/libvgpu.so"
        if with_library:
            self.library.parent.mkdir(parents=True)
            self.library.write_text("stand-in for HAMi-core's libvgpu.so\n")
        self.state = directory / "isolation"
        self.daemons = isolation.MpsDaemons(
            control=lambda: str(self.control) if self.control.exists() else None, state_dir=self.state / "mps",
            settings=isolation.DaemonSettings(stop_timeout_s=5, check_interval_s=check_interval_s,
                                              backoff_initial_s=0.1, backoff_max_s=1, idle_grace_s=idle_grace_s,
                                              shm_size_mib=shm_size_mib))
        self.rooms = isolation.IsolationRooms([
            isolation.MpsRoom(self.daemons, control=lambda: str(self.control) if self.control.exists() else None,
                              control_setting=f"under {self.driver_root}"),
            isolation.HamiCoreRoom(library=str(self.library), host_root="/", state_dir=self.state / "hami-core",
                                   idle_grace_s=idle_grace_s),
        ])

    def starts(self) -> list[str]:
        """The uuids of the daemons the stand-in started, in order."""
        return [line.split()[1] for line in self.record.read_text().splitlines() if line.startswith("start ")]

    def commands(self, uuid: str) -> list[str]:
        """The commands sent to the card's control daemon (besides starts), in order, without the card."""
        suffix = f" {uuid}"
        return [line[: -len(suffix)] for line in self.record.read_text().splitlines()
                if line.endswith(suffix) and not line.startswith("start ")]

    def quits(self) -> list[str]:
        return [line.split()[1] for line in self.record.read_text().splitlines() if line.startswith("quit ")]

    def servers(self, *, children: bool = False) -> list[int]:
        """Pids of the stand-in's live servers (any card): never two per card. A server's shell forks for its
        `sleep`; until the exec the child has the server's command line: it is left out (its parent is one)."""
        found: dict[int, int] = {}  # pid -> parent pid
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if str(self.control).encode() in cmdline and b"serve" in cmdline and fields[0] != "Z":
                    found[int(entry.name)] = int(fields[1])
        return sorted(pid for pid, parent in found.items() if children or parent not in found)

    def close(self) -> None:
        """Stop supervising, end every server the test started and unmount the shm folders it left."""
        self.rooms.close()
        for pid in self.servers(children=True):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for point in reversed(mounts_under(self.state)):
            subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def wait_until(what: str, check: object, timeout: float = 15.0) -> None:
    """Poll `check()` until it is true (a deadline, never an open-ended wait)."""
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
