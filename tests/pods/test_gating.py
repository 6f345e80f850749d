"""Gate lifting against the API server: a pod's claims Bound (Immediate) -> node affinity ANDed
into each of its terms and the gate removed in one update (passing the policies that mirror
kube-apiserver); the claim lists the pod as its user; a second pod waits with ClaimInUse; claims
on different nodes keep the pod gated with a Warning Event and the ClaimsReady condition."""

from __future__ import annotations

from typing import Any

from elasticgpu.api import names
from elasticgpu.controller.decisions import pod_gate
from tests.binding import objects as o
from tests.pods.claim_world import World, controller_for, kube, settle, world

__all__ = ["kube", "world"]  # fixtures


def _gpus(world: World, nodes: tuple[str, ...]) -> str:
    model = f"T{world.prefix}"
    for i, node in enumerate(nodes):
        world.node(node)
        world.gpu(o.gpu(f"gpu-{world.prefix}-{i}", node=node, model=model))
    class_name = f"{world.prefix}-now"
    world.klass(o.klass(class_name, parameters={"gpuModel": model}))
    return class_name


def _gates(pod: dict[str, Any]) -> list[str]:
    return [g["name"] for g in pod["spec"].get("schedulingGates") or []]


def test_bound_claim_lifts_the_gate_with_node_affinity_in_each_term(world: World) -> None:
    node = f"{world.prefix}-a"
    class_name = _gpus(world, (node,))
    world.claim(o.claim("c", class_name=class_name))
    controller = controller_for(world)
    settle(controller)
    assert world.get_claim("c")["status"]["phase"] == "Bound"
    terms = [{"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["z9"]}]},
             {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "Exists"}]}]
    pod = world.pod("p", claims={"main": "c", "side": "c"}, affinity_terms=terms)
    settle(controller)
    after = world.get_pod("p")
    assert _gates(after) == ["other.example/gate"]  # ours gone, the other kept
    required = after["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    pin = {"key": "metadata.name", "operator": "In", "values": [node]}
    assert required["nodeSelectorTerms"] == [{**term, "matchFields": [pin]} for term in terms]
    users = world.get_claim("c")["status"]["users"]
    assert users == [{"name": "p", "uid": pod["metadata"]["uid"]}]
    assert pod_gate.condition_of(after) is None  # the happy path writes no condition
    settle(controller)  # nothing more to do: the update is not repeated
    assert world.get_pod("p")["metadata"]["resourceVersion"] == after["metadata"]["resourceVersion"]


def test_pod_without_terms_gets_one(world: World) -> None:
    node = f"{world.prefix}-a"
    class_name = _gpus(world, (node,))
    world.claim(o.claim("c", class_name=class_name))
    world.pod("p", claims={"main": "c"})
    settle(controller_for(world))
    after = world.get_pod("p")
    required = after["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["nodeSelectorTerms"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
    assert names.SCHEDULING_GATE not in _gates(after)


def test_second_pod_waits_with_claim_in_use_until_the_first_is_gone(world: World) -> None:
    class_name = _gpus(world, (f"{world.prefix}-a",))
    world.claim(o.claim("c", class_name=class_name))
    controller = controller_for(world)
    world.pod("first", claims={"main": "c"})
    settle(controller)
    assert names.SCHEDULING_GATE not in _gates(world.get_pod("first"))
    second = world.pod("second", claims={"main": "c"})
    settle(controller)
    assert names.SCHEDULING_GATE in _gates(world.get_pod("second"))
    condition = world.claims_ready("second")
    assert condition is not None and condition["status"] == "False" and condition["reason"] == "ClaimInUse"
    assert "first" in condition["message"]
    assert world.events("ClaimInUse", name="second")
    assert world.get_claim("c")["status"]["users"][0]["name"] == "first"

    world.delete_pod("first")
    settle(controller)
    assert names.SCHEDULING_GATE not in _gates(world.get_pod("second"))
    assert world.get_claim("c")["status"]["users"] == [{"name": "second", "uid": second["metadata"]["uid"]}]
    condition = world.claims_ready("second")
    assert condition is not None and condition["status"] == "True"  # it was told why it waited: now it is told


def test_claims_on_different_nodes_keep_the_pod_gated(world: World) -> None:
    class_name = _gpus(world, (f"{world.prefix}-a", f"{world.prefix}-b"))
    # 80% each: one card cannot hold both, so they land on the two nodes
    world.claim(o.claim("x", cores=80, class_name=class_name))
    world.claim(o.claim("y", cores=80, class_name=class_name))
    controller = controller_for(world)
    settle(controller)
    nodes = {world.get_claim(n)["status"]["nodeName"] for n in ("x", "y")}
    assert len(nodes) == 2
    world.pod("p", claims={"main": "x", "side": "y"})
    settle(controller)
    assert names.SCHEDULING_GATE in _gates(world.get_pod("p"))
    condition = world.claims_ready("p")
    assert condition is not None and condition["reason"] == "FailedClaimPlacement"
    assert "different nodes" in condition["message"]
    events = world.events("FailedClaimPlacement", name="p")
    assert len(events) == 1 and events[0]["type"] == "Warning"
    settle(controller)
    assert len(world.events("FailedClaimPlacement", name="p")) == 1  # said once


def test_missing_claim_waits_then_binds(world: World) -> None:
    class_name = _gpus(world, (f"{world.prefix}-a",))
    controller = controller_for(world)
    world.pod("p", claims={"main": "later"})
    settle(controller)
    condition = world.claims_ready("p")
    assert condition is not None and condition["reason"] == "ClaimNotFound"
    world.claim(o.claim("later", class_name=class_name))
    settle(controller)
    assert names.SCHEDULING_GATE not in _gates(world.get_pod("p"))


def test_claim_in_use_by_a_gated_pod_keeps_its_finalizer(world: World) -> None:
    class_name = _gpus(world, (f"{world.prefix}-a",))
    world.claim(o.claim("c", class_name=class_name))
    controller = controller_for(world)
    world.pod("p", claims={"main": "c"})
    settle(controller)
    world.kube.delete_claim(world.namespace, "c")
    settle(controller)
    claim = world.get_claim("c")
    assert names.FINALIZER_CLAIM_PROTECTION in claim["metadata"]["finalizers"]
    world.delete_pod("p")
    settle(controller)
    try:
        world.get_claim("c")
    except Exception as err:  # NotFound
        assert "not" in str(err).lower()
    else:
        raise AssertionError("the claim outlived its pod")


def test_a_gone_pod_is_no_longer_listed_as_the_claims_user(world: World) -> None:
    class_name = _gpus(world, (f"{world.prefix}-a",))
    world.claim(o.claim("c", class_name=class_name))
    controller = controller_for(world)
    world.pod("p", claims={"main": "c"})
    settle(controller)
    assert [u["name"] for u in world.get_claim("c")["status"]["users"]] == ["p"]
    world.delete_pod("p")
    settle(controller)
    assert not world.get_claim("c")["status"].get("users")
    assert world.get_claim("c")["status"]["phase"] == "Bound"  # the claim itself stays bound for the next pod
