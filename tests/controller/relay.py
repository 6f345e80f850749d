"""A TCP relay on loopback between a client and the API server, to break connections for real:
`cut` closes every connection (a restarting server), `silence` makes the open ones half-open
(nothing is forwarded any more, nothing is closed: a peer that vanished), `refuse` closes the
port (the server is gone) and `accept_again` reopens it. Also the `relayed` fixture: a KubeApi
that reaches the test API server through a relay."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest
import yaml

from elasticgpu.controller.edge.kube import KubeApi


class Relay:
    """Forwards TCP connections from a loopback port to `target` (see the module docstring)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._sockets: list[socket.socket] = []
        self._silenced: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._accepting: socket.socket | None = self._listener
        """The listener whose connections are relayed (None once refused): an accept thread checks it
        under the lock, so a connection accepted while `refuse` ran is closed, not relayed."""
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            # Recorded before anything else, under the lock `cut` takes: a connection accepted
            # while `cut` or `refuse` runs is either in the list they close or sees they ran.
            with self._lock:
                relayed = self._accepting is listener
                if relayed:
                    self._sockets.append(client)
            if not relayed:
                client.close()  # accepted as the port closed: refused after all
                continue
            try:
                upstream = socket.create_connection(self._target)
            except OSError:
                upstream = None  # the target is down: the client sees its connection closed
            with self._lock:
                relayed = client in self._sockets  # not cut while connecting
                if relayed and upstream is not None:
                    self._sockets.append(upstream)
            if upstream is None or not relayed:
                self._discard(client)
                if upstream is not None:
                    upstream.close()
                continue
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _discard(self, sock: socket.socket) -> None:
        with self._lock:
            if sock in self._sockets:
                self._sockets.remove(sock)
        sock.close()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if source in self._silenced or sink in self._silenced:
                    continue  # half-open: read and dropped, never answered, never closed
                sink.sendall(data)
        if source in self._silenced or sink in self._silenced:
            return
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def cut(self) -> None:
        """Close every open connection."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def silence(self) -> None:
        """Make every open connection half-open; new connections work."""
        with self._lock:
            self._silenced.update(self._sockets)

    def refuse(self) -> None:
        """Close the port and every connection: new connections are refused, and none accepted
        while this runs survives it."""
        with self._lock:
            self._accepting = None
        self._close_listener()
        self.cut()

    def _close_listener(self) -> None:
        # shutdown first: on Linux a plain close leaves a socket blocked in accept() listening
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()

    def accept_again(self) -> None:
        """Listen on the same port again."""
        listener = socket.create_server(("127.0.0.1", self.port))
        with self._lock:
            self._listener = self._accepting = listener
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def close(self) -> None:
        """Stop relaying."""
        with self._lock:
            self._accepting = None
        self._close_listener()
        self.cut()
        with self._lock:
            silenced, self._silenced = self._silenced, set()
        for sock in silenced:
            sock.close()


R = TypeVar("R", bound=Relay)


def kubeconfig_through(relay_type: type[R], kubeconfig: str, path: Path) -> tuple[Path, R]:
    """Write at `path` a copy of `kubeconfig` whose current cluster is reached through a new
    relay of `relay_type` (the server's certificate still names the real host); the relay, open."""
    config = yaml.safe_load(Path(kubeconfig).read_text())
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])["context"]
    entry = next(c for c in config["clusters"] if c["name"] == context["cluster"])["cluster"]
    url = urlsplit(entry["server"])
    relay = relay_type((url.hostname or "127.0.0.1", url.port or 443))
    entry["server"] = f"{url.scheme}://127.0.0.1:{relay.port}{url.path}"
    entry.setdefault("tls-server-name", url.hostname)
    path.write_text(yaml.safe_dump(config))
    return path, relay


@pytest.fixture
def relayed(kube_cluster: Any, tmp_path: Path) -> Iterator[tuple[KubeApi, Relay]]:
    """A KubeApi that reaches the API server through a `Relay`."""
    path, relay = kubeconfig_through(Relay, kube_cluster.kubeconfig, tmp_path / "relayed-kubeconfig")
    api = KubeApi.from_kubeconfig(str(path))
    try:
        yield api, relay
    finally:
        relay.close()
        api.close()
