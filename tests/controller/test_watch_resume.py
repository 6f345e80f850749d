"""A watch whose connection breaks resumes from the resourceVersion it had reached: no event is
lost and nothing is listed again (a list queues every object). The break is real: the
controller talks to the API server through a TCP relay in this test, which cuts every
connection at once, as a restarting server or a load balancer's idle timeout does."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from elasticgpu.controller.kube import KubeApi
from tests.binding import objects as o
from tests.binding.conftest import Cluster, new_controller


class Relay:
    """Forwards TCP connections from a loopback port to `target`; `cut` closes all of them."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._target)
            with self._lock:
                self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def cut(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self._listener.close()
        self.cut()


@pytest.fixture
def relayed(kube_cluster: Any, tmp_path: Path) -> Iterator[tuple[KubeApi, Relay]]:
    """A KubeApi that reaches the API server through a `Relay`."""
    config = yaml.safe_load(Path(kube_cluster.kubeconfig).read_text())
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])["context"]
    entry = next(c for c in config["clusters"] if c["name"] == context["cluster"])["cluster"]
    url = urlsplit(entry["server"])
    relay = Relay((url.hostname or "127.0.0.1", url.port or 443))
    entry["server"] = f"{url.scheme}://127.0.0.1:{relay.port}{url.path}"
    entry.setdefault("tls-server-name", url.hostname)  # the server's certificate names the real host
    path = tmp_path / "relayed-kubeconfig"
    path.write_text(yaml.safe_dump(config))
    api = KubeApi.from_kubeconfig(str(path))
    try:
        yield api, relay
    finally:
        relay.close()
        api.close()


def _wait(condition: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_a_broken_watch_resumes_without_listing_again(cluster: Cluster, kube: KubeApi,
                                                       relayed: tuple[KubeApi, Relay]) -> None:
    api, relay = relayed
    lists: list[str] = []
    list_collection = api.list_collection

    def counted(path: str) -> tuple[list[dict[str, Any]], str]:
        lists.append(path)
        return list_collection(path)

    api.list_collection = counted  # type: ignore[method-assign]
    controller = new_controller(api, cluster.namespace)
    stop = threading.Event()
    thread = threading.Thread(target=controller.informer.watch_kind, args=("claim", stop),
                              kwargs={"timeout_s": 300}, daemon=True)
    thread.start()
    try:
        cluster.claim(o.claim("before", cores=10, memory="1Gi"))
        assert _wait(lambda: controller.claim(cluster.namespace, "before") is not None)

        relay.cut()  # the watch's connection dies under it
        cluster.claim(o.claim("during", cores=10, memory="1Gi"))  # created while it is down
        assert _wait(lambda: controller.claim(cluster.namespace, "during") is not None)
        cluster.claim(o.claim("after", cores=10, memory="1Gi"))
        assert _wait(lambda: controller.claim(cluster.namespace, "after") is not None)
        assert lists == [api.collection_path("claim", cluster.namespace)], "the watch listed again"
    finally:
        stop.set()
        relay.cut()
        thread.join(timeout=10)
