"""The node's MPS control daemons behind a unix socket: `elasticgpu agent mps-daemons` (issue 44).

The daemons must outlive the agent: their clients (the MPS containers of each card) need them, and an agent
restart, rollout or `helm upgrade` would otherwise end every MPS client of the node (a container's runtime, or
systemd, kills every process of its cgroup when it stops, and a daemon started by the agent is in the agent's).
So they run in a process of their own (the chart's DaemonSet `elasticgpu-mps`), which owns `MpsDaemons` (start,
supervise, ceiling, stop) and takes the agent's requests here; the agent's `MpsRoom` asks through
`mps_client.MpsDaemonsClient`. When this process starts it adopts the daemons it finds (its own earlier run's).

Protocol: one JSON object a line, one request per connection, one answer line:
    {"op": "ensure", "uuid": U, "ceiling": [cores, memory_mib] | null}  -> {"ok": true} | {"error": E, "admin": bool}
    {"op": "release_except", "used": [U, ...]}                           -> {"released": [U, ...]}
    {"op": "problem"}                                                     -> {"problem": P | null}
    {"op": "pid", "uuid": U}                                              -> {"pid": N | null}
The socket is the owner's alone (0600, bound through `private_socket`: never open to others, even for an instant):
only root on the node (the agent) reaches it; the MPS containers see the card folders, never this socket.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socketserver
import threading
from pathlib import Path
from typing import Any

from elasticgpu.agent import private_socket
from elasticgpu.agent.isolation import mps_shm
from elasticgpu.agent.isolation.mps_ceiling import Ceiling
from elasticgpu.agent.isolation.mps_daemons import MpsDaemons

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 1 << 20
"""A request longer than this is refused (a release lists every card of the node: far less)."""


class BadRequest(ValueError):
    """A request this service does not understand."""


def answer(daemons: MpsDaemons, request: Any) -> dict[str, Any]:
    """The answer to one request (see the module docstring)."""
    if not isinstance(request, dict):
        raise BadRequest("a request is a JSON object")
    op = request.get("op")
    if op == "problem":
        return {"problem": daemons.problem()}
    if op == "pid":
        return {"pid": daemons.pid(_uuid(request))}
    if op == "release_except":
        used = request.get("used")
        if not isinstance(used, list) or not all(isinstance(u, str) for u in used):
            raise BadRequest("release_except: 'used' is a list of card uuids")
        return {"released": daemons.release_except(used)}
    if op == "ensure":
        uuid = _uuid(request)
        raw = request.get("ceiling")
        ceiling = None
        if raw is not None:
            if not (isinstance(raw, list) and len(raw) == 2 and all(type(v) is int for v in raw)):
                raise BadRequest("ensure: 'ceiling' is [cores, memory_mib] or null")
            ceiling = Ceiling(raw[0], raw[1])
        try:
            daemons.ensure(uuid, ceiling)
        except RuntimeError as e:
            return {"error": str(e), "admin": isinstance(e, mps_shm.NeedsAdmin)}
        return {"ok": True}
    raise BadRequest(f"unknown op {op!r}")


def _uuid(request: dict[str, Any]) -> str:
    uuid = request.get("uuid")
    # A card's uuid names its folder: nothing that could leave the state folder.
    if not isinstance(uuid, str) or not uuid or "/" in uuid or uuid in (".", "..") or len(uuid) > 128:
        raise BadRequest("'uuid' is a card's uuid")
    return uuid


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        line = self.rfile.readline(MAX_REQUEST_BYTES)
        try:
            reply = answer(self.server.daemons, json.loads(line))
        except (BadRequest, ValueError) as e:
            reply = {"bad_request": str(e)}
        except Exception as e:  # a request that fails must not end the service: say why
            log.exception("MPS daemon service: request failed")
            reply = {"error": f"the MPS daemon service failed: {e}", "admin": False}
        with contextlib.suppress(OSError):  # the agent gave up waiting: nothing to tell
            self.wfile.write(json.dumps(reply).encode() + b"\n")


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, daemons: MpsDaemons) -> None:
        self.daemons = daemons
        super().__init__(path, _Handler)


class MpsDaemonService:
    """Serves `daemons` at `socket_path` until `close` (see the module docstring)."""

    def __init__(self, daemons: MpsDaemons, socket_path: Path) -> None:
        self.daemons = daemons
        self.socket_path = socket_path
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)  # a socket of an earlier run (it was killed): nobody listens there
        with private_socket.binding(socket_path) as staging:
            self._server = _Server(str(staging), daemons)
        self._thread = threading.Thread(target=self._server.serve_forever, name="mps-service", daemon=True)

    def start(self) -> list[str]:
        """Adopt the daemons an earlier run left (they kept serving), then answer requests. Returns the adopted."""
        adopted = self.daemons.adopt()
        self._thread.start()
        log.info("MPS daemon service listening on %s (%d daemon(s) adopted)", self.socket_path, len(adopted))
        return adopted

    def close(self) -> None:
        """Stop answering and supervising; the daemons keep serving their clients (the next run adopts them)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        self.daemons.close()
