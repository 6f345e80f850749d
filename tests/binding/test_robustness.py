"""Bugs of the binding path, each reproduced against the API server: names too long for a label
value, a stale ElasticGPU status write, a failed or racing pod list during a relist, and a
WaitForFirstConsumer class that used to leave its claims Pending without a word."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from elasticgpu.api import names
from elasticgpu.controller import errors
from elasticgpu.controller.decisions import binder
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.binding.provisioner import label_value
from tests.binding import objects as o
from tests.binding.conftest import Cluster, new_controller, settle

LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def _setup(cluster: Cluster, *, class_name: str = "", node: str = "", **class_args: Any) -> str:
    model = f"T{cluster.prefix}"
    cluster.gpu(o.gpu(f"gpu-{cluster.prefix}-0", node=node or f"{cluster.prefix}-node", model=model))
    class_name = class_name or f"{cluster.prefix}-class"
    cluster.klass(o.klass(class_name, parameters={"gpuModel": model}, **class_args))
    return class_name


def test_names_longer_than_a_label_value_still_bind(cluster: Cluster, kube: KubeApi) -> None:
    long_class = f"{cluster.prefix}-class-" + "c" * 80
    long_node = f"{cluster.prefix}-node-" + "n" * 80
    long_claim = "claim-" + "x" * 120
    _setup(cluster, class_name=long_class, node=long_node)
    cluster.claim(o.claim(long_claim, cores=10, memory="1Gi", class_name=long_class))
    settle(new_controller(kube, cluster.namespace))

    claim = cluster.get_claim(long_claim)
    assert claim["status"]["phase"] == "Bound", claim.get("status")
    labels = kube.get_elastic_gpu(claim["spec"]["elasticGPUName"])["metadata"]["labels"]
    assert all(len(v) <= 63 and LABEL_VALUE.fullmatch(v) for v in labels.values()), labels
    assert labels[names.LABEL_CLAIM_NAME] == label_value(long_claim)
    assert labels[names.LABEL_CLASS] == label_value(long_class)
    assert labels[names.LABEL_NODE] == label_value(long_node)
    assert label_value(long_claim) != label_value(long_claim + "y")  # distinct names stay distinct


def test_a_stale_elastic_gpu_status_write_is_refused(cluster: Cluster, kube: KubeApi) -> None:
    class_name = _setup(cluster)
    cluster.claim(o.claim("c", cores=10, memory="1Gi", class_name=class_name))
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    egpu_name = cluster.get_claim("c")["spec"]["elasticGPUName"]
    stale = controller.picture.egpu(egpu_name)
    assert stale is not None and stale.status.phase == "Bound"
    # Another controller releases it meanwhile; this one has not seen that yet.
    kube.patch_elastic_gpu_status(egpu_name, {"status": {"phase": "Released", "reason": "Released"}})

    with pytest.raises(errors.Conflict):
        controller.elastic_gpus.set_phase(stale, "Bound", binder.REASON_BOUND, "bound to claim c")
    assert kube.get_elastic_gpu(egpu_name)["status"]["phase"] == "Released"  # never flipped back
    fresh = controller.picture.egpu(egpu_name)
    assert fresh is not None and fresh.status.phase == "Released"  # the 409 re-read it


def _pod(name: str, claim: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {names.claim_annotation("main"): claim},
                         # what the admission webhook adds: the controller watches only such pods
                         "labels": {names.LABEL_USES_CLAIMS: "true"}},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}}


def test_a_failed_pod_list_keeps_the_claim_of_a_running_pod(cluster: Cluster, kube: KubeApi,
                                                             api_client: Any) -> None:
    from kubernetes import client

    class_name = _setup(cluster)
    cluster.claim(o.claim("used", cores=10, memory="1Gi", class_name=class_name))
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(cluster.namespace, _pod("p", "used"))
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    assert cluster.get_claim("used")["status"]["phase"] == "Bound"

    pods_path = kube.collection_path("pod", cluster.namespace)
    list_collection = kube.list_collection

    def pods_fail(path: str) -> tuple[list[dict[str, Any]], str]:
        if path == pods_path:
            raise errors.ApiUnavailable(f"GET {path}: HTTP 504: the list timed out", status=504)
        return list_collection(path)

    kube.list_collection = pods_fail  # type: ignore[method-assign]
    try:
        kube.delete_claim(cluster.namespace, "used")
        settle(controller)  # relists: the pod list fails each time
    finally:
        del kube.list_collection
    claim = cluster.get_claim("used")  # still there: its pod still runs
    assert names.FINALIZER_CLAIM_PROTECTION in claim["metadata"]["finalizers"]


def test_a_pod_event_that_arrives_during_a_list_is_kept(cluster: Cluster, kube: KubeApi, api_client: Any) -> None:
    from kubernetes import client

    class_name = _setup(cluster)
    cluster.claim(o.claim("used", cores=10, memory="1Gi", class_name=class_name))
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    core = client.CoreV1Api(api_client)
    pods_path = kube.collection_path("pod", cluster.namespace)
    list_collection = kube.list_collection

    def pod_created_after_the_list(path: str) -> tuple[list[dict[str, Any]], str]:
        listed = list_collection(path)
        if path == pods_path:
            # The pod is created after the list was read, and its watch event is taken in
            # before the list is merged into the picture.
            created = api_client.sanitize_for_serialization(
                core.create_namespaced_pod(cluster.namespace, _pod("p", "used")))
            controller.observe("pod", "ADDED", created)
        return listed

    kube.list_collection = pod_created_after_the_list  # type: ignore[method-assign]
    try:
        controller.rebuild()
    finally:
        del kube.list_collection
    kube.delete_claim(cluster.namespace, "used")
    controller.observe("claim", "MODIFIED", cluster.get_claim("used"))
    controller.drain()
    claim = cluster.get_claim("used")  # still there: the pod the list did not show uses it
    assert names.FINALIZER_CLAIM_PROTECTION in claim["metadata"]["finalizers"]


def test_wait_for_first_consumer_says_what_the_claim_waits_for(cluster: Cluster, kube: KubeApi) -> None:
    class_name = _setup(cluster, mode="WaitForFirstConsumer")
    cluster.egpu(o.share_egpu(f"{cluster.prefix}-static", f"gpu-{cluster.prefix}-0", cores=50, memory="20Gi",
                              class_name=class_name))
    cluster.claim(o.claim("c", cores=10, memory="1Gi", class_name=class_name))
    settle(new_controller(kube, cluster.namespace))

    claim = cluster.get_claim("c")
    assert claim["status"]["phase"] == "Pending"
    [condition] = claim["status"]["conditions"]
    assert (condition["type"], condition["reason"]) == ("Pending", "WaitingForFirstConsumer")
    assert "waiting for a pod that uses this claim" in condition["message"]
    assert (claim["status"]["reason"], claim["status"]["message"]) == (condition["reason"], condition["message"])
    assert "WaitForFirstConsumer" in condition["message"]
    assert not claim["spec"].get("elasticGPUName")  # nor bound to the static ElasticGPU of the class


class _ClaimPatchFailsOnce:
    """The controller's API client, except that its first claim PATCH (step 3 of a dynamic bind:
    the claim names its new ElasticGPU) fails as a 500 would, before reaching the server."""

    def __init__(self, kube: KubeApi) -> None:
        self._kube = kube
        self.failed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kube, name)

    def patch_claim(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        if not self.failed:
            self.failed += 1
            raise errors.ApiUnavailable("HTTP 500: injected", status=500)
        return self._kube.patch_claim(namespace, name, patch)


def test_a_bind_that_fails_after_creating_the_elastic_gpu_finishes_without_any_watch_event(
        cluster: Cluster, kube: KubeApi) -> None:
    """The ElasticGPU is created, the claim's write fails: the claim's retry waits for the
    ElasticGPU's own sync (`ElasticGPUNotAvailable`), so that sync must be queued by the failure
    itself. No watch runs here: before, only a later watch event or resync moved it on (20 s and
    more under the fault test's load)."""
    class_name = _setup(cluster)
    cluster.claim(o.claim("c", cores=10, memory="1Gi", class_name=class_name))
    controller = new_controller(kube, cluster.namespace)
    flaky = _ClaimPatchFailsOnce(kube)
    controller.claims.binding.kube = flaky  # type: ignore[assignment]
    controller.rebuild()  # one list, no watches
    deadline = time.monotonic() + 20
    while cluster.get_claim("c").get("status", {}).get("phase") != "Bound":
        assert time.monotonic() < deadline, cluster.get_claim("c").get("status")
        controller.drain()
        time.sleep(0.05)
    assert flaky.failed == 1
    egpu = kube.get_elastic_gpu(cluster.get_claim("c")["spec"]["elasticGPUName"])
    assert egpu["status"]["phase"] == "Bound"
    controller.close()


def test_the_bind_s_event_names_the_provisioned_elastic_gpu_once(cluster: Cluster, kube: KubeApi) -> None:
    """Issue 50: the Event said "provisioned ElasticGPU egpu-X and bound to ElasticGPU egpu-X on node"."""
    class_name = _setup(cluster)
    cluster.claim(o.claim("once", cores=10, memory="1Gi", class_name=class_name))
    settle(new_controller(kube, cluster.namespace))
    egpu = cluster.get_claim("once")["spec"]["elasticGPUName"]
    [said] = [e["message"] for e in kube.list_events(cluster.namespace)
              if e.get("reason") == binder.REASON_BOUND and e["involvedObject"]["name"] == "once"]
    assert said.startswith(f"provisioned ElasticGPU {egpu} and bound to it on {cluster.prefix}-node"), said
    assert said.count(egpu) == 1, said
