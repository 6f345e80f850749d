"""A unix socket that is never, even for an instant, open to other users, without `os.umask`.

umask is process-wide: changed around a bind, it also narrows (or, restored late, widens) the mode of every
file another thread creates meanwhile. Instead the socket is bound inside a fresh folder only the agent can
enter (mkdtemp: mode 0700, beside the final path, so on the same file system), made 0600 there, and renamed
to its path: a rename moves the bound socket, and its listener keeps serving.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

SOCKET_MODE = 0o600


@contextlib.contextmanager
def binding(path: Path) -> Iterator[Path]:
    """Where to bind the socket that is to end at `path`; after the block (the socket bound there) it is made
    owner-only and moved to `path`. `path`'s folder is created if missing; whatever the block raises, the staging
    folder is removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".s", dir=path.parent))  # short: a socket path has 107 bytes at most
    try:
        inner = staging / "s"
        yield inner
        os.chmod(inner, SOCKET_MODE)
        os.rename(inner, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
