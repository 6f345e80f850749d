"""The controller's HTTP transport against the API server: keep-alive, a stale connection
reopened, failures translated into the controller's errors."""

from __future__ import annotations

import socket

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
