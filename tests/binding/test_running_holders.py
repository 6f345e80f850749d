"""A reservation is never freed while the node's agent reports its claim running on the card (issue 15).

Against the API server with the real controller: `status.runningClaims` is written into the GPU
by hand, as the agent writes it from its ledger. While the entry is there, a deleted claim (its
finalizer removed), a Failed ElasticGPU (fatal XID) or an orphan reservation keeps its room, the
ElasticGPU says why (`ReleasePending` / `ClaimStillRunning`, one Event), and a second claim does
not get the full card; when the entry goes, the reservation is freed and the second claim binds.
"""

from __future__ import annotations

import time
from typing import Any

from elasticgpu.api import names
from elasticgpu.controller import errors
from elasticgpu.controller.decisions.running_holders import CONDITION_RELEASE_PENDING, REASON_CLAIM_STILL_RUNNING
from elasticgpu.controller.edge.kube import KubeApi
from tests.binding import objects as o
from tests.binding.agent_status import write_gpu_status
from tests.binding.conftest import Cluster, new_controller, settle
from tests.pods.claim_world import World, world  # noqa: F401  # the fixture, re-exported for pytest
from tests.pods.conftest import pod_update_policies  # noqa: F401  # the world fixture's own


def _setup(cluster: Cluster) -> tuple[str, str]:
    model = f"T{cluster.prefix}"
    gpu_name = f"gpu-{cluster.prefix}-0"
    cluster.gpu(o.gpu(gpu_name, node=f"{cluster.prefix}-node", model=model))
    class_name = f"{cluster.prefix}-class"
    cluster.klass(o.klass(class_name, parameters={"gpuModel": model}))
    return gpu_name, class_name


def _allocations(kube: KubeApi, gpu_name: str) -> list[str]:
    return [a["elasticGPU"] for a in (kube.get_gpu(gpu_name).get("status") or {}).get("allocations") or []]


def _running(claim: dict[str, Any], *pods: str) -> dict[str, Any]:
    meta = claim["metadata"]
    return {"namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"],
            "pods": [f"{meta['namespace']}/{pod}" for pod in pods], "since": "2026-01-01T00:00:00Z"}


def _pending_condition(egpu: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in (egpu.get("status") or {}).get("conditions") or []
                 if c["type"] == CONDITION_RELEASE_PENDING), None)


def _events(kube: KubeApi, egpu_name: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in kube.list_events("default")
            if e["involvedObject"]["name"] == egpu_name and e["reason"] == reason]


def _delete_claim(kube: KubeApi, namespace: str, name: str) -> None:
    """What issue 15 reproduced: the finalizer removed by hand, then the claim deleted, while its pod runs."""
    kube.patch_claim(namespace, name, {"metadata": {"finalizers": []}})
    kube.delete_claim(namespace, name)


def test_a_deleted_claim_keeps_its_card_while_its_agent_reports_it_running(cluster: Cluster, kube: KubeApi) -> None:
    gpu_name, class_name = _setup(cluster)
    first = cluster.claim(o.claim("first", cores=100, memory=None, class_name=class_name))
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    egpu_name = cluster.get_claim("first")["spec"]["elasticGPUName"]
    write_gpu_status(kube, gpu_name, runningClaims=[_running(first, "p1")])
    settle(controller)

    _delete_claim(kube, cluster.namespace, "first")
    settle(controller)
    assert _allocations(kube, gpu_name) == [egpu_name], "the running claim's reservation is kept"
    egpu = kube.get_elastic_gpu(egpu_name)
    pending = _pending_condition(egpu)
    assert pending is not None and (pending["status"], pending["reason"]) == ("True", REASON_CLAIM_STILL_RUNNING)
    assert f"{cluster.namespace}/p1" in pending["message"] and f"{cluster.prefix}-node" in pending["message"]
    assert names.FINALIZER_EGPU_PROTECTION in egpu["metadata"]["finalizers"]

    # The card is full while the first claim runs: the second claim waits.
    cluster.claim(o.claim("second", cores=100, memory=None, class_name=class_name))
    settle(controller)
    assert cluster.get_claim("second")["status"]["phase"] == "Pending"
    assert _allocations(kube, gpu_name) == [egpu_name]
    assert len(_events(kube, egpu_name, REASON_CLAIM_STILL_RUNNING)) == 1, "one Event, not one per sync"

    # The containers stop: the agent drops the entry; that GPU write wakes the ElasticGPU.
    write_gpu_status(kube, gpu_name, runningClaims=[])
    settle(controller)
    second = cluster.get_claim("second")
    assert second["status"]["phase"] == "Bound"
    assert _allocations(kube, gpu_name) == [second["spec"]["elasticGPUName"]]
    try:
        kube.get_elastic_gpu(egpu_name)
        raise AssertionError("the released ElasticGPU (reclaim Delete) still exists")
    except errors.NotFound:
        pass


def test_a_failed_elastic_gpu_keeps_its_card_while_its_claim_runs(cluster: Cluster, kube: KubeApi) -> None:
    gpu_name, class_name = _setup(cluster)
    first = cluster.claim(o.claim("first", cores=100, memory=None, class_name=class_name))
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    egpu_name = cluster.get_claim("first")["spec"]["elasticGPUName"]
    xid = {"type": "Healthy", "status": "False", "reason": "Xid79", "message": "fell off the bus",
           "lastTransitionTime": "2026-01-01T00:00:00Z"}
    write_gpu_status(kube, gpu_name, runningClaims=[_running(first, "p1")], conditions=[xid], health="Unhealthy")
    settle(controller)
    egpu = kube.get_elastic_gpu(egpu_name)
    assert (egpu["status"]["phase"], egpu["status"]["reason"]) == ("Failed", "Xid79")
    assert cluster.get_claim("first")["status"]["phase"] == "Lost"
    assert _allocations(kube, gpu_name) == [egpu_name], "the Lost claim's pods still run on the card"
    pending = _pending_condition(egpu)
    assert pending is not None and pending["reason"] == REASON_CLAIM_STILL_RUNNING

    write_gpu_status(kube, gpu_name, runningClaims=[])
    settle(controller)
    assert _allocations(kube, gpu_name) == []
    pending = _pending_condition(kube.get_elastic_gpu(egpu_name))
    assert pending is None or pending["status"] == "False"


def test_an_orphan_reservation_is_kept_while_its_claim_runs(cluster: Cluster, kube: KubeApi) -> None:
    gpu_name, _class_name = _setup(cluster)
    uid = "0c3b1a6e-1111-4222-8333-944455556666"
    orphan = names.elastic_gpu_name_for_claim(uid)
    running = {"namespace": cluster.namespace, "name": "gone", "uid": uid, "pods": [f"{cluster.namespace}/p1"]}
    write_gpu_status(kube, gpu_name, allocations=[{"elasticGPU": orphan, "cores": 30, "memory": 10}],
                  runningClaims=[running])
    controller = new_controller(kube, cluster.namespace, grace_s=0.0)
    controller.resync()
    controller.drain()
    assert _allocations(kube, gpu_name) == [orphan]
    write_gpu_status(kube, gpu_name, runningClaims=[])
    controller.resync()
    controller.drain()
    assert _allocations(kube, gpu_name) == []


def test_which_entry_is_the_claim() -> None:
    """By uid when both carry one (a new claim of the same name is another claim), else by namespace/name;
    an orphan reservation (no claim reference) by the uid its name derives from."""
    from elasticgpu.api import GPURunningClaim, ObjectReference
    from elasticgpu.controller.decisions.running_holders import matches

    entry = GPURunningClaim(namespace="ns", name="c", uid="u1", pods=["ns/p"])
    no_uid = GPURunningClaim(namespace="ns", name="c", pods=["ns/p"])
    assert matches(entry, claim_ref=ObjectReference(namespace="ns", name="c", uid="u1"), key="k")
    assert not matches(entry, claim_ref=ObjectReference(namespace="ns", name="c", uid="u2"), key="k")
    assert matches(entry, claim_ref=ObjectReference(namespace="ns", name="c"), key="k")
    assert matches(no_uid, claim_ref=ObjectReference(namespace="ns", name="c", uid="u2"), key="k")
    assert not matches(no_uid, claim_ref=ObjectReference(namespace="other", name="c"), key="k")
    assert matches(entry, claim_ref=None, key=names.elastic_gpu_name_for_claim("u1"))
    assert not matches(no_uid, claim_ref=None, key=names.elastic_gpu_name_for_claim("u1"))


def test_a_claim_deleted_while_its_card_is_in_use_stays_bound_and_billed(cluster: Cluster, kube: KubeApi) -> None:
    """Issue 44 item 5: the tenant removes its claim's finalizer and deletes it while its containers run. The
    card stays reserved and charged (above), so the ElasticGPU stays Bound and its accounting period open
    until the agent no longer reports the claim running; then it is Released and reclaimed."""
    gpu_name, class_name = _setup(cluster)
    first = cluster.claim(o.claim("first", cores=100, memory=None, class_name=class_name))
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    egpu_name = cluster.get_claim("first")["spec"]["elasticGPUName"]
    write_gpu_status(kube, gpu_name, runningClaims=[_running(first, "p1")])
    settle(controller)
    since = kube.get_elastic_gpu(egpu_name)["status"]["accounting"]["since"]

    _delete_claim(kube, cluster.namespace, "first")
    settle(controller)
    status = kube.get_elastic_gpu(egpu_name)["status"]
    assert status["phase"] == "Bound", status
    assert status["accounting"].get("since") == since, "the reservation is still billed to its namespace"

    write_gpu_status(kube, gpu_name, runningClaims=[])
    settle(controller)
    assert _allocations(kube, gpu_name) == []
    try:
        kube.get_elastic_gpu(egpu_name)
        raise AssertionError("the released ElasticGPU (reclaim Delete) still exists")
    except errors.NotFound:
        pass


def test_a_claim_deleted_while_a_pod_bound_to_a_node_uses_it_stays_bound_until_the_pod_goes(
        world: World, kube: KubeApi) -> None:  # noqa: F811  # the fixture
    """Issue 44 item 5, before the agent reports anything: a pod the scheduler bound to a node names the claim;
    the claim is deleted (finalizer removed by hand): the ElasticGPU stays Bound while the pod runs, and is
    released once the pod is gone."""
    gpu_name, class_name = _setup(world)
    world.claim(o.claim("first", cores=100, memory=None, class_name=class_name))
    controller = new_controller(kube, world.namespace)
    settle(controller)
    egpu_name = world.get_claim("first")["spec"]["elasticGPUName"]
    world.pod("p1", claims={"main": "first"}, gated=False, node_name=f"{world.prefix}-node")
    settle(controller)

    _delete_claim(kube, world.namespace, "first")
    settle(controller)
    assert kube.get_elastic_gpu(egpu_name)["status"]["phase"] == "Bound"
    assert _allocations(kube, gpu_name) == [egpu_name]

    world.delete_pod("p1")
    deadline = time.monotonic() + 60
    while _allocations(kube, gpu_name):
        assert time.monotonic() < deadline, kube.get_elastic_gpu(egpu_name)["status"]
        controller.drain()
        time.sleep(0.2)
