"""Bind order against the API server: a full card, Pending claims from three namespaces, one
release; which claim gets the freed room depends on the class's `bindOrder`.

The controller is restarted before the release, so the claims reach its picture in list order
(by namespace, then name), not in the order they were made: FIFO must still bind the oldest.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from elasticgpu.controller.edge.kube import KubeApi
from tests.binding import objects as o
from tests.binding.conftest import Cluster, new_controller, settle, stop_watches
from tests.binding.namespaces import fresh_namespaces


@pytest.fixture
def namespaces(api_client: client.ApiClient, kube: KubeApi, namespace: str) -> Iterator[list[str]]:
    """Three fresh namespaces that sort as a < b < c; their claims and ElasticGPUs are removed after."""
    made = [f"{namespace}-{suffix}" for suffix in "abc"]
    with fresh_namespaces(api_client, kube, made):
        yield made


def _claim(kube: KubeApi, namespace: str, name: str, cores: int, class_name: str) -> dict[str, Any]:
    body = o.claim(name, namespace, cores=cores, memory=None, class_name=class_name)
    body["metadata"].pop("uid")
    return kube.create_claim(body)


def _phase(kube: KubeApi, namespace: str, name: str) -> str:
    return str((kube.get_claim(namespace, name).get("status") or {}).get("phase"))


@pytest.mark.parametrize(("bind_order", "winner"), [("FIFO", "b2"), ("FairShare", "c1")])
def test_freed_room_goes_by_the_class_bind_order(cluster: Cluster, kube: KubeApi, namespaces: list[str],
                                                 bind_order: str, winner: str) -> None:
    ns_a, ns_b, ns_c = namespaces
    gpu = f"gpu-{cluster.prefix}-0"
    model = f"T{cluster.prefix}"
    cluster.gpu(o.gpu(gpu, node=f"{cluster.prefix}-node", model=model))
    class_name = f"{cluster.prefix}-class"
    body = o.klass(class_name, parameters={"gpuModel": model})
    body["bindOrder"] = bind_order
    cluster.klass(body)
    # The card full: namespace a holds 60 cores, b holds 40, c nothing.
    for namespace, name, cores in ((ns_a, "a1", 30), (ns_a, "a2", 30), (ns_b, "b1", 40)):
        _claim(kube, namespace, name, cores, class_name)
    first = new_controller(kube, None)
    settle(first)
    assert all(_phase(kube, ns, n) == "Bound" for ns, n in ((ns_a, "a1"), (ns_a, "a2"), (ns_b, "b1")))
    stop_watches()
    first.close()

    # Waiting: b2 oldest (one second before the others: timestamps have one-second resolution), then a3, c1.
    _claim(kube, ns_b, "b2", 30, class_name)
    time.sleep(1.1)
    _claim(kube, ns_a, "a3", 30, class_name)
    _claim(kube, ns_c, "c1", 30, class_name)
    controller = new_controller(kube, None)  # lists the waiting claims as a3, b2, c1
    settle(controller)
    waiting = ((ns_a, "a3"), (ns_b, "b2"), (ns_c, "c1"))
    assert [_phase(kube, ns, n) for ns, n in waiting] == ["Pending"] * 3

    kube.delete_claim(ns_a, "a1")  # frees 30 cores: room for exactly one; a then holds 30, b 40, c 0
    settle(controller)
    controller.close()
    phases = {n: _phase(kube, ns, n) for ns, n in waiting}
    expected = {n: "Pending" for _, n in waiting} | {winner: "Bound"}
    assert phases == expected, f"{bind_order}: expected {winner} to get the freed room"
