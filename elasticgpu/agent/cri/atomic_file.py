"""Files that readers outside the agent open at any moment (the CDI spec containerd reads, the
limits files a container reads): written whole or not at all."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, text: str, *, sync_directory: bool = False) -> None:
    """Write `text` to `path` (mode 0644) through a temporary file in the same folder, fsynced,
    then renamed over it: a reader sees the old content or the new, never half of it.
    `sync_directory`: also fsync the folder, so the rename survives a crash of the node."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    if sync_directory:
        directory_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory_fd)
        finally:
            os.close(directory_fd)
