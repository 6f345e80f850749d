"""Preemption against tenants who write what they may (issue 33 items 1 and 3), on the API server.

A tenant may write its claims' annotations and labels. Before issue 33 the preemption plan lived in the
claim annotation `elasticgpu.io/preempting`, and the controller followed a plan it found there: a
priority-0 claim of a class with `preemptionPolicy: Never` in one namespace took another namespace's card
from a priority-1000 claim with one annotation. And any claim labelled `elasticgpu.io/group` was skipped as
a victim, so a priority-0 tenant opted out of preemption with one label. Plans now live in status (only the
controller writes it) and are checked again each time they are followed; a claim group is a victim as a
whole.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from elasticgpu.api import ElasticGPUClaim, names
from elasticgpu.controller.decisions import preemption
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.picture import waiting_order
from tests.binding import objects as o
from tests.binding.conftest import Cluster, new_controller, settle
from tests.binding.namespaces import fresh_namespaces
from tests.faults.proxy import FaultPlan, fault_proxy
from tests.pods.claim_world import World, world  # noqa: F401  # the fixture, re-exported for pytest
from tests.pods.conftest import pod_update_policies  # noqa: F401  # the world fixture's own

FORGED_PLAN = "elasticgpu.io/preempting"
FORGED_MARK = "elasticgpu.io/preempted-by"
"""The annotations plans and marks lived in before issue 33, spelled out: the rows below run on the code of
before too, where they fail."""


@pytest.fixture
def tenants(api_client: client.ApiClient, kube: KubeApi, namespace: str) -> Iterator[tuple[str, str]]:
    """Two namespaces of this test's own: the victim's tenant and the forger's."""
    made = [f"{namespace}-a", f"{namespace}-b"]
    with fresh_namespaces(api_client, kube, made):
        yield made[0], made[1]


def _one_card_and_classes(cluster: Cluster, **classes: dict[str, Any]) -> str:
    model = f"T{cluster.prefix}"
    gpu_name = f"gpu-{cluster.prefix}-0"
    cluster.gpu(o.gpu(gpu_name, node=f"{cluster.prefix}-node", model=model))
    for name, fields in classes.items():
        cluster.klass({**o.klass(f"{cluster.prefix}-{name}", parameters={"gpuModel": model}), **fields})
    return gpu_name


def _create(kube: KubeApi, namespace: str, name: str, class_name: str, cores: int, *,
            annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    body = o.claim(name, namespace, cores=cores, memory=None, class_name=class_name)
    body["metadata"].pop("uid")
    body["metadata"]["annotations"] = annotations or {}
    body["metadata"]["labels"] = labels or {}
    return kube.create_claim(body)


def _status(kube: KubeApi, namespace: str, name: str) -> dict[str, Any]:
    return kube.get_claim(namespace, name).get("status") or {}


def test_a_forged_plan_annotation_preempts_nobody(cluster: Cluster, kube: KubeApi,
                                                  tenants: tuple[str, str]) -> None:
    """Reproduced by the review: a priority-0 claim with policy Never in namespace b names namespace a's
    priority-1000 claim in the plan annotation. The victim keeps its card; the forger waits."""
    ns_a, ns_b = tenants
    _one_card_and_classes(cluster, prod={"priority": 1000}, cheap={"priority": 0, "preemptionPolicy": "Never"})
    victim = _create(kube, ns_a, "training", f"{cluster.prefix}-prod", 100)
    controller = new_controller(kube, None)
    try:
        settle(controller)
        victim = kube.get_claim(ns_a, "training")
        assert victim["status"]["phase"] == "Bound"
        egpu = victim["spec"]["elasticGPUName"]
        plan = {"on": "the victim's card", "victims": [
            {"elasticGPU": egpu, "claim": f"{ns_a}/training", "uid": victim["metadata"]["uid"]}]}
        _create(kube, ns_b, "forger", f"{cluster.prefix}-cheap", 50,
                annotations={FORGED_PLAN: json.dumps(plan), FORGED_MARK: f"{ns_b}/someone"})
        settle(controller)
    finally:
        controller.close()
    status = _status(kube, ns_a, "training")
    assert status["phase"] == "Bound", f"the forged plan preempted namespace {ns_a}'s claim: {status}"
    assert not status.get("preemptedBy")
    assert (kube.get_elastic_gpu(egpu).get("status") or {}).get("phase") != "Failed"
    forger = _status(kube, ns_b, "forger")
    assert (forger["phase"], forger["reason"]) == ("Pending", "NoCapacity"), forger
    assert "preemption" not in forger


def test_a_forged_plan_does_not_jump_the_bind_order() -> None:
    """The plan also moved a claim to the front of the bind order: only the controller's own plan (status)
    does now."""
    def claim(name: str, *, annotations: dict[str, str] | None = None,
              status: dict[str, Any] | None = None) -> ElasticGPUClaim:
        return ElasticGPUClaim.model_validate({
            "metadata": {"name": name, "namespace": "ns", "annotations": annotations or {},
                         "creationTimestamp": "2026-01-01T00:00:00Z" if name == "older" else "2026-01-01T00:00:09Z"},
            "spec": {"resources": {"requests": {names.RESOURCE_CORE: 60}}}, "status": status or {}})

    older = claim("older")
    forger = claim("forger", annotations={FORGED_PLAN: '{"on": "x", "victims": []}'})
    planned = claim("planned", status={"preemption": {"node": "n", "victims": []}})
    models = {("ns", c.metadata.name or ""): c for c in (older, forger, planned)}
    order = waiting_order.ordered(list(models), claim=models.get, classes={}, default_class=None,
                                  reservations={}, owners={})
    assert order == [("ns", "planned"), ("ns", "older"), ("ns", "forger")]


def test_a_one_member_group_is_preempted_like_any_claim(cluster: Cluster, kube: KubeApi) -> None:
    """Reproduced by the review: the label `elasticgpu.io/group` made a priority-0 claim immune, and the
    preemptor was told that no claim of lower priority held a card."""
    _one_card_and_classes(cluster, low={"priority": 0}, high={"priority": 1000})
    _create(kube, cluster.namespace, "immune", f"{cluster.prefix}-low", 100, labels={names.LABEL_GROUP: "solo"})
    controller = new_controller(kube, cluster.namespace)
    try:
        settle(controller)
        assert _status(kube, cluster.namespace, "immune")["phase"] == "Bound"
        _create(kube, cluster.namespace, "urgent", f"{cluster.prefix}-high", 50)
        settle(controller)
    finally:
        controller.close()
    urgent = _status(kube, cluster.namespace, "urgent")
    assert urgent["phase"] == "Bound", f"the one-member group kept its card: {urgent}"
    immune = _status(kube, cluster.namespace, "immune")
    assert (immune["phase"], immune.get("preemptedBy")) == ("Lost", f"{cluster.namespace}/urgent"), immune


def test_a_group_is_preempted_whole(cluster: Cluster, kube: KubeApi) -> None:
    """Two cards on two nodes, each held by one member of a low-priority gang; a high-priority claim needs
    half a card: the whole gang goes (a gang left with one member holds a card for a job that cannot run)."""
    model = f"T{cluster.prefix}"
    for index in range(2):
        cluster.gpu(o.gpu(f"gpu-{cluster.prefix}-{index}", node=f"{cluster.prefix}-node-{index}", model=model))
    for name, priority in (("low", 0), ("high", 1000)):
        cluster.klass({**o.klass(f"{cluster.prefix}-{name}", parameters={"gpuModel": model}), "priority": priority})
    for member in ("m0", "m1"):
        _create(kube, cluster.namespace, member, f"{cluster.prefix}-low", 100, labels={names.LABEL_GROUP: "gang"},
                annotations={names.ANNOTATION_GROUP_MIN_MEMBERS: "2"})
    controller = new_controller(kube, cluster.namespace)
    try:
        settle(controller)
        assert {_status(kube, cluster.namespace, m)["phase"] for m in ("m0", "m1")} == {"Bound"}
        _create(kube, cluster.namespace, "urgent", f"{cluster.prefix}-high", 50)
        deadline = time.monotonic() + 60
        while _status(kube, cluster.namespace, "urgent").get("phase") != "Bound":
            assert time.monotonic() < deadline, _status(kube, cluster.namespace, "urgent")
            settle(controller)
    finally:
        controller.close()
    for member in ("m0", "m1"):
        status = _status(kube, cluster.namespace, member)
        assert (status["phase"], status.get("preemptedBy")) == ("Lost", f"{cluster.namespace}/urgent"), status
    events = [e for e in kube.list_events(cluster.namespace) if e.get("reason") == preemption.REASON_PREEMPTING]
    assert events and all(e["message"].count(f"{cluster.namespace}/m0") == 1 for e in events), "each member once"


def test_a_plan_whose_class_stops_preempting_is_dropped(
        world: World, kube: KubeApi, kube_cluster: Any, api_client: client.ApiClient) -> None:  # noqa: F811
    """A plan is checked again each time it is followed: while a budget holds the victim's pod (the fault
    proxy answers its eviction 429, as in test_preemption.py), the preemptor's class sets `preemptionPolicy:
    Never`. The plan goes, and the victim, not failed yet, keeps its card and loses its mark."""
    _one_card_and_classes(world, low={"priority": 0}, high={"priority": 1000})
    _create(kube, world.namespace, "batch", f"{world.prefix}-low", 100)
    refuse = FaultPlan(rates={"429": 1.0}, paths=(r"^create .*/pods/[^/]+/eviction$",))
    with fault_proxy(kube_cluster, refuse) as (_proxy, kubeconfig):
        proxied = KubeApi.from_kubeconfig(str(kubeconfig))
        controller = new_controller(proxied, world.namespace)
        try:
            settle(controller)
            world.pod("trainer", claims={"main": "batch"}, gated=False)
            _create(kube, world.namespace, "urgent", f"{world.prefix}-high", 50)
            settle(controller)
            urgent = _status(kube, world.namespace, "urgent")
            assert urgent.get("reason") == preemption.REASON_PREEMPTING and urgent.get("preemption"), urgent
            assert _status(kube, world.namespace, "batch").get("preemptedBy") == f"{world.namespace}/urgent"
            client.CustomObjectsApi(api_client).patch_cluster_custom_object(
                names.GROUP, names.VERSION, names.PLURAL_CLASS, f"{world.prefix}-high", {"preemptionPolicy": "Never"})
            deadline = time.monotonic() + 40
            while _status(kube, world.namespace, "urgent").get("preemption"):
                assert time.monotonic() < deadline, _status(kube, world.namespace, "urgent")
                controller.drain()
                time.sleep(0.1)
        finally:
            controller.close()
            proxied.close()
    urgent = _status(kube, world.namespace, "urgent")
    assert urgent["phase"] == "Pending" and urgent["reason"] != preemption.REASON_PREEMPTING, urgent
    batch = _status(kube, world.namespace, "batch")
    assert batch["phase"] == "Bound" and not batch.get("preemptedBy"), batch
    assert world.get_pod("trainer"), "the victim's pod runs on"


def test_status_a_tenant_writes_with_its_claim_is_dropped(cluster: Cluster, kube: KubeApi) -> None:
    """What the controller trusts lives in status: a claim created with a plan, a mark or allowPrivileged in
    its status has none of them (the status subresource: a create or an update of the claim drops status)."""
    body = o.claim("sly", cluster.namespace, cores=30, memory=None)
    body["metadata"].pop("uid")
    body["status"] = {"preemption": {"node": "n", "victims": [{"elasticGPU": "egpu-x", "claim": "a/b"}]},
                      "preemptedBy": "a/b", "allowPrivileged": True, "phase": "Bound"}
    created = kube.create_claim(body)
    assert not created.get("status"), created.get("status")
    kube.patch_claim(cluster.namespace, "sly", {"status": body["status"]})
    assert not kube.get_claim(cluster.namespace, "sly").get("status")
