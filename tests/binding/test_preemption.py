"""Priority and preemption against the API server (issue 27 item 2, docs/preemption.md).

One card, filled by claims of a low-priority class; a claim of a higher-priority class that fits
nowhere preempts the cheapest victims on the card: they are marked (status.preemptedBy, condition Preempted,
Event PreemptedBy), their pods evicted (the test server has no eviction subresource: plainly deleted),
their ElasticGPUs fail (reason Preempted, claims Lost), the room is freed once the agent no longer
reports them running, and the preemptor binds. Rows where nothing may be preempted: equal priority,
preemptionPolicy Never, a claim that would still not fit, a quota that would still refuse it. Crash
and HA rows: a plan left by a controller that died is carried out by a fresh one; two controllers
working at once preempt once and never oversubscribe.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from elasticgpu.api import ElasticGPUClaim, names
from elasticgpu.controller import errors
from elasticgpu.controller.decisions import preemption
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.metrics import ControllerMetrics
from tests.binding import objects as o
from tests.binding.agent_status import write_gpu_status
from tests.binding.conftest import Cluster, new_controller, settle
from tests.faults.proxy import FaultPlan, fault_proxy
from tests.pods.claim_world import World, world  # noqa: F401  # the fixture, re-exported for pytest
from tests.pods.conftest import pod_update_policies  # noqa: F401  # the world fixture's own
from tests.quota import quotas


def _setup(cluster: Cluster, **priorities: Any) -> str:
    """One 80 GiB card of a model of this test's own; a class per keyword (name -> priority, or
    (priority, preemptionPolicy)); returns the GPU's name."""
    model = f"T{cluster.prefix}"
    gpu_name = f"gpu-{cluster.prefix}-0"
    cluster.gpu(o.gpu(gpu_name, node=f"{cluster.prefix}-node", model=model))
    for name, value in priorities.items():
        body = o.klass(f"{cluster.prefix}-{name}", parameters={"gpuModel": model})
        priority, policy = value if isinstance(value, tuple) else (value, None)
        if priority is not None:
            body["priority"] = priority
        if policy:
            body["preemptionPolicy"] = policy
        cluster.klass(body)
    return gpu_name


def _claim(cluster: Cluster, name: str, klass: str, cores: int) -> dict[str, Any]:
    return cluster.claim(o.claim(name, cores=cores, memory=None, class_name=f"{cluster.prefix}-{klass}"))


def _status(cluster: Cluster, name: str) -> dict[str, Any]:
    return cluster.get_claim(name).get("status") or {}


def _allocations(kube: KubeApi, gpu_name: str) -> list[str]:
    return sorted(a["elasticGPU"] for a in (kube.get_gpu(gpu_name).get("status") or {}).get("allocations") or [])


def _events(kube: KubeApi, namespace: str, reason: str, name: str) -> list[dict[str, Any]]:
    return [e for e in kube.list_events(namespace)
            if e.get("reason") == reason and (e.get("involvedObject") or {}).get("name") == name]


def _assert_preempted(cluster: Cluster, kube: KubeApi, victim: str, egpu_name: str, by: str, *,
                      event: bool = True) -> None:
    body = cluster.get_claim(victim)
    status = body["status"]
    assert status["preemptedBy"] == f"{cluster.namespace}/{by}"
    assert status["phase"] == "Lost", status
    condition = next(c for c in status["conditions"] if c["type"] == preemption.CONDITION_PREEMPTED)
    assert condition["reason"] == preemption.REASON_PREEMPTED_BY and f"{cluster.namespace}/{by}" in condition["message"]
    if event:  # an Event is a courtesy: one a controller died before writing is not written again
        assert _events(kube, cluster.namespace, preemption.REASON_PREEMPTED_BY, victim), "a PreemptedBy Event"
    egpu = kube.get_elastic_gpu(egpu_name)
    assert (egpu["status"]["phase"], egpu["status"]["reason"]) == ("Failed", preemption.REASON_PREEMPTED)


def test_a_higher_priority_claim_preempts_the_cheapest_victim_evicts_its_pod_and_binds(
        world: World, kube: KubeApi) -> None:  # noqa: F811  # the fixture
    gpu_name = _setup(world, low=None, high=1000)
    _claim(world, "old", "low", 40)
    controller = new_controller(kube, world.namespace)
    settle(controller)
    _claim(world, "young", "low", 60)
    settle(controller)
    egpus = {n: world.get_claim(n)["spec"]["elasticGPUName"] for n in ("old", "young")}
    world.pod("uses-young", claims={"main": "young"}, gated=False)
    world.pod("uses-old", claims={"main": "old"}, gated=False)
    # The agent reports "young" running on the card: its room stays until its containers stop.
    young = world.get_claim("young")
    write_gpu_status(kube, gpu_name, runningClaims=[{
        "namespace": world.namespace, "name": "young", "uid": young["metadata"]["uid"],
        "pods": [f"{world.namespace}/uses-young"]}])
    settle(controller)

    _claim(world, "urgent", "high", 50)
    settle(controller)
    # Only "young" (60 cores) makes room for 50 on its own; "old" (40) cannot: one victim, not two.
    status = _status(world, "urgent")
    assert (status["phase"], status["reason"]) == ("Pending", preemption.REASON_PREEMPTING), status
    assert f"{world.namespace}/young" in status["message"] and f"{world.namespace}/old" not in status["message"]
    _assert_preempted(world, kube, "young", egpus["young"], "urgent")
    try:
        world.get_pod("uses-young")
        raise AssertionError("the victim's pod was not deleted")
    except errors.NotFound:
        pass
    assert world.get_pod("uses-old"), "the other claim's pod is untouched"
    assert _status(world, "old")["phase"] == "Bound"
    assert _allocations(kube, gpu_name) == sorted(egpus.values()), "kept while the agent reports it running"
    plan = preemption.plan_of(ElasticGPUClaim.model_validate(world.get_claim("urgent")))
    assert plan is not None and [v.name for v in plan.victims] == ["young"]

    write_gpu_status(kube, gpu_name, runningClaims=[])  # the containers stopped
    settle(controller)
    urgent = world.get_claim("urgent")
    assert urgent["status"]["phase"] == "Bound"
    assert "preemption" not in urgent["status"], "plan done"
    assert _allocations(kube, gpu_name) == sorted([egpus["old"], urgent["spec"]["elasticGPUName"]])
    assert _events(kube, world.namespace, preemption.REASON_PREEMPTING, "urgent")


def test_equal_priority_and_never_do_not_preempt(cluster: Cluster, kube: KubeApi) -> None:
    gpu_name = _setup(cluster, low=None, peer=0, high=1000, polite=(1000, "Never"), top=2000)
    _claim(cluster, "holder", "high", 100)
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    held = _allocations(kube, gpu_name)
    _claim(cluster, "equal", "high", 30)
    _claim(cluster, "polite", "polite", 30)
    settle(controller)
    for name in ("equal", "polite"):
        status = _status(cluster, name)
        assert (status["phase"], status["reason"]) == ("Pending", "NoCapacity"), status
    assert _status(cluster, "holder")["phase"] == "Bound"
    assert _allocations(kube, gpu_name) == held
    assert not (cluster.get_claim("holder").get("status") or {}).get("preemptedBy")
    # A claim of higher priority still may: the proof that the rows above could fail.
    registry = CollectorRegistry()
    controller.attach_metrics(ControllerMetrics(registry, process=False))
    try:
        _claim(cluster, "top", "top", 30)
        settle(controller)
        assert _status(cluster, "top")["phase"] == "Bound"
        assert _status(cluster, "holder")["phase"] == "Lost"
        assert registry.get_sample_value("elasticgpu_claims_preempted_total") == 1
        # The bind after the preemption writes from the claim version its plan left: no 409 on the way.
        assert not registry.get_sample_value("elasticgpu_conflicts_total", {"resource": "elasticgpuclaims"})
    finally:
        kube.metrics = None


def test_no_preemption_for_a_claim_that_would_still_not_fit(cluster: Cluster, kube: KubeApi) -> None:
    gpu_name = _setup(cluster, low=None, mid=500, high=1000)
    _claim(cluster, "cheap", "low", 60)
    _claim(cluster, "precious", "high", 40)
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    held = _allocations(kube, gpu_name)
    _claim(cluster, "greedy", "mid", 80)  # 60 of lower priority on the card: 80 never fits without "precious"
    settle(controller)
    status = _status(cluster, "greedy")
    assert (status["phase"], status["reason"]) == ("Pending", "NoCapacity"), status
    assert "no preemption" in status["message"]
    assert _status(cluster, "cheap")["phase"] == "Bound" and _allocations(kube, gpu_name) == held


def test_a_quota_that_would_still_refuse_the_claim_prevents_preemption(
        cluster: Cluster, kube: KubeApi, api_client: Any) -> None:
    gpu_name = _setup(cluster, low=None, high=1000)
    _claim(cluster, "cheap", "low", 100)
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    held = _allocations(kube, gpu_name)
    # The quota counts the victim's 100 cores: once it is gone 50 would fit, 120 of a card never can.
    quotas.create(api_client, cluster.namespace, quotas.quota("cores", {names.RESOURCE_CORE: 60}))
    _claim(cluster, "big", "high", 70)
    settle(controller)
    status = _status(cluster, "big")
    assert status["phase"] == "Pending" and "no preemption" in status["message"], status
    assert _status(cluster, "cheap")["phase"] == "Bound" and _allocations(kube, gpu_name) == held
    _claim(cluster, "fits", "high", 50)
    settle(controller)
    assert _status(cluster, "fits")["phase"] == "Bound", "within the quota once the victim's charge goes"
    assert _status(cluster, "cheap")["phase"] == "Lost"


@pytest.mark.parametrize("died_after", ["plan", "first mark", "first victim failed"])
def test_a_plan_left_by_a_dead_controller_is_carried_out_by_a_fresh_one(cluster: Cluster, kube: KubeApi,
                                                                        died_after: str) -> None:
    """One row per crash point of the protocol (decisions/preemption.py): what a controller that died there
    leaves is written by hand, and a fresh controller finishes the preemption."""
    gpu_name = _setup(cluster, low=None, high=1000)
    _claim(cluster, "a", "low", 50)
    _claim(cluster, "b", "low", 50)
    first = new_controller(kube, cluster.namespace)
    settle(first)
    victims = {n: cluster.get_claim(n) for n in ("a", "b")}
    # What a controller that died right after step 1 leaves: the plan on the preemptor, nothing else.
    urgent = _claim(cluster, "urgent", "high", 100)
    plan = preemption.plan_status([preemption.Victim(elastic_gpu=v["spec"]["elasticGPUName"], name=n,
                                                     namespace=cluster.namespace, uid=v["metadata"]["uid"])
                                   for n, v in victims.items()], node=f"{cluster.prefix}-node",
                                  card=gpu_name.upper(), where=f"{cluster.prefix}-node card 0")
    kube.patch_claim_status(cluster.namespace, "urgent", {"metadata": {
        "resourceVersion": urgent["metadata"]["resourceVersion"]}, "status": {"preemption": plan}})
    if died_after in ("first mark", "first victim failed"):
        kube.patch_claim_status(cluster.namespace, "a", {"status": {"preemptedBy": f"{cluster.namespace}/urgent"}})
    if died_after == "first victim failed":
        kube.patch_elastic_gpu_status(victims["a"]["spec"]["elasticGPUName"], {"status": {
            "phase": "Failed", "reason": preemption.REASON_PREEMPTED, "message": "preempted"}})
    fresh = new_controller(kube, cluster.namespace)
    settle(fresh)
    urgent = cluster.get_claim("urgent")
    assert urgent["status"]["phase"] == "Bound"
    for name, body in victims.items():
        _assert_preempted(cluster, kube, name, body["spec"]["elasticGPUName"], "urgent",
                          event=name == "b" or died_after == "plan")
    assert _allocations(kube, gpu_name) == [urgent["spec"]["elasticGPUName"]]


def test_two_controllers_preempt_once_and_never_oversubscribe(cluster: Cluster, kube: KubeApi) -> None:
    gpu_name = _setup(cluster, low=None, high=1000)
    for name in ("a", "b", "c", "d"):
        _claim(cluster, name, "low", 25)
    one, two = new_controller(kube, cluster.namespace), new_controller(kube, cluster.namespace)
    settle(one)
    settle(two)
    _claim(cluster, "urgent", "high", 50)
    failures: list[BaseException] = []

    def work(controller: Any) -> None:
        try:
            settle(controller, deadline_s=60.0)
        except BaseException as err:  # reported below, in the test's thread
            failures.append(err)

    threads = [threading.Thread(target=work, args=(c,)) for c in (one, two)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    assert not failures, failures
    settle(one)
    assert _status(cluster, "urgent")["phase"] == "Bound"
    lost = [n for n in ("a", "b", "c", "d") if _status(cluster, n)["phase"] == "Lost"]
    assert len(lost) == 2, f"two 25-core victims make room for 50, not {lost}"
    gpu = kube.get_gpu(gpu_name)
    allocations = (gpu.get("status") or {}).get("allocations") or []
    assert sum(a["cores"] for a in allocations) <= 100
    assert len(allocations) == 3



def test_an_eviction_a_budget_refuses_is_retried_and_never_bypassed(
        world: World, kube: KubeApi, kube_cluster: Any) -> None:  # noqa: F811  # the fixture
    """A PodDisruptionBudget that allows no disruption answers an eviction 429 (here the fault proxy answers it
    in the server's place: the test server has no eviction subresource; tests/realcluster has a real budget).
    The victim keeps its card, its pod runs on; the preemptor says why it waits; once evictions are allowed
    again the next retry goes through and the preemptor binds."""
    _setup(world, low=None, high=1000)
    _claim(world, "batch", "low", 100)
    refuse = FaultPlan(rates={"429": 1.0}, paths=(r"^create .*/pods/[^/]+/eviction$",))
    with fault_proxy(kube_cluster, refuse) as (proxy, kubeconfig):
        proxied = KubeApi.from_kubeconfig(str(kubeconfig))
        try:
            controller = new_controller(proxied, world.namespace)
            settle(controller)
            world.pod("trainer", claims={"main": "batch"}, gated=False)
            settle(controller)
            _claim(world, "urgent", "high", 50)
            settle(controller)
            assert proxy.count("429") >= 1, "the eviction was asked for"
            status = _status(world, "urgent")
            assert (status["phase"], status["reason"]) == ("Pending", preemption.REASON_PREEMPTING), status
            assert "PodDisruptionBudget" in status["message"] and f"{world.namespace}/trainer" in status["message"]
            assert _events(kube, world.namespace, preemption.REASON_EVICTION_BLOCKED, "urgent")
            assert world.get_pod("trainer"), "never bypassed: the pod runs on"
            batch = world.get_claim("batch")
            assert batch["status"]["phase"] == "Bound", "the victim keeps its card while its pod runs"
            held = next(c for c in batch["status"]["conditions"] if c["type"] == preemption.CONDITION_PREEMPTED)
            assert "PodDisruptionBudget" in held["message"]

            proxy.set_plan(FaultPlan())  # the budget allows a disruption again
            deadline = time.monotonic() + 40
            while _status(world, "urgent").get("phase") != "Bound":
                assert time.monotonic() < deadline, _status(world, "urgent")
                controller.drain()
                time.sleep(0.1)
            assert _status(world, "batch")["phase"] == "Lost"
            try:
                world.get_pod("trainer")
                raise AssertionError("the victim's pod was not deleted")
            except errors.NotFound:
                pass
        finally:
            proxied.close()


def test_a_mark_left_by_a_preemptor_that_is_gone_keeps_nobody_from_being_a_victim(
        cluster: Cluster, kube: KubeApi) -> None:
    gpu_name = _setup(cluster, low=None, high=1000)
    _claim(cluster, "batch", "low", 100)
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    # A preemptor that was deleted (or bound elsewhere) before its victim's pods could be evicted left this.
    kube.patch_claim_status(cluster.namespace, "batch", {"status": {
        "preemptedBy": f"{cluster.namespace}/deleted-meanwhile"}})
    settle(controller)
    _claim(cluster, "urgent", "high", 50)
    settle(controller)
    urgent = cluster.get_claim("urgent")
    assert urgent["status"]["phase"] == "Bound", urgent["status"]
    batch = cluster.get_claim("batch")
    assert batch["status"]["preemptedBy"] == f"{cluster.namespace}/urgent"
    assert batch["status"]["phase"] == "Lost"
    assert _allocations(kube, gpu_name) == [urgent["spec"]["elasticGPUName"]]


def test_the_room_a_preemption_frees_goes_to_the_preemptor_not_an_older_waiting_claim(
        cluster: Cluster, kube: KubeApi) -> None:
    gpu_name = _setup(cluster, low=None, high=1000)
    victim = _claim(cluster, "victim", "low", 100)
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    # The agent reports the victim running: its room frees only when the containers stop, and then every
    # waiting claim is woken at once.
    write_gpu_status(kube, gpu_name, runningClaims=[{
        "namespace": cluster.namespace, "name": "victim", "uid": victim["metadata"]["uid"],
        "pods": [f"{cluster.namespace}/p"]}])
    _claim(cluster, "waiter", "low", 50)  # older than the preemptor, of lower priority: it waits too
    settle(controller)
    _claim(cluster, "urgent", "high", 60)
    settle(controller)
    assert _status(cluster, "urgent")["reason"] == preemption.REASON_PREEMPTING
    write_gpu_status(kube, gpu_name, runningClaims=[])
    settle(controller)
    assert _status(cluster, "urgent")["phase"] == "Bound"
    # 60 + 50 > 100: had "waiter" (the older) gone first, "urgent" would have preempted it next.
    waiter = _status(cluster, "waiter")
    assert (waiter["phase"], waiter["reason"]) == ("Pending", "NoCapacity"), waiter


def _refusing(*pods: str) -> FaultPlan:
    """A budget that allows no disruption of these pods: their evictions (dry runs too) answer 429."""
    return FaultPlan(rates={"429": 1.0}, paths=tuple(rf"^create .*/pods/{pod}/eviction$" for pod in pods))


def test_a_budget_on_one_victim_preempts_no_other_victim_of_the_plan(
        world: World, kube: KubeApi, kube_cluster: Any) -> None:  # noqa: F811  # the fixture
    """Issue 44 item 4: the preemptor needs two victims of one card; a budget (the tenant's own: `edit` may create
    one) refuses the eviction of one victim's pod. The plan is all or nothing: the other victim keeps its card
    and its pod while the budget holds (before, it was failed anyway, and the preemptor still could not bind);
    once the budget allows a disruption, both go and the preemptor binds."""
    _setup(world, low=None, high=1000)
    _claim(world, "guarded", "low", 50)
    _claim(world, "other", "low", 50)
    with fault_proxy(kube_cluster, _refusing("guarded-pod")) as (proxy, kubeconfig):
        proxied = KubeApi.from_kubeconfig(str(kubeconfig))
        try:
            controller = new_controller(proxied, world.namespace)
            settle(controller)
            world.pod("guarded-pod", claims={"main": "guarded"}, gated=False)
            world.pod("other-pod", claims={"main": "other"}, gated=False)
            settle(controller)
            _claim(world, "urgent", "high", 100)
            settle(controller)
            assert proxy.count("429") >= 1, "the eviction was asked for"
            status = _status(world, "urgent")
            assert (status["phase"], status["reason"]) == ("Pending", preemption.REASON_PREEMPTING), status
            assert f"{world.namespace}/guarded-pod" in status["message"], status
            for name in ("guarded", "other"):
                assert _status(world, name)["phase"] == "Bound", f"victim {name} was preempted while a budget held"
            assert world.get_pod("other-pod"), "the other victim's pod was evicted while a budget held the plan"

            proxy.set_plan(FaultPlan())  # the budget allows a disruption again
            deadline = time.monotonic() + 60
            while _status(world, "urgent").get("phase") != "Bound":
                assert time.monotonic() < deadline, _status(world, "urgent")
                controller.drain()
                time.sleep(0.1)
            assert {_status(world, n)["phase"] for n in ("guarded", "other")} == {"Lost"}
        finally:
            proxied.close()


def test_victims_no_budget_protects_are_preferred(world: World, kube: KubeApi, kube_cluster: Any) -> None:  # noqa: F811
    """Issue 44 item 4, as kube-scheduler prefers victims whose eviction violates no budget: two full cards, the
    younger claim (the allocator's first choice) protected by a budget; the preemptor takes the other card."""
    model = f"T{world.prefix}"
    for index in (0, 1):
        world.gpu(o.gpu(f"gpu-{world.prefix}-{index}", node=f"{world.prefix}-node", model=model, index=index))
    for name, value in (("low", None), ("high", 1000)):
        body = o.klass(f"{world.prefix}-{name}", parameters={"gpuModel": model})
        if value is not None:
            body["priority"] = value
        world.klass(body)
    with fault_proxy(kube_cluster, _refusing("guarded-pod")) as (_proxy, kubeconfig):
        proxied = KubeApi.from_kubeconfig(str(kubeconfig))
        try:
            controller = new_controller(proxied, world.namespace)
            _claim(world, "plain", "low", 100)
            settle(controller)
            time.sleep(1.1)  # creation times are in seconds: "guarded" is the younger, the allocator's choice
            _claim(world, "guarded", "low", 100)
            settle(controller)
            world.pod("plain-pod", claims={"main": "plain"}, gated=False)
            world.pod("guarded-pod", claims={"main": "guarded"}, gated=False)
            settle(controller)
            _claim(world, "urgent", "high", 50)
            deadline = time.monotonic() + 60
            while _status(world, "urgent").get("phase") != "Bound":
                assert time.monotonic() < deadline, _status(world, "urgent")
                controller.drain()
                time.sleep(0.1)
            assert _status(world, "plain")["phase"] == "Lost"
            assert _status(world, "guarded")["phase"] == "Bound"
            assert world.get_pod("guarded-pod")
        finally:
            proxied.close()
