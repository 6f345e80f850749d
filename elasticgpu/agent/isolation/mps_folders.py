"""A card's MPS folders under the agent's state folder, and who may write each.

    <state>/<uuid>/             the agent's alone (never mounted into a container)
        lock                    flock'd around every start and stop of the card's daemon
        uuid                    the card's uuid as the driver spells it (for a later agent)
        daemon                  "<pid> <start time>" of the daemon the agent started or adopted: the only
                                record the agent trusts to find it again (written atomically, mode 0600)
        pipe/                   CUDA_MPS_PIPE_DIRECTORY: mounted into the card's MPS containers, writable there
                                (clients write to its pipes). The daemon writes its pid file here; a tenant may
                                rewrite or remove it, so it is only ever a hint (mps_finding checks the process)
        log/                    CUDA_MPS_LOG_DIRECTORY
        shm/                    the tmpfs the daemon and its containers share as /dev/shm (mps_shm)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator
from pathlib import Path

PID_FILE = "nvidia-cuda-mps-control.pid"
"""The daemon's own pid file in its pipe folder (a hint: the folder is writable in containers)."""
RECORD_FILE = "daemon"
"""The agent's record of the card's daemon, beside the pipe folder (not in it)."""
_PRIVATE = 0o600


class CardFolders:
    """The folders of the node's cards under `state_dir` (see the module docstring)."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir

    def folder(self, uuid: str) -> Path:
        """The card's folder under the state dir."""
        return self.state_dir / uuid.lower()

    def pipe_dir(self, uuid: str) -> Path:
        """The card's CUDA_MPS_PIPE_DIRECTORY."""
        return self.folder(uuid) / "pipe"

    def log_dir(self, uuid: str) -> Path:
        """The card's CUDA_MPS_LOG_DIRECTORY."""
        return self.folder(uuid) / "log"

    def shm_dir(self, uuid: str) -> Path:
        """The card's shared /dev/shm: a tmpfs the daemon and the card's MPS containers mount at /dev/shm."""
        return self.folder(uuid) / "shm"

    def env(self, uuid: str) -> dict[str, str]:
        """The environment of the card's control daemon and of the commands sent to it."""
        return {**os.environ, "CUDA_VISIBLE_DEVICES": uuid, "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(uuid)),
                "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir(uuid))}

    def cards(self) -> list[str]:
        """The (lowercased) uuids of the cards with a folder."""
        try:
            return sorted(entry.name for entry in self.state_dir.iterdir() if entry.is_dir())
        except FileNotFoundError:
            return []

    def hinted_pid(self, uuid: str) -> int | None:
        """The pid the daemon's own pid file names (anyone with the pipe folder may have written it), or None."""
        try:
            return int((self.pipe_dir(uuid) / PID_FILE).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def recorded(self, uuid: str) -> tuple[int, int] | None:
        """(pid, start time) the agent recorded for the card's daemon, or None."""
        try:
            pid, started = (self.folder(uuid) / RECORD_FILE).read_text().split()[:2]
            return int(pid), int(started)
        except (OSError, ValueError):
            return None

    def record(self, uuid: str, pid: int, started: int) -> None:
        """Record the card's daemon (atomically: a reader sees the old record or the new one)."""
        folder = self.folder(uuid)
        # A temporary file per thread: the agent's threads (ensure, the supervisor, the sync) record at once, and
        # one per process let one thread's rename take another's file away.
        temporary = folder / f".{RECORD_FILE}.{os.getpid()}.{threading.get_ident()}"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, _PRIVATE)
        with os.fdopen(fd, "w") as handle:
            handle.write(f"{pid} {started}\n")
        os.replace(temporary, folder / RECORD_FILE)

    def forget(self, uuid: str) -> None:
        """Drop the record of the card's daemon (it stopped) and the daemon's own pid file."""
        for path in (self.folder(uuid) / RECORD_FILE, self.pipe_dir(uuid) / PID_FILE):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def write_uuid(self, uuid: str) -> None:
        """Keep the card's uuid as the driver spells it, for a later agent."""
        fd = os.open(self.folder(uuid) / "uuid", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, _PRIVATE)
        with os.fdopen(fd, "w") as handle:
            handle.write(uuid + "\n")

    def spelled(self, key: str) -> str:
        """The uuid as the driver spells it, from the folder `key` (lowercased), or `key`."""
        try:
            return (self.folder(key) / "uuid").read_text().strip() or key
        except OSError:
            return key

    @contextlib.contextmanager
    def card_lock(self, uuid: str) -> Iterator[None]:
        """Hold the card's lock file (two threads, or two agents by mistake, wait for each other)."""
        folder = self.folder(uuid)
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, _PRIVATE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock
