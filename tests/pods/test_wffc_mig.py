"""WaitForFirstConsumer for a `partitioning: MIG` class against the API server (issue 26): the
claim waits for its pod; the pod's placement plans each MIG claim as its Immediate bind would
(profile, card, start slot) among the MIG cards of the node it chooses for the pod, the pod's
earlier claims' instances counted, and commits the partition with the reservation; a node short
of CPU or of free slots is ruled out and named."""

from __future__ import annotations

from typing import Any

from tests.binding import objects as o
from tests.pods.claim_world import World, controller_for, kube, settle, world
from tests.pods.test_wffc import _pinned

__all__ = ["kube", "world"]  # fixtures


def _model(world: World) -> str:
    return f"NVIDIA A100-SXM4-80GB-{world.prefix}"  # unique per test, still an A100-80GB to the tables


def _mig_gpu(world: World, node: str, index: int = 0, *, mig: bool = True) -> str:
    name = f"gpu-{node}-{index}"
    body = o.gpu(name, node=node, index=index, model=_model(world), memory=81920)
    body["spec"]["mig"] = mig
    world.gpu(body)
    return name


def _mig_class(world: World) -> str:
    name = f"{world.prefix}-mig-wffc"
    body = o.klass(name, mode="WaitForFirstConsumer", parameters={"gpuModel": _model(world)})
    body["partitioning"] = "MIG"
    world.klass(body)
    return name


def _carve(world: World, node: str, claim: str, cores: int) -> None:
    """A bound MIG claim of an Immediate class pinned to `node` (an instance already there)."""
    name = f"{world.prefix}-mig-{node}"
    body = o.klass(name, parameters={"gpuModel": _model(world), "nodeSelector": f"kubernetes.io/hostname={node}"})
    body["partitioning"] = "MIG"
    world.klass(body)
    world.claim(o.claim(claim, cores=cores, memory="10Gi", class_name=name))


def _partitions(world: World, gpu: str) -> list[dict[str, Any]]:
    allocations = (world.kube.get_gpu(gpu).get("status") or {}).get("allocations") or []
    return sorted((a["partition"] for a in allocations), key=lambda p: p["start"])


def test_mig_claim_waits_for_its_pod_and_is_carved_where_the_pod_fits(world: World) -> None:
    a, b = world.node(f"{world.prefix}-a", cpu="1"), world.node(f"{world.prefix}-b", cpu="8")
    gpu_a, gpu_b = _mig_gpu(world, a), _mig_gpu(world, b)
    mig = _mig_class(world)
    world.claim(o.claim("three", cores=30, memory="10Gi", class_name=mig))
    controller = controller_for(world)
    settle(controller)
    waiting = world.get_claim("three")["status"]
    assert waiting["phase"] == "Pending", waiting  # no pod uses it yet
    assert _partitions(world, gpu_a) == _partitions(world, gpu_b) == []

    world.pod("p", claims={"main": "three"}, cpu="2")  # a has 1 CPU: only b fits
    settle(controller)
    claim = world.get_claim("three")["status"]
    assert claim["phase"] == "Bound", claim
    assert claim["nodeName"] == b
    # 30% -> 3g.40gb at slice 4: the card's only 4g start stays free, as for an Immediate class.
    assert claim["partition"] == {"profile": "3g.40gb", "cores": 42, "memory": 40960, "start": 4}
    assert _partitions(world, gpu_b) == [{"profile": "3g.40gb", "start": 4}]
    assert _partitions(world, gpu_a) == []
    assert _pinned(world, "p") == b


def test_two_mig_claims_of_a_pod_get_separate_slots_on_one_node(world: World) -> None:
    a, b = world.node(f"{world.prefix}-a"), world.node(f"{world.prefix}-b")
    # a's card holds a 4g already: one 3g still fits there (at 4), two do not.
    _mig_gpu(world, a)
    _carve(world, a, "four", 50)
    gpu_b = _mig_gpu(world, b)
    mig = _mig_class(world)
    world.claim(o.claim("x", cores=30, memory="10Gi", class_name=mig))
    world.claim(o.claim("y", cores=30, memory="10Gi", class_name=mig))
    controller = controller_for(world)
    settle(controller)
    assert world.get_claim("four")["status"]["partition"]["profile"] == "4g.40gb"
    world.pod("p", claims={"main": "x", "side": "y"})
    settle(controller)
    x, y = (world.get_claim(n)["status"] for n in ("x", "y"))
    assert x["phase"] == y["phase"] == "Bound", (x, y)
    assert x["nodeName"] == y["nodeName"] == b
    # The second was planned beside the first's instance (not yet on the GPU): no shared slice.
    assert {x["partition"]["start"], y["partition"]["start"]} == {0, 4}
    assert _partitions(world, gpu_b) == [{"profile": "3g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 4}]
    assert _pinned(world, "p") == b


def test_a_mig_claim_and_a_soft_claim_meet_on_one_node(world: World) -> None:
    a, b = world.node(f"{world.prefix}-a"), world.node(f"{world.prefix}-b")
    _mig_gpu(world, a)  # a has only a MIG card: the soft claim cannot go there
    gpu_b_mig, gpu_b_soft = _mig_gpu(world, b, 0), _mig_gpu(world, b, 1, mig=False)
    mig = _mig_class(world)
    soft = f"{world.prefix}-soft-wffc"
    world.klass(o.klass(soft, mode="WaitForFirstConsumer", parameters={"gpuModel": _model(world)}))
    controller = controller_for(world)
    world.pod("p", inline={"main": f"gpu-core=50,gpu-memory=20Gi,class={mig}",
                           "side": f"gpu-core=20,gpu-memory=1Gi,class={soft}"})
    settle(controller)
    main, side = (world.get_claim(n)["status"] for n in ("p-main", "p-side"))
    assert main["phase"] == side["phase"] == "Bound", (main, side)
    assert main["nodeName"] == side["nodeName"] == b
    assert main["partition"]["profile"] == "4g.40gb" and main["partition"]["start"] == 0
    assert "partition" not in side or side["partition"] is None
    assert _partitions(world, gpu_b_mig) == [{"profile": "4g.40gb", "start": 0}]
    soft_allocations = (world.kube.get_gpu(gpu_b_soft).get("status") or {}).get("allocations") or []
    assert [a.get("partition") for a in soft_allocations] == [None]


def test_no_free_slot_keeps_the_pod_gated_and_says_why(world: World) -> None:
    a = world.node(f"{world.prefix}-a")
    gpu = _mig_gpu(world, a)
    _carve(world, a, "three", 30)
    mig = _mig_class(world)
    controller = controller_for(world)
    settle(controller)
    world.pod("p", inline={"main": f"gpu-core=60,gpu-memory=10Gi,class={mig}"})  # 7g: the card is carved
    settle(controller)
    assert _pinned(world, "p") is None
    condition = world.claims_ready("p")
    assert condition is not None and condition["status"] == "False", condition
    assert condition["reason"] == "FailedClaimPlacement"
    assert "no MIG card has free slices" in condition["message"], condition["message"]
    assert world.get_claim("p-main")["status"]["phase"] == "Pending"
    assert _partitions(world, gpu) == [{"profile": "3g.40gb", "start": 4}]  # nothing carved
