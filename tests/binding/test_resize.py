"""Resizing a Bound claim in place (issue 17) against the API server: expand with and without
room, shrink blocked by use, shrink completed once the node applied the limit, the claim CRD's
rule on a class without allowClaimResize, whole cards, and two controller processes racing
random expands on one card."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from elasticgpu.api import names
from elasticgpu.controller import errors
from elasticgpu.controller.edge.kube import KubeApi
from tests.binding import objects as o
from tests.binding.conftest import Cluster, new_controller, settle, stop_watches
from tests.binding.processes import CardSampler, ControllerProcesses, wait_quiescent
from tests.binding.test_race import unguarded  # noqa: F401  (a fixture: the GPU CRD without its guard)

CORE, MEMORY = names.RESOURCE_CORE, names.RESOURCE_MEMORY


def _setup(cluster: Cluster, *, resize: bool = True, gpus: int = 1,
           provisioner: str = names.PROVISIONER_GPUSHARE) -> tuple[list[str], str]:
    model = f"T{cluster.prefix}"
    gpu_names = []
    for index in range(gpus):
        name = f"gpu-{cluster.prefix}-{index}"
        cluster.gpu(o.gpu(name, node=f"{cluster.prefix}-node", index=index, model=model))
        gpu_names.append(name)
    class_name = f"{cluster.prefix}-class"
    body = o.klass(class_name, provisioner=provisioner, parameters={"gpuModel": model})
    if resize:
        body["allowClaimResize"] = True
    cluster.klass(body)
    return gpu_names, class_name


def _allocation(kube: KubeApi, gpu_name: str, claim: dict[str, Any]) -> dict[str, Any]:
    egpu = names.elastic_gpu_name_for_claim(claim["metadata"]["uid"])
    allocations = (kube.get_gpu(gpu_name).get("status") or {}).get("allocations") or []
    [allocation] = [a for a in allocations if a["elasticGPU"] == egpu]
    return allocation


def _resize(cluster: Cluster, name: str, requests: dict[str, Any]) -> None:
    cluster.kube.patch_claim(cluster.namespace, name, {"spec": {"resources": {"requests": requests}}})


def _condition(claim: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in (claim.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)


def _reasons(kube: KubeApi, namespace: str) -> list[str]:
    return [e["reason"] for e in kube.list_events(namespace)]


def _agent_writes(kube: KubeApi, gpu_name: str, change: Callable[[dict[str, Any]], None]) -> None:
    """Write the GPU's status as the node agent would (re-read on a conflict)."""
    for _attempt in range(10):
        body = kube.get_gpu(gpu_name)
        body.setdefault("status", {})
        change(body["status"])
        try:
            kube.replace_gpu_status(body)
            return
        except errors.Conflict:
            continue
    raise AssertionError(f"GPU {gpu_name}: could not write its status as the agent")


def _running(claim: dict[str, Any], cores: int, memory: int) -> Callable[[dict[str, Any]], None]:
    def change(status: dict[str, Any]) -> None:
        status["runningClaims"] = [{"namespace": claim["metadata"]["namespace"], "name": claim["metadata"]["name"],
                                    "uid": claim["metadata"]["uid"], "pods": ["ns/p"],
                                    "applied": {"cores": cores, "memory": memory}}]
    return change


def test_expand_with_room_reserves_on_the_same_card(cluster: Cluster, kube: KubeApi) -> None:
    gpus, class_name = _setup(cluster, gpus=2)
    created = cluster.claim(o.claim("c", cores=30, memory="10Gi", class_name=class_name))
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    claim = cluster.get_claim("c")
    assert claim["status"]["resizable"] is True
    assert claim["status"]["allocatedResources"] == {CORE: 30, MEMORY: "10Gi"}
    [card] = [g for g in gpus if g.upper() in claim["status"]["gpus"]]

    _resize(cluster, "c", {CORE: 60, MEMORY: "20Gi"})
    settle(controller)

    claim = cluster.get_claim("c")
    assert claim["status"]["phase"] == "Bound"
    assert claim["status"]["capacity"] == {CORE: 60, MEMORY: "20Gi"}
    assert claim["status"]["allocatedResources"] == {CORE: 60, MEMORY: "20Gi"}
    assert claim["status"]["gpus"] == [card.upper()]
    allocation = _allocation(kube, card, created)
    assert (allocation["cores"], allocation["memory"], allocation.get("limit")) == (60, 20480, None)
    egpu = kube.get_elastic_gpu(names.elastic_gpu_name_for_claim(created["metadata"]["uid"]))
    assert egpu["status"]["capacity"] == {CORE: 60, MEMORY: "20Gi"}
    assert _condition(claim, "Resizing") is None
    assert "Resized" in _reasons(kube, cluster.namespace)


def test_expand_without_room_stays_at_its_size_then_expands_when_room_frees(cluster: Cluster, kube: KubeApi) -> None:
    [gpu], class_name = _setup(cluster)
    created = cluster.claim(o.claim("a", cores=30, memory="10Gi", class_name=class_name))
    cluster.claim(o.claim("b", cores=60, memory="10Gi", class_name=class_name))
    controller = new_controller(kube, cluster.namespace)
    settle(controller)

    _resize(cluster, "a", {CORE: 50, MEMORY: "10Gi"})
    settle(controller)
    claim = cluster.get_claim("a")
    assert claim["status"]["phase"] == "Bound"
    assert claim["status"]["capacity"] == {CORE: 30, MEMORY: "10Gi"}
    resizing = _condition(claim, "Resizing")
    assert resizing is not None and (resizing["status"], resizing["reason"]) == ("False", "NoRoomOnCard")
    assert "lacks 10% cores and 0 MiB" in resizing["message"], resizing["message"]
    assert _allocation(kube, gpu, created)["cores"] == 30
    assert "NoRoomOnCard" in _reasons(kube, cluster.namespace)

    kube.delete_claim(cluster.namespace, "b")  # room frees: the waiting expand goes through
    settle(controller)
    claim = cluster.get_claim("a")
    assert claim["status"]["capacity"] == {CORE: 50, MEMORY: "10Gi"}
    assert _condition(claim, "Resizing") is None
    assert _allocation(kube, gpu, created)["cores"] == 50


def test_shrink_is_blocked_while_the_claim_uses_more(cluster: Cluster, kube: KubeApi) -> None:
    [gpu], class_name = _setup(cluster)
    created = cluster.claim(o.claim("c", cores=50, memory="20Gi", class_name=class_name))
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    kube.patch_claim_status(cluster.namespace, "c", {"status": {"usage": {"memoryUsed": 15000, "coresUsed": 20}}})

    _resize(cluster, "c", {CORE: 30, MEMORY: "10Gi"})
    settle(controller)
    claim = cluster.get_claim("c")
    resizing = _condition(claim, "Resizing")
    assert resizing is not None and (resizing["status"], resizing["reason"]) == ("False", "ShrinkBlocked")
    assert "15000 MiB" in resizing["message"], resizing["message"]
    allocation = _allocation(kube, gpu, created)
    assert (allocation["cores"], allocation["memory"], allocation.get("limit")) == (50, 20480, None)
    assert claim["status"]["capacity"] == {CORE: 50, MEMORY: "20Gi"}


def test_shrink_completes_after_the_node_applied_the_limit(cluster: Cluster, kube: KubeApi) -> None:
    [gpu], class_name = _setup(cluster)
    created = cluster.claim(o.claim("c", cores=50, memory="20Gi", class_name=class_name))
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    claim = cluster.get_claim("c")
    _agent_writes(kube, gpu, _running(claim, 50, 20480))  # its containers run with the old limit
    settle(controller)

    _resize(cluster, "c", {CORE: 30, MEMORY: "10Gi"})
    settle(controller)
    allocation = _allocation(kube, gpu, created)
    # The limit first; the reservation stays until the node says it applied the limit.
    assert (allocation["cores"], allocation["memory"]) == (50, 20480)
    assert allocation["limit"] == {"cores": 30, "memory": 10240}
    claim = cluster.get_claim("c")
    pending = _condition(claim, "ResizePending")
    assert pending is not None and pending["status"] == "True", claim["status"]
    assert claim["status"]["allocatedResources"] == {CORE: 50, MEMORY: "20Gi"}

    _agent_writes(kube, gpu, _running(claim, 30, 10240))  # the agent applied it
    settle(controller)
    allocation = _allocation(kube, gpu, created)
    assert (allocation["cores"], allocation["memory"], allocation.get("limit")) == (30, 10240, None)
    claim = cluster.get_claim("c")
    assert claim["status"]["capacity"] == {CORE: 30, MEMORY: "10Gi"}
    assert claim["status"]["allocatedResources"] == {CORE: 30, MEMORY: "10Gi"}
    assert _condition(claim, "ResizePending") is None
    assert _condition(claim, "Resizing") is None


def test_requests_are_immutable_on_a_class_without_allow_claim_resize(cluster: Cluster, kube: KubeApi) -> None:
    _gpus, class_name = _setup(cluster, resize=False)
    cluster.claim(o.claim("c", cores=30, memory="10Gi", class_name=class_name))
    settle(new_controller(kube, cluster.namespace))
    claim = cluster.get_claim("c")
    assert claim["status"]["phase"] == "Bound" and not claim["status"].get("resizable")
    with pytest.raises(errors.Rejected) as refused:
        _resize(cluster, "c", {CORE: 40, MEMORY: "10Gi"})
    assert "allowClaimResize" in str(refused.value) and "spec.resources.requests" in str(refused.value)
    assert cluster.get_claim("c")["spec"]["resources"]["requests"][CORE] == 30


def test_limits_stay_immutable_on_a_resizable_claim(cluster: Cluster, kube: KubeApi) -> None:
    _gpus, class_name = _setup(cluster)
    body = o.claim("c", cores=30, memory="10Gi", class_name=class_name)
    body["spec"]["resources"]["limits"] = {CORE: 40}
    cluster.claim(body)
    settle(new_controller(kube, cluster.namespace))
    with pytest.raises(errors.Rejected) as refused:
        kube.patch_claim(cluster.namespace, "c", {"spec": {"resources": {"limits": {CORE: 50}}}})
    assert "spec.resources.limits" in str(refused.value)


def test_whole_cards_cannot_change_in_number(cluster: Cluster, kube: KubeApi) -> None:
    gpus, class_name = _setup(cluster, gpus=2, provisioner=names.PROVISIONER_PHYSICAL)
    cluster.claim(o.claim("c", cards=1, class_name=class_name))
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    assert cluster.get_claim("c")["status"]["phase"] == "Bound"

    cluster.kube.patch_claim(cluster.namespace, "c", {"spec": {"resources": {"requests": {
        names.RESOURCE_NVIDIA_GPU: 2}}}})
    settle(controller)
    claim = cluster.get_claim("c")
    resizing = _condition(claim, "Resizing")
    assert resizing is not None and resizing["reason"] == "WholeCardResize"
    assert "create a new claim" in resizing["message"]
    held = [g for g in gpus if (kube.get_gpu(g).get("status") or {}).get("allocations")]
    assert len(held) == 1 and claim["status"]["capacity"][names.RESOURCE_NVIDIA_GPU] == 1


CLAIMS = 6
ROUNDS = 30


@pytest.mark.usefixtures("unguarded")
def test_two_controllers_racing_random_resizes_never_oversubscribe(cluster: Cluster, kube: KubeApi, kube_cluster: Any,
                                                                    tmp_path: Path) -> None:
    """Rounds of random resizes of every claim at once (their sum well over the card), with the
    GPU CRD's allocation guard removed: only the resourceVersion precondition of each resize
    keeps the card from oversubscription. A reader samples the card all along: never over."""
    [gpu], class_name = _setup(cluster)
    for i in range(CLAIMS):
        cluster.claim(o.claim(f"c{i}", cores=10, memory="4Gi", class_name=class_name))
    procs = ControllerProcesses(kube_cluster.kubeconfig, cluster.namespace, tmp_path)
    procs.flags += ["--log-level", "info"]
    sampler = CardSampler(kube, gpu)
    try:
        procs.start()
        procs.start()
        wait_quiescent(kube, cluster.namespace, quiet_s=2.0, deadline_s=120, procs=procs,
                       done=lambda cs: all((c.get("status") or {}).get("phase") == "Bound" for c in cs))
        sampler.start()
        rng = random.Random(17)
        for _round in range(ROUNDS):
            # at most 90 cores: 100 is one whole card, which a share cannot become
            targets = {f"c{i}": (rng.randrange(5, 45), rng.randrange(2, 24)) for i in range(CLAIMS)}
            threads = [threading.Thread(target=_resize, args=(cluster, name, {CORE: cores, MEMORY: f"{gib}Gi"}))
                       for name, (cores, gib) in targets.items()]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=30)
            time.sleep(rng.uniform(0.05, 0.4))
        claims = wait_quiescent(kube, cluster.namespace, quiet_s=3.0, deadline_s=180, procs=procs)
        allocations = (kube.get_gpu(gpu).get("status") or {}).get("allocations") or []
        memory = kube.get_gpu(gpu)["spec"]["memory"]
        assert sum(a["cores"] for a in allocations) <= 100, allocations
        assert sum(a["memory"] for a in allocations) <= memory, allocations
        by_egpu = {a["elasticGPU"]: a for a in allocations}
        for claim in claims:
            allocation = by_egpu[names.elastic_gpu_name_for_claim(claim["metadata"]["uid"])]
            requests = claim["spec"]["resources"]["requests"]
            want = (int(requests[CORE]), int(str(requests[MEMORY]).removesuffix("Gi")) * 1024)
            held = (allocation["cores"], allocation["memory"])
            # The statuses show what is reserved, whichever controller reserved it.
            assert claim["status"]["capacity"] == claim["status"]["allocatedResources"], claim["status"]
            assert int(claim["status"]["capacity"][CORE]) == held[0], f"{claim}\n{allocation}\n{procs.logs(400)}"
            if held != want:
                # Not all fit: a claim that did not get its size says why, at its reserved size.
                resizing = _condition(claim, "Resizing")
                assert resizing is not None and resizing["reason"] == "NoRoomOnCard", (claim["status"], allocation)
        grown = [a for a in allocations if (a["cores"], a["memory"]) != (10, 4096)]
        assert grown, f"no resize went through: {allocations}\n{procs.logs()}"
        sampler.stop()
        sampler.assert_never_over(kube.get_gpu(gpu)["spec"]["memory"])
    finally:
        sampler.stop()
        procs.close()


def test_crash_after_the_gpu_write_is_repaired_by_a_fresh_controller(cluster: Cluster, kube: KubeApi) -> None:
    """Crash row: the GPU holds the new size (the commit point), the ElasticGPU's and the claim's
    statuses still say the old one. A fresh controller finishes from what the GPU holds, with no
    second GPU write."""
    [gpu], class_name = _setup(cluster)
    created = cluster.claim(o.claim("c", cores=30, memory="10Gi", class_name=class_name))
    settle(new_controller(kube, cluster.namespace))
    stop_watches()  # the first controller is gone
    _resize(cluster, "c", {CORE: 50, MEMORY: "20Gi"})
    egpu = names.elastic_gpu_name_for_claim(created["metadata"]["uid"])

    def crashed_write(status: dict[str, Any]) -> None:
        for allocation in status["allocations"]:
            if allocation["elasticGPU"] == egpu:
                allocation.update(cores=50, memory=20480)
    _agent_writes(kube, gpu, crashed_write)
    version = kube.get_gpu(gpu)["metadata"]["resourceVersion"]

    settle(new_controller(kube, cluster.namespace))
    claim = cluster.get_claim("c")
    assert claim["status"]["capacity"] == {CORE: 50, MEMORY: "20Gi"}
    assert claim["status"]["allocatedResources"] == {CORE: 50, MEMORY: "20Gi"}
    assert kube.get_elastic_gpu(egpu)["status"]["capacity"] == {CORE: 50, MEMORY: "20Gi"}
    assert kube.get_gpu(gpu)["metadata"]["resourceVersion"] == version, "the GPU was written again"


@pytest.mark.usefixtures("unguarded")
def test_an_expand_decided_on_a_card_that_changes_before_its_write_is_decided_again(cluster: Cluster,
                                                                                  kube: KubeApi) -> None:
    """The race the two-controller test found once in CI (a card read at 108 cores): this
    controller decides an expand, and before its GPU write another controller's expand of the
    card's other claim lands in its picture. The write carries the picture's newest
    resourceVersion, so the server takes it: only the controller can see that the card's room
    went meanwhile. It decides again, on the card as it now is, and waits for room."""
    [gpu], class_name = _setup(cluster)
    a = cluster.claim(o.claim("a", cores=10, memory="4Gi", class_name=class_name))
    b = cluster.claim(o.claim("b", cores=10, memory="4Gi", class_name=class_name))
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    resizer = controller.claims.resizer
    decide_then_charge = resizer._charge
    raced: list[int] = []

    def another_controller_expands_b_first(*args: Any, **kwargs: Any) -> bool:
        if not raced:
            # As the other controller would: b's user asks for 60%, the other controller grows b
            # on the card, and this controller's watch brings both into its picture before its own
            # write of a.
            raced.append(1)
            _resize(cluster, "b", {CORE: 60, MEMORY: "4Gi"})
            controller.picture.put_claim(kube.get_claim(cluster.namespace, "b"))
            def grow_b(status: dict[str, Any]) -> None:
                key = names.elastic_gpu_name_for_claim(b["metadata"]["uid"])
                for allocation in status["allocations"]:
                    if allocation["elasticGPU"] == key:
                        allocation["cores"] = 60
            _agent_writes(kube, gpu, grow_b)
            controller.picture.gpu_written(kube.get_gpu(gpu))
        return decide_then_charge(*args, **kwargs)

    resizer._charge = another_controller_expands_b_first  # type: ignore[method-assign]
    _resize(cluster, "a", {CORE: 80, MEMORY: "4Gi"})
    settle(controller)

    assert raced, "the expand of a never reached its charge: the test did not race"
    allocations = (kube.get_gpu(gpu).get("status") or {}).get("allocations") or []
    assert sum(x["cores"] for x in allocations) <= 100, allocations
    assert _allocation(kube, gpu, a)["cores"] == 10
    resizing = _condition(cluster.get_claim("a"), "Resizing")
    assert resizing is not None and resizing["reason"] == "NoRoomOnCard", cluster.get_claim("a")["status"]
