"""WaitForFirstConsumer against the API server: a pod's claims wait until the pod comes, then one
node is chosen that fits all of them and the pod's CPU and memory (allocatable minus the pods on
it, and the pods already pinned there), respecting taints; all claims bind there or none; when
nothing fits the pod stays gated with a Warning Event FailedClaimPlacement and ClaimsReady=False
naming each node and why."""

from __future__ import annotations

from typing import Any

import pytest

from elasticgpu.api import names
from elasticgpu.controller import errors
from elasticgpu.controller.decisions import pod_gate
from tests.binding import objects as o
from tests.pods.claim_world import World, controller_for, kube, settle, world

__all__ = ["kube", "world"]  # fixtures


def _wffc_class(world: World, policy: str = "binpack") -> str:
    name = f"{world.prefix}-wffc"
    world.klass(o.klass(name, mode="WaitForFirstConsumer",
                        parameters={"gpuModel": f"T{world.prefix}", "policy": policy}))
    return name


def _gpu(world: World, node: str, index: int = 0) -> str:
    name = f"gpu-{node}-{index}"
    world.gpu(o.gpu(name, node=node, index=index, model=f"T{world.prefix}"))
    return name


def _allocations(world: World, gpu: str) -> list[dict[str, Any]]:
    return list((world.kube.get_gpu(gpu).get("status") or {}).get("allocations") or [])


def _pinned(world: World, pod: str) -> str | None:
    body = world.get_pod(pod)
    if any(g["name"] == names.SCHEDULING_GATE for g in body["spec"].get("schedulingGates") or []):
        return None
    terms = body["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return str(terms["nodeSelectorTerms"][0]["matchFields"][-1]["values"][0])


def test_claim_waits_for_its_pod_and_binds_where_the_pod_fits(world: World) -> None:
    a, b = world.node(f"{world.prefix}-a", cpu="1"), world.node(f"{world.prefix}-b", cpu="8")
    _gpu(world, a)
    _gpu(world, b)
    wffc = _wffc_class(world)
    # A filler on a's card: binpack prefers the fuller card, so a is the allocator's first choice.
    fill = f"{world.prefix}-fill"
    world.klass(o.klass(fill, parameters={"gpuModel": f"T{world.prefix}",
                                          "nodeSelector": f"kubernetes.io/hostname={a}"}))
    world.claim(o.claim("filler", cores=30, memory="1Gi", class_name=fill))
    world.claim(o.claim("early", cores=20, memory="1Gi", class_name=wffc))
    controller = controller_for(world)
    settle(controller)
    assert world.get_claim("filler")["status"]["nodeName"] == a
    early = world.get_claim("early")["status"]
    assert early["phase"] == "Pending"  # no pod uses it yet
    assert early["conditions"][0]["reason"] in ("WaitForFirstConsumer", "WaitingForFirstConsumer")

    world.pod("small", claims={"main": "early"}, cpu="500m")
    settle(controller)
    assert world.get_claim("early")["status"]["nodeName"] == a  # the allocator's choice, and it fits
    assert _pinned(world, "small") == a

    # 2 CPUs: a has 0.5 left (the pod pinned there counts before the scheduler binds it)
    world.pod("big", inline={"main": f"gpu-core=20,gpu-memory=1Gi,class={wffc}"}, cpu="2")
    settle(controller)
    assert world.get_claim("big-main")["status"]["nodeName"] == b
    assert _pinned(world, "big") == b


def test_nothing_fits_keeps_the_pod_gated_and_says_why(world: World) -> None:
    a = world.node(f"{world.prefix}-a", cpu="2")
    b = world.node(f"{world.prefix}-b", cpu="8", taints=[{"key": "gpu", "value": "reserved", "effect": "NoSchedule"}])
    gpus = [_gpu(world, a), _gpu(world, b)]
    wffc = _wffc_class(world)
    world.pod("busy", cpu="1500m", node_name=a, containers=("main",))  # not ours: found by its nodeName
    controller = controller_for(world)
    world.pod("p", inline={"main": f"gpu-core=20,gpu-memory=1Gi,class={wffc}"}, cpu="1")
    settle(controller)
    condition = world.claims_ready("p")
    assert condition is not None and condition["status"] == "False"
    assert condition["reason"] == "FailedClaimPlacement"
    assert f"{a} has too little room for the pod: 0.5 CPU free, the pod requests 1" in condition["message"]
    assert f"{b} has the taint gpu=reserved:NoSchedule" in condition["message"]
    events = world.events("FailedClaimPlacement", name="p")
    assert [e["type"] for e in events] == ["Warning"] and events[0]["message"] == condition["message"]
    claim = world.get_claim("p-main")["status"]
    assert claim["phase"] == "Pending"
    # The claim says its pod came and could not be placed, not "waiting for a pod".
    assert claim["reason"] == "FailedClaimPlacement", claim
    assert "pod p uses this claim" in claim["message"] and f"{b} has the taint" in claim["message"], claim
    assert all(_allocations(world, g) == [] for g in gpus)  # nothing reserved

    # Tolerations may be added to a pod (kube-apiserver allows it): now b fits.
    world.core.patch_namespaced_pod("p", world.namespace, {"spec": {"tolerations": [
        {"key": "gpu", "operator": "Equal", "value": "reserved", "effect": "NoSchedule"}]}})
    settle(controller)
    assert _pinned(world, "p") == b
    assert world.get_claim("p-main")["status"]["phase"] == "Bound"


def test_all_claims_of_a_pod_go_to_one_node(world: World) -> None:
    a, b = world.node(f"{world.prefix}-a"), world.node(f"{world.prefix}-b")
    _gpu(world, a, 0)
    _gpu(world, a, 1)
    _gpu(world, b, 0)
    wffc = _wffc_class(world, policy="spread")
    world.claim(o.claim("x", cores=60, memory="1Gi", class_name=wffc))
    world.claim(o.claim("y", cores=60, memory="1Gi", class_name=wffc))
    controller = controller_for(world)
    world.pod("p", claims={"main": "x", "side": "y"})
    settle(controller)
    x, y = (world.get_claim(n)["status"] for n in ("x", "y"))
    assert x["phase"] == y["phase"] == "Bound"
    assert x["nodeName"] == y["nodeName"] == a  # b has one card: it cannot take both
    assert x["gpus"] != y["gpus"]
    pod = world.get_pod("p")
    assert pod["metadata"]["annotations"][names.ANNOTATION_SELECTED_NODE] == a
    assert _pinned(world, "p") == a


def test_all_or_nothing_when_no_node_takes_every_claim(world: World) -> None:
    a, b = world.node(f"{world.prefix}-a"), world.node(f"{world.prefix}-b")
    gpus = [_gpu(world, a), _gpu(world, b)]
    wffc = _wffc_class(world)
    world.claim(o.claim("x", cores=80, memory="1Gi", class_name=wffc))
    world.claim(o.claim("y", cores=80, memory="1Gi", class_name=wffc))
    controller = controller_for(world)
    world.pod("p", claims={"main": "x", "side": "y"})
    settle(controller)
    assert _pinned(world, "p") is None
    condition = world.claims_ready("p")
    assert condition is not None and condition["reason"] == "FailedClaimPlacement"
    assert "cannot take claim" in condition["message"]
    assert all(_allocations(world, g) == [] for g in gpus)
    assert {world.get_claim(n)["status"]["phase"] for n in ("x", "y")} == {"Pending"}


def test_a_bound_claim_fixes_the_node_of_the_others(world: World) -> None:
    a, b = world.node(f"{world.prefix}-a"), world.node(f"{world.prefix}-b")
    _gpu(world, a)
    _gpu(world, b)
    now = f"{world.prefix}-now"
    world.klass(o.klass(now, parameters={"gpuModel": f"T{world.prefix}",
                                         "nodeSelector": f"kubernetes.io/hostname={b}"}))
    wffc = _wffc_class(world)
    world.claim(o.claim("fixed", cores=30, memory="1Gi", class_name=now))
    world.claim(o.claim("later", cores=30, memory="1Gi", class_name=wffc))
    controller = controller_for(world)
    world.pod("p", claims={"main": "fixed", "side": "later"})
    settle(controller)
    assert world.get_claim("fixed")["status"]["nodeName"] == b
    assert world.get_claim("later")["status"]["nodeName"] == b
    assert _pinned(world, "p") == b


def test_an_existing_elastic_gpu_fixes_the_node(world: World) -> None:
    a, b = world.node(f"{world.prefix}-a"), world.node(f"{world.prefix}-b")
    _gpu(world, a)
    on_b = _gpu(world, b)
    wffc = _wffc_class(world)
    world.egpu(o.share_egpu(f"{world.prefix}-static", on_b, cores=50, memory="2Gi", class_name=wffc))
    world.claim(o.claim("mine", cores=40, memory="1Gi", class_name=wffc))
    world.claim(o.claim("more", cores=20, memory="1Gi", class_name=wffc))
    controller = controller_for(world)
    settle(controller)  # "mine" waits for its pod (as a PVC does) where the binder delays static binds too
    world.pod("p", claims={"main": "mine", "side": "more"})
    settle(controller)
    mine, more = world.get_claim("mine"), world.get_claim("more")
    assert mine["spec"]["elasticGPUName"] == f"{world.prefix}-static"
    assert mine["status"]["nodeName"] == more["status"]["nodeName"] == b
    assert _pinned(world, "p") == b


def test_crash_after_the_reservation_is_finished_on_its_node(world: World) -> None:
    """Crash row: the reservation of a pod's WaitForFirstConsumer claim was committed (on b),
    then the controller died before the ElasticGPU was made. The next controller finds it held
    and binds there, though its allocator prefers a."""
    a, b = world.node(f"{world.prefix}-a"), world.node(f"{world.prefix}-b")
    _gpu(world, a)
    on_b = _gpu(world, b)
    wffc = _wffc_class(world)
    fill = f"{world.prefix}-fill"  # a's card fuller: binpack's first choice
    world.klass(o.klass(fill, parameters={"gpuModel": f"T{world.prefix}",
                                          "nodeSelector": f"kubernetes.io/hostname={a}"}))
    world.claim(o.claim("filler", cores=30, memory="1Gi", class_name=fill))
    claim = world.claim(o.claim("x", cores=20, memory="1Gi", class_name=wffc))
    egpu = names.elastic_gpu_name_for_claim(claim["metadata"]["uid"])
    gpu = world.kube.get_gpu(on_b)
    gpu["status"] = {"allocations": [{"elasticGPU": egpu, "cores": 20, "memory": 1024, "claimRef": {
        "namespace": world.namespace, "name": "x", "uid": claim["metadata"]["uid"]}}]}
    world.kube.replace_gpu_status(gpu)
    world.pod("p", claims={"main": "x"})
    settle(controller_for(world))
    assert world.get_claim("x")["status"]["nodeName"] == b
    assert world.get_claim("x")["spec"]["elasticGPUName"] == egpu
    assert [a_["elasticGPU"] for a_ in _allocations(world, on_b)] == [egpu]  # no second reservation
    assert _pinned(world, "p") == b


def test_replicas_that_must_not_share_a_node_are_placed_on_different_nodes(world: World) -> None:
    """Two replicas with a required anti-affinity on kubernetes.io/hostname: binpack alone would
    pin both to the fuller card's node, where the scheduler refuses the second for good."""
    a, b = world.node(f"{world.prefix}-a"), world.node(f"{world.prefix}-b")
    _gpu(world, a)
    _gpu(world, b)
    wffc = _wffc_class(world)
    web = {"app": f"{world.prefix}-web"}
    apart = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": web}, "topologyKey": "kubernetes.io/hostname"}]}}
    controller = controller_for(world)
    request = f"gpu-core=20,gpu-memory=1Gi,class={wffc}"
    world.pod("web-1", inline={"main": request}, labels=web, pod_affinity=apart)
    settle(controller)
    first = _pinned(world, "web-1")
    world.pod("web-2", inline={"main": request}, labels=web, pod_affinity=apart)
    settle(controller)
    second = _pinned(world, "web-2")
    assert {first, second} == {a, b}
    assert world.get_claim("web-2-main")["status"]["nodeName"] == second

    # A third has nowhere to go: it stays gated and says which pod is in the way on each node.
    world.pod("web-3", inline={"main": request}, labels=web, pod_affinity=apart)
    settle(controller)
    assert _pinned(world, "web-3") is None
    conditions = world.get_pod("web-3")["status"]["conditions"]
    condition = next(c for c in conditions if c["type"] == pod_gate.CONDITION_CLAIMS_READY)
    assert condition["status"] == "False"
    assert f"{world.namespace}/web-1" in condition["message"] and f"{world.namespace}/web-2" in condition["message"]


def test_a_host_port_taken_on_a_node_rules_it_out(world: World) -> None:
    a, b = world.node(f"{world.prefix}-a"), world.node(f"{world.prefix}-b")
    _gpu(world, a)
    _gpu(world, b)
    wffc = _wffc_class(world)
    world.pod("exporter", node_name=a, containers=("main",), host_port=9400)  # not ours: found by its nodeName
    world.claim(o.claim("filler", cores=30, memory="1Gi", class_name=_fill_class(world, a)))
    controller = controller_for(world)
    settle(controller)
    assert world.get_claim("filler")["status"]["nodeName"] == a  # a is binpack's first choice now
    world.pod("p", inline={"main": f"gpu-core=20,gpu-memory=1Gi,class={wffc}"}, host_port=9400)
    settle(controller)
    assert _pinned(world, "p") == b


def _fill_class(world: World, node: str) -> str:
    name = f"{world.prefix}-fill"
    world.klass(o.klass(name, parameters={"gpuModel": f"T{world.prefix}",
                                          "nodeSelector": f"kubernetes.io/hostname={node}"}))
    return name


def test_upstream_class_with_egpu_binding_mode_alone_waits_for_its_pod(world: World) -> None:
    # Issue 15: an upstream elastic-gpu class says only egpuBindingMode. It was refused by the CRD
    # (bindingMode's schema default disagreed with it); now it is accepted and its claims wait.
    a = world.node(f"{world.prefix}-a")
    _gpu(world, a)
    name = f"{world.prefix}-upstream"
    body = o.klass(name, parameters={"gpuModel": f"T{world.prefix}"})
    body["egpuBindingMode"] = "WaitForFirstConsumer"
    stored = world.klass(body)  # refused (422) while bindingMode had a schema default
    assert "bindingMode" not in stored  # nothing defaulted it to Immediate
    world.claim(o.claim("upstream", cores=20, memory="1Gi", class_name=name))
    controller = controller_for(world)
    settle(controller)
    waiting = world.get_claim("upstream")["status"]
    assert waiting["phase"] == "Pending"  # no pod uses it yet
    assert waiting["conditions"][0]["reason"] in ("WaitForFirstConsumer", "WaitingForFirstConsumer")

    world.pod("consumer", claims={"main": "upstream"})
    settle(controller)
    bound = world.get_claim("upstream")["status"]
    assert bound["phase"] == "Bound" and bound["nodeName"] == a
    assert _pinned(world, "consumer") == a


def test_a_node_a_gated_pod_names_for_itself_keeps_no_other_pod_off_it(world: World) -> None:
    """Issue 44 item 6: a tenant's gated pod that never runs (its claim does not exist), annotated
    `elasticgpu.io/selected-node: <node>` by its author with a required anti-affinity that matches every
    pod, counted as a pod on that node, and kept every other pod's WaitForFirstConsumer claims off it. Only a
    node the controller itself placed a pod on (its claims reserved there) or the scheduler bound it to
    counts."""
    a = world.node(f"{world.prefix}-a")
    _gpu(world, a)
    wffc = _wffc_class(world)
    everyone = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchExpressions": [{"key": f"{world.prefix}-none", "operator": "DoesNotExist"}]},
         "topologyKey": "kubernetes.io/hostname"}]}}
    world.pod("phantom", claims={"main": "does-not-exist"}, pod_affinity=everyone,
              annotations={names.ANNOTATION_SELECTED_NODE: a})
    controller = controller_for(world)
    settle(controller)
    assert pod_gate.is_gated(world.get_pod("phantom")), "the phantom never runs"
    world.pod("worker", inline={"main": f"gpu-core=20,gpu-memory=1Gi,class={wffc}"})
    settle(controller)
    assert _pinned(world, "worker") == a, world.claims_ready("worker")
    assert world.get_claim("worker-main")["status"]["nodeName"] == a


def test_two_controllers_reserved_on_two_nodes_and_one_elastic_gpu_exists(world: World) -> None:
    """The interleaving of test_pod_race's flake, step by step. Controller B reserved the pod's
    claim x on a and y on b (before the node was agreed) and already made x's ElasticGPU;
    controller A's picture holds both reservations but not that ElasticGPU yet. A must free only
    y's reservation (its ElasticGPU does not exist) and keep x's: freeing that one would leave
    x's ElasticGPU without its reservation (Lost). Then y is placed on a, beside x."""
    a, b = world.node(f"{world.prefix}-a"), world.node(f"{world.prefix}-b")
    on_a, on_b = _gpu(world, a), _gpu(world, b)
    wffc = _wffc_class(world)
    claims = {name: world.claim(o.claim(name, cores=40, memory="1Gi", class_name=wffc)) for name in ("x", "y")}
    egpus = {name: names.elastic_gpu_name_for_claim(c["metadata"]["uid"]) for name, c in claims.items()}
    refs = {name: {"apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM, "namespace": world.namespace,
                   "name": name, "uid": c["metadata"]["uid"]} for name, c in claims.items()}
    for name, gpu_name in (("x", on_a), ("y", on_b)):  # B's reservations, on two nodes
        gpu = world.kube.get_gpu(gpu_name)
        gpu["status"] = {"allocations": [{"elasticGPU": egpus[name], "cores": 40, "memory": 1024,
                                          "claimRef": refs[name]}]}
        world.kube.replace_gpu_status(gpu)
    world.pod("p", claims={"main": "x", "side": "y"})
    controller = controller_for(world)
    controller.rebuild()  # A's picture: both reservations, no ElasticGPU
    world.egpu({  # B's bind of x goes on: its ElasticGPU, as build_elastic_gpu makes it
        "apiVersion": names.API_VERSION, "kind": names.KIND_ELASTIC_GPU,
        "metadata": {"name": egpus["x"], "finalizers": [names.FINALIZER_EGPU_PROTECTION]},
        "spec": {"capacity": {names.RESOURCE_CORE: 40, names.RESOURCE_MEMORY: "1Gi"}, "claimRef": refs["x"],
                 "nodeName": a, "elasticGPUClassName": wffc, "reclaimPolicy": "Delete",
                 "gpuShare": {"gpuName": on_a}}})
    with pytest.raises(errors.BindingError, match="placing again"):
        controller.pods.sync(world.namespace, "p")
    assert [a_["elasticGPU"] for a_ in _allocations(world, on_a)] == [egpus["x"]], "x's reservation was freed"
    assert _allocations(world, on_b) == []
    settle(controller)
    x, y = world.get_claim("x"), world.get_claim("y")
    assert (x["status"]["phase"], y["status"]["phase"]) == ("Bound", "Bound")
    assert x["status"]["nodeName"] == y["status"]["nodeName"] == a
    assert _pinned(world, "p") == a
