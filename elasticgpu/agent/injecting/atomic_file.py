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


def replace_if_changed(path: Path, text: str) -> bool:
    """Write `text` to `path` atomically, its folder made and fsynced (the rename must survive a
    crash of the node), unless the file already holds exactly `text`: True when it was written.
    Readers such as containerd re-read the file on every call, so an unchanged one is left as it is."""
    try:
        if path.read_text() == text:
            return False
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, text, sync_directory=True)
    return True
