"""Tests that can fail (issue 8 item 9): `settle` works a controller from its watches alone (no
relist after the first list), so a change whose event does not requeue what it should leaves a
claim where it was; `settle` has a deadline; and the controller's default mode, cluster-wide
(no namespace), binds, waits and releases claims of several namespaces."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.process.reconciling import Controller
from tests.binding import objects as o
from tests.binding.conftest import Cluster, new_controller, settle


def _phase(cluster: Cluster, name: str) -> tuple[str | None, str | None]:
    status = cluster.get_claim(name).get("status") or {}
    return status.get("phase"), status.get("reason")


def _gpu_and_class(cluster: Cluster) -> tuple[str, str]:
    model = f"T{cluster.prefix}"
    gpu_name = f"gpu-{cluster.prefix}-0"
    cluster.gpu(o.gpu(gpu_name, node=f"{cluster.prefix}-node", model=model))
    return gpu_name, model


def _class_arrives_later(cluster: Cluster, controller: Controller) -> None:
    """A claim of a class that does not exist yet waits; the class is created; settle."""
    _, model = _gpu_and_class(cluster)
    class_name = f"{cluster.prefix}-later"
    cluster.claim(o.claim("c1", cores=30, memory="10Gi", class_name=class_name))
    settle(controller)
    assert _phase(cluster, "c1") == ("Pending", "ClassNotFound")
    cluster.klass(o.klass(class_name, parameters={"gpuModel": model}))
    settle(controller)


def test_a_class_created_later_wakes_its_waiting_claim(cluster: Cluster, kube: KubeApi) -> None:
    controller = new_controller(kube, cluster.namespace)
    _class_arrives_later(cluster, controller)
    assert _phase(cluster, "c1") == ("Bound", None)  # a Bound claim has no reason (issue 29)


def test_a_missing_requeue_is_seen(cluster: Cluster, kube: KubeApi) -> None:
    """The test above can fail: with class events queueing nothing (the bug it guards against),
    settle leaves the claim Pending (the relist before every drain used to bind it anyway)."""
    controller = new_controller(kube, cluster.namespace)
    picture = controller.picture
    observe = picture.observe

    def no_wakeups_from_classes(kind: str, event_type: str | None, body: dict[str, Any]) -> list[tuple[str, ...]]:
        keys = observe(kind, event_type, body)
        return [] if kind == "class" else keys

    picture.observe = no_wakeups_from_classes  # type: ignore[method-assign]
    _class_arrives_later(cluster, controller)
    assert _phase(cluster, "c1") == ("Pending", "ClassNotFound")


def test_settle_has_a_deadline(cluster: Cluster, kube: KubeApi) -> None:
    _gpu_and_class(cluster)
    cluster.claim(o.claim("c1", cores=30, memory="10Gi", class_name="none"))
    controller = new_controller(kube, cluster.namespace)

    def broken(namespace: str, name: str) -> None:
        raise RuntimeError("a sync that always fails")

    controller.claims.sync = broken  # type: ignore[method-assign]
    started = time.monotonic()
    with pytest.raises(AssertionError, match="not quiet after 2s"):
        settle(controller, deadline_s=2.0)
    assert time.monotonic() - started < 10.0


# -- cluster-wide, the default mode ------------------------------------------------------------------


@pytest.fixture
def other(kube: KubeApi, api_client: client.ApiClient) -> Iterator[Cluster]:
    """A second namespace with its own objects, removed afterwards."""
    core = client.CoreV1Api(api_client)
    name = f"t-{uuid.uuid4().hex[:12]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={"elasticgpu-test": "1"})))
    objects = Cluster(kube, name)
    try:
        yield objects
    finally:
        objects.cleanup()
        core.delete_namespace(name)


def test_cluster_wide_binds_waits_and_releases_in_every_namespace(cluster: Cluster, other: Cluster,
                                                                 kube: KubeApi) -> None:
    gpu_name, model = _gpu_and_class(cluster)
    class_name = f"{cluster.prefix}-class"
    cluster.klass(o.klass(class_name, parameters={"gpuModel": model}))
    cluster.claim(o.claim("a", cores=60, memory="10Gi", class_name=class_name))
    other.claim(o.claim("b", cores=60, memory="10Gi", class_name=class_name))
    other.claim(o.claim("c", cores=30, memory="10Gi", class_name=class_name))
    controller = new_controller(kube, None)
    settle(controller)
    # Room for one 60% claim (in either namespace, in whichever order the list gave) and the 30%.
    assert _phase(other, "c") == ("Bound", None)
    sixty = {(cluster, "a"): _phase(cluster, "a"), (other, "b"): _phase(other, "b")}
    assert sorted(sixty.values(), key=str) == [("Bound", None), ("Pending", "NoCapacity")], sixty
    [(bound_ns, bound)] = [k for k, v in sixty.items() if v[0] == "Bound"]
    [(waiting_ns, waiting)] = [k for k, v in sixty.items() if v[0] == "Pending"]

    # Deleting the bound one frees its room, and the claim waiting in the other namespace is
    # bound: the deletion's events alone do it.
    kube.delete_claim(bound_ns.namespace, bound)
    settle(controller)
    assert _phase(waiting_ns, waiting) == ("Bound", None)
    held = {a["elasticGPU"] for a in kube.get_gpu(gpu_name)["status"]["allocations"]}
    assert held == {waiting_ns.get_claim(waiting)["spec"]["elasticGPUName"],
                    other.get_claim("c")["spec"]["elasticGPUName"]}
