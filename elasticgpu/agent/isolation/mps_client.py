"""The agent's side of the MPS daemon service (mps_service): what `MpsRoom` asks of the node's daemons.

Same calls as `MpsDaemons`, answered by the `elasticgpu agent mps-daemons` process over its unix socket, so the
daemons live outside the agent's cgroup and an agent restart leaves them, and their clients, alone. The paths
(pipe and shm folders) are the same on both sides: both take them from the isolation folder.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from elasticgpu.agent.isolation import mps_shm
from elasticgpu.agent.isolation.mps_ceiling import Ceiling
from elasticgpu.agent.isolation.mps_folders import CardFolders


class MpsServiceUnreachable(RuntimeError):
    """The MPS daemon service does not answer (not started yet on this node, restarting, or not deployed)."""


class MpsServiceRefused(RuntimeError):
    """The MPS daemon service did not understand a request (an agent and a service of different versions)."""


class MpsDaemonsClient:
    """`MpsDaemons`' calls, asked of the service at `socket_path` (see the module docstring). Thread-safe."""

    def __init__(self, *, socket_path: Path, state_dir: Path, timeout_s: float = 60.0) -> None:
        """`timeout_s`: how long one request may take (a start waits for the daemon, a stop for its `quit`)."""
        self.socket_path = socket_path
        self.folders = CardFolders(state_dir)
        self._timeout_s = timeout_s

    def pipe_dir(self, uuid: str) -> Path:
        return self.folders.pipe_dir(uuid)

    def shm_dir(self, uuid: str) -> Path:
        return self.folders.shm_dir(uuid)

    def problem(self) -> str | None:
        """Why the node cannot run MPS daemons (the service's answer); raises MpsServiceUnreachable or
        MpsServiceRefused while it cannot be asked (that passes by itself)."""
        said = self._ask({"op": "problem"}).get("problem")
        return said if isinstance(said, str) else None

    def pid(self, uuid: str) -> int | None:
        found = self._ask({"op": "pid", "uuid": uuid}).get("pid")
        return found if isinstance(found, int) else None

    def ensure(self, uuid: str, ceiling: Ceiling | None = None) -> None:
        """The card's daemon runs with a ceiling covering `ceiling`; RuntimeError (mps_shm.NeedsAdmin when an admin
        must act) saying why not."""
        said = self._ask({"op": "ensure", "uuid": uuid,
                          "ceiling": None if ceiling is None else [ceiling.cores, ceiling.memory_mib]})
        if said.get("ok") is True:
            return
        error = str(said.get("error") or f"unexpected answer {said!r}")
        raise mps_shm.NeedsAdmin(error) if said.get("admin") is True else RuntimeError(error)

    def release_except(self, used: Iterable[str]) -> list[str]:
        """Stop the daemons of the cards no container uses (the service keeps its idle grace); returns their uuids."""
        released = self._ask({"op": "release_except", "used": sorted(set(used))}).get("released")
        return [u for u in released if isinstance(u, str)] if isinstance(released, list) else []

    def close(self) -> None:
        """Nothing to stop here: the daemons are the service's."""

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(self._timeout_s)
                conn.connect(str(self.socket_path))
                conn.sendall(json.dumps(request).encode() + b"\n")
                with conn.makefile("rb") as answer:
                    line = answer.readline()
        except OSError as e:
            raise MpsServiceUnreachable(
                f"the MPS daemon service does not answer at {self.socket_path} ({e.strerror or e}); it runs as the"
                " DaemonSet elasticgpu-mps (or the unit elasticgpu-mps): is it running on this node?") from e
        try:
            said = json.loads(line)
        except ValueError:
            said = None
        if not isinstance(said, dict):
            raise MpsServiceUnreachable(f"the MPS daemon service at {self.socket_path} closed the connection without"
                                        " an answer")
        if "bad_request" in said:
            raise MpsServiceRefused(f"the MPS daemon service at {self.socket_path} refused {request['op']!r}:"
                                    f" {said['bad_request']} (agent and elasticgpu-mps of different versions?)")
        return said
