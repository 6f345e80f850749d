"""Inline requests against the API server: the claim `<pod>-<container>` is made, owned by the
pod (controller ownerReference), bound with the pod as its user, and deleted with the pod (the
test server has no garbage collector: the controller does it, and doing it after a garbage
collector is harmless). A pod recreated under the same name gets a claim of its own; a claim of
that name that is not the pod's is never touched."""

from __future__ import annotations

from typing import Any

import pytest

from elasticgpu.api import names
from elasticgpu.controller import errors
from tests.binding import objects as o
from tests.pods.claim_world import World, controller_for, kube, settle, world

__all__ = ["kube", "world"]  # fixtures


@pytest.fixture
def default_class(world: World) -> str:
    node = world.node(f"{world.prefix}-a")
    model = f"T{world.prefix}"
    world.gpu(o.gpu(f"gpu-{world.prefix}-0", node=node, model=model))
    name = f"{world.prefix}-default"
    world.klass(o.klass(name, default=True, parameters={"gpuModel": model}))
    return node


def _gone(world: World, claim: str) -> bool:
    try:
        world.get_claim(claim)
    except errors.NotFound:
        return True
    return False


def _gated(pod: dict[str, Any]) -> bool:
    return any(g["name"] == names.SCHEDULING_GATE for g in pod["spec"].get("schedulingGates") or [])


def test_inline_claim_is_made_bound_and_removed_with_its_pod(world: World, default_class: str) -> None:
    controller = controller_for(world)
    pod = world.pod("web-0", inline={"main": "gpu-core=30,gpu-memory=10Gi"})
    settle(controller)
    claim = world.get_claim("web-0-main")
    # As a generic ephemeral volume's claim: controller, and blockOwnerDeletion (foreground deletion
    # of the pod waits for its claim; issue 28.1, tests/pods/test_inline_foreground.py).
    assert claim["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "web-0", "uid": pod["metadata"]["uid"], "controller": True,
         "blockOwnerDeletion": True}]
    assert claim["spec"]["resources"]["requests"] == {names.RESOURCE_CORE: 30, names.RESOURCE_MEMORY: "10Gi"}
    assert claim["status"]["phase"] == "Bound"
    assert claim["status"]["users"] == [{"name": "web-0", "uid": pod["metadata"]["uid"]}]
    assert not _gated(world.get_pod("web-0"))
    # Its bind is routine: no Event (issue 37; a claim a user made gets one, test_against_server.py).
    assert world.events("Bound", name="web-0-main") == []

    world.delete_pod("web-0")
    settle(controller)
    assert _gone(world, "web-0-main")
    egpu = claim["spec"]["elasticGPUName"]
    with pytest.raises(errors.NotFound):  # reclaim policy Delete: its ElasticGPU went too
        world.kube.get_elastic_gpu(egpu)
    # Released and deleted with its pod, as routine as its bind: no Events (issue 37).
    said = [e["reason"] for e in world.kube.list_events(controller.kube.settings.events_namespace)
            if (e.get("involvedObject") or {}).get("name") == egpu]
    assert said == []


def test_a_recreated_pod_gets_a_claim_of_its_own(world: World, default_class: str) -> None:
    controller = controller_for(world)
    world.pod("db-0", inline={"main": "gpu-core=20"})
    settle(controller)
    old = world.get_claim("db-0-main")
    world.delete_pod("db-0")
    again = world.pod("db-0", inline={"main": "gpu-core=20"})  # before the controller saw the deletion
    settle(controller, rounds=5)
    new = world.get_claim("db-0-main")
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    assert new["metadata"]["ownerReferences"][0]["uid"] == again["metadata"]["uid"]
    assert new["status"]["phase"] == "Bound"
    assert not _gated(world.get_pod("db-0"))


def test_deletion_after_a_garbage_collector_is_harmless(world: World, default_class: str) -> None:
    controller = controller_for(world)
    world.pod("job-0", inline={"main": "gpu-core=10"})
    settle(controller)
    claim = world.get_claim("job-0-main")
    world.delete_pod("job-0")
    # a real cluster's garbage collector deletes the claim first (background propagation)
    world.kube.delete_claim_of(world.namespace, "job-0-main", uid=claim["metadata"]["uid"])
    settle(controller)
    assert _gone(world, "job-0-main")
    # and a claim of the same name that is not the pod's is never deleted
    world.claim(o.claim("job-0-main", cores=10, memory="1Gi"))
    settle(controller)
    assert not _gone(world, "job-0-main")


def test_inline_name_taken_by_a_users_claim(world: World, default_class: str) -> None:
    world.claim(o.claim("p-main", cores=10, memory="1Gi"))
    controller = controller_for(world)
    world.pod("p", inline={"main": "gpu-core=10"})
    settle(controller)
    assert _gated(world.get_pod("p"))
    condition = world.claims_ready("p")
    assert condition is not None and condition["reason"] == "InlineClaimNameTaken"
    assert "p-main" in condition["message"]
    assert "ownerReferences" not in world.get_claim("p-main")["metadata"]


def test_inline_claim_protected_while_its_pod_runs(world: World, default_class: str) -> None:
    controller = controller_for(world)
    world.pod("w", inline={"side": "gpu-core=10"})
    settle(controller)
    world.kube.delete_claim(world.namespace, "w-side")
    settle(controller)
    claim = world.get_claim("w-side")  # kept: its pod may use the GPU
    assert names.FINALIZER_CLAIM_PROTECTION in claim["metadata"]["finalizers"]
    world.delete_pod("w")
    settle(controller)
    assert _gone(world, "w-side")


def test_inline_claim_is_created_as_its_bind_leaves_it(world: World, default_class: str) -> None:
    """Issue 37: the controller makes an inline claim with its finalizer, its class and the name of
    the ElasticGPU it provisions for it, so the bind writes no spec: the claim's generation stays 1
    (a spec write, as the bind's patch of finalizer and elasticGPUName made, raises it to 2)."""
    controller = controller_for(world)
    pod = world.pod("gen-0", inline={"main": "gpu-core=20"})
    settle(controller)
    claim = world.get_claim("gen-0-main")
    expected = names.elastic_gpu_name_for_inline_claim(world.namespace, "gen-0-main", pod["metadata"]["uid"])
    assert claim["status"]["phase"] == "Bound", claim["status"]
    assert claim["metadata"]["generation"] == 1, claim["metadata"]
    assert claim["spec"]["elasticGPUName"] == expected
    assert claim["spec"]["elasticGPUClassName"] == f"{world.prefix}-default"
    assert claim["metadata"]["finalizers"] == [names.FINALIZER_CLAIM_PROTECTION]
    egpu = world.kube.get_elastic_gpu(expected)
    assert egpu["spec"]["claimRef"]["uid"] == claim["metadata"]["uid"]
    assert egpu["status"]["phase"] == "Bound"
    assert not _gated(world.get_pod("gen-0"))

    world.delete_pod("gen-0")
    settle(controller)
    assert _gone(world, "gen-0-main")
    with pytest.raises(errors.NotFound):
        world.kube.get_elastic_gpu(expected)


def test_inline_claim_binds_an_admins_available_elastic_gpu(world: World, default_class: str) -> None:
    """With an Available ElasticGPU of its class free, an inline claim is made unnamed and binds it,
    as a claim a user made would (a pre-named claim could not: spec.elasticGPUName is set once)."""
    controller = controller_for(world)
    static = f"{world.prefix}-static"
    world.egpu(o.share_egpu(static, f"gpu-{world.prefix}-0", cores=50, memory="20Gi",
                            class_name=f"{world.prefix}-default"))
    settle(controller)
    world.pod("st-0", inline={"main": "gpu-core=20"})
    settle(controller)
    claim = world.get_claim("st-0-main")
    assert claim["status"]["phase"] == "Bound", claim["status"]
    assert claim["spec"]["elasticGPUName"] == static
