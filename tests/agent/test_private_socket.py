"""A unix socket bound owner-only without os.umask (issue 44: umask is process-wide, and the agent's other
threads create files meanwhile): bound inside a 0700 folder, made 0600, renamed into place, still serving."""

from __future__ import annotations

import socket
import stat
from pathlib import Path

import pytest

from elasticgpu.agent import private_socket

pytestmark = pytest.mark.timeout(30)


def test_the_socket_is_never_reachable_by_others_and_serves_at_its_path(tmp_path: Path) -> None:
    path = tmp_path / "run" / "agent.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with private_socket.binding(path) as staged:
            assert staged.parent.parent == path.parent
            assert stat.S_IMODE(staged.parent.stat().st_mode) == 0o700  # from the bind on: others cannot enter
            server.bind(str(staged))
            server.listen(1)
        assert stat.S_ISSOCK(path.lstat().st_mode) and stat.S_IMODE(path.stat().st_mode) == 0o600
        assert sorted(p.name for p in path.parent.iterdir()) == ["agent.sock"]  # the staging folder is gone
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(5)
            client.connect(str(path))  # the renamed socket still serves
            accepted, _ = server.accept()
            accepted.close()
    finally:
        server.close()


def test_a_failed_bind_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "agent.sock"
    with pytest.raises(OSError, match="cannot listen"), private_socket.binding(path):
        raise OSError("cannot listen")
    assert list(tmp_path.iterdir()) == []
