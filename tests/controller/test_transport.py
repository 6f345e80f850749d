"""The controller's HTTP transport against the API server: keep-alive, a stale connection
reopened, failures translated into the controller's errors."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

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


def _sockets_to(port: int) -> int:
    """This process's established TCP connections to `port` (its own descriptors, read from /proc)."""
    inodes = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if int(fields[2].rsplit(":", 1)[1], 16) == port and fields[3] == "01":  # ESTABLISHED
                    inodes.add(fields[9])
    fds = Path("/proc/self/fd")
    mine = set()
    for fd in fds.iterdir():
        try:
            mine.add(os.readlink(fd))
        except OSError:
            continue  # closed since the listing
    return sum(f"socket:[{inode}]" in mine for inode in inodes)


def test_a_finished_threads_connection_is_closed_when_the_thread_ends(kube: KubeApi) -> None:
    # A long-lived controller starts threads (a sync, a probe): each that made a request kept its
    # socket until the client was closed. Old transport: 20 threads left 20 connections open.
    assert kube._transport is not None
    port = kube._transport._port
    assert port == urlsplit(kube._api.configuration.host).port
    kube.list_classes()  # this thread's connection, kept: it is alive
    before = _sockets_to(port)

    def one_request() -> None:
        kube.list_classes()

    for _ in range(20):
        thread = threading.Thread(target=one_request, name="short-lived")
        thread.start()
        thread.join(30.0)
        assert not thread.is_alive(), "a request hung"
    deadline = time.monotonic() + 10.0
    while (now := _sockets_to(port)) > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert now <= before, f"{now - before} connections of ended threads still open ({before} before)"
    assert len(kube._transport._open) == 1, len(kube._transport._open)
    kube.list_classes()  # this thread's connection still works


def test_closing_the_client_ends_its_open_watches_at_once(kube_cluster: Any, crds_installed: list[str],
                                                          namespace: str) -> None:
    # A controller's watch threads read until the server ends the watch (its timeout, a minute);
    # old transport: close() left them reading, and a test's controller logged into later tests.
    api = KubeApi.from_kubeconfig(str(kube_cluster.kubeconfig))
    path = api.collection_path("claim", namespace)
    _items, version = api.list_collection(path)
    assert api._transport is not None
    port = api._transport._port
    before = _sockets_to(port)
    opened, ended = threading.Event(), threading.Event()

    def watch() -> None:
        with contextlib.suppress(errors.ApiUnavailable):  # the end may come as a cut stream
            for _event in api.watch(path, resource_version=version, timeout_s=120):
                opened.set()
        ended.set()

    thread = threading.Thread(target=watch, name="closed-watch", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10.0
    while _sockets_to(port) <= before:  # the watch's connection is open
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
        port = api._transport._port
        before = _sockets_to(port)
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
        while _sockets_to(port) < before + 2:  # both watches connected
            assert time.monotonic() < deadline, "the watches never connected"
            time.sleep(0.01)
        api.end_watches([threads["stopped"]])
        assert ended["stopped"].wait(5.0), "the named thread's watch still reads"
        assert not ended["kept"].wait(0.5), "another thread's watch was ended too"
    finally:
        api.close()
    assert ended["kept"].wait(5.0)
