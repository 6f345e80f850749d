"""The controller's HTTP transport against the API server: keep-alive, a stale connection
reopened, failures translated into the controller's errors."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any

import pytest

from elasticgpu.controller import errors
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.settings import ApiSettings


def _connection(kube: KubeApi) -> object:
    assert kube._transport is not None, "the kubeconfig asks for no proxy: the transport must be used"
    return kube._transport._local.conn


def test_calls_share_one_connection_per_thread(kube: KubeApi) -> None:
    kube.list_classes()
    first = _connection(kube)
    kube.list_classes()
    assert _connection(kube) is first


def test_a_connection_the_server_closed_is_reopened_once(kube: KubeApi) -> None:
    kube.list_classes()
    stale = _connection(kube)
    # As when the server drops an idle keep-alive connection: the socket is dead under the client.
    stale.sock.shutdown(socket.SHUT_RDWR)  # type: ignore[attr-defined]
    assert isinstance(kube.list_classes(), list)
    assert _connection(kube) is not stale


def test_errors_become_controller_errors(kube: KubeApi, namespace: str) -> None:
    with pytest.raises(errors.NotFound):
        kube.get_claim(namespace, "no-such-claim")
    unreachable = KubeApi(kube._api, settings=ApiSettings(request_timeout_s=2.0))
    assert unreachable._transport is not None
    unreachable._transport._port = _closed_port()
    with pytest.raises(errors.ApiUnavailable):
        unreachable.list_classes()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _streams(api: KubeApi) -> int:
    """The watches open on `api`'s transport (registered once the server answered the request)."""
    assert api._transport is not None
    with api._transport._lock:
        return len(api._transport._streams)


def test_a_finished_threads_connection_is_closed_when_the_thread_ends(kube_cluster: Any,
                                                                     crds_installed: list[str]) -> None:
    # A long-lived controller starts threads (a sync, a probe): each that made a request kept its
    # socket until the client was closed. Old transport: 20 threads left 20 connections open.
    # The client is the test's own and the connections are the threads' own objects: counting the
    # process's sockets to the server also counted other tests' clients (failed in a full run).
    api = KubeApi.from_kubeconfig(str(kube_cluster.kubeconfig))
    try:
        transport = api._transport
        assert transport is not None
        api.list_classes()  # this thread's connection, kept: it is alive
        mine = transport._local.conn
        used: list[Any] = []

        def one_request() -> None:
            api.list_classes()
            used.append(transport._local.conn)

        for _ in range(20):
            thread = threading.Thread(target=one_request, name="short-lived")
            thread.start()
            thread.join(30.0)
            assert not thread.is_alive(), "a request hung"
        assert len(used) == 20 and mine not in used
        deadline = time.monotonic() + 10.0
        while (still := [conn for conn in used if conn.sock is not None]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not still, f"{len(still)} connections of ended threads still open"
        with transport._lock:
            assert transport._open == {mine}, len(transport._open)
        api.list_classes()  # this thread's connection still works
        assert transport._local.conn is mine
    finally:
        api.close()


def test_closing_the_client_ends_its_open_watches_at_once(kube_cluster: Any, crds_installed: list[str],
                                                          namespace: str) -> None:
    # A controller's watch threads read until the server ends the watch (its timeout, a minute);
    # old transport: close() left them reading, and a test's controller logged into later tests.
    api = KubeApi.from_kubeconfig(str(kube_cluster.kubeconfig))
    path = api.collection_path("claim", namespace)
    _items, version = api.list_collection(path)
    assert api._transport is not None
    opened, ended = threading.Event(), threading.Event()

    def watch() -> None:
        with contextlib.suppress(errors.ApiUnavailable):  # the end may come as a cut stream
            for _event in api.watch(path, resource_version=version, timeout_s=120):
                opened.set()
        ended.set()

    thread = threading.Thread(target=watch, name="closed-watch", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10.0
    while _streams(api) < 1:  # the watch's stream is open
        assert time.monotonic() < deadline, "the watch never connected"
        time.sleep(0.01)
    api.close()
    assert ended.wait(5.0), "the watch still reads after its client was closed"
    thread.join(5.0)


def test_end_watches_ends_only_the_watches_of_the_threads_named(kube_cluster: Any, crds_installed: list[str],
                                                                namespace: str) -> None:
    # A test's controller stopped on the session's shared client: its watch threads end now, not at
    # their timeout, and another controller's watch on the same client goes on.
    api = KubeApi.from_kubeconfig(str(kube_cluster.kubeconfig))
    try:
        path = api.collection_path("claim", namespace)
        _items, version = api.list_collection(path)
        assert api._transport is not None
        ended = {name: threading.Event() for name in ("stopped", "kept")}

        def watch(name: str) -> None:
            with contextlib.suppress(errors.ApiUnavailable):
                for _event in api.watch(path, resource_version=version, timeout_s=120):
                    pass
            ended[name].set()

        threads = {name: threading.Thread(target=watch, args=(name,), name=name, daemon=True) for name in ended}
        for thread in threads.values():
            thread.start()
        deadline = time.monotonic() + 10.0
        while _streams(api) < 2:  # both watches' streams are open
            assert time.monotonic() < deadline, "the watches never connected"
            time.sleep(0.01)
        api.end_watches([threads["stopped"]])
        assert ended["stopped"].wait(5.0), "the named thread's watch still reads"
        assert not ended["kept"].wait(0.5), "another thread's watch was ended too"
    finally:
        api.close()
    assert ended["kept"].wait(5.0)
