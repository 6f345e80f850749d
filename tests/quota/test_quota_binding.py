"""Quotas against the API server: a claim over quota stays Pending with the quota, its use and
its limit named (and an Event); it binds once the quota is raised or another claim is deleted;
two controller processes binding a burst never exceed the quota; the CRD refuses bad values."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from elasticgpu.api import names
from elasticgpu.controller.edge.kube import KubeApi
from tests.binding import objects as o
from tests.binding.conftest import Cluster, settle
from tests.binding.processes import ControllerProcesses, check_invariants, wait_quiescent
from tests.kube_cluster import kube_request
from tests.quota import quotas
from tests.quota.quota_controller import claim_status, quota_controller, work_until

CORE, MEMORY, CARDS = names.RESOURCE_CORE, names.RESOURCE_MEMORY, names.RESOURCE_NVIDIA_GPU


def _setup(cluster: Cluster, *, gpus: int = 2) -> tuple[list[str], str]:
    model = f"T{cluster.prefix}"
    gpu_names = [f"gpu-{cluster.prefix}-{i}" for i in range(gpus)]
    for index, name in enumerate(gpu_names):
        cluster.gpu(o.gpu(name, node=f"{cluster.prefix}-n{index // 8}", index=index % 8, model=model))
    class_name = f"{cluster.prefix}-class"
    cluster.klass(o.klass(class_name, parameters={"gpuModel": model}))
    return gpu_names, class_name


def test_a_claim_over_quota_stays_pending_and_binds_once_the_quota_is_raised(
        cluster: Cluster, kube: KubeApi, api_client: client.ApiClient) -> None:
    _gpus, class_name = _setup(cluster)
    quotas.create(api_client, cluster.namespace, quotas.quota("team", {CORE: 50, f"{class_name}.{MEMORY}": "40Gi"}))
    cluster.claim(o.claim("first", cores=30, memory="10Gi", class_name=class_name))
    cluster.claim(o.claim("second", cores=30, memory="10Gi", class_name=class_name))
    controller = quota_controller(kube, cluster.namespace)
    settle(controller)

    phases = {n: claim_status(cluster, n).get("phase") for n in ("first", "second")}
    assert sorted(phases.values()) == ["Bound", "Pending"], phases
    pending = next(n for n, p in phases.items() if p == "Pending")
    status = claim_status(cluster, pending)
    assert status["reason"] == "QuotaExceeded"
    message = status["message"]
    assert "ElasticGPUQuota team" in message and CORE in message, message
    assert "would be 60" in message and "limit 50" in message and "used 30" in message, message
    [condition] = status["conditions"]
    assert (condition["type"], condition["reason"], condition["message"]) == ("Pending", "QuotaExceeded", message)
    events = [e for e in kube.list_events(cluster.namespace) if e["reason"] == "QuotaExceeded"]
    assert events and events[0]["involvedObject"]["name"] == pending and events[0]["type"] == "Warning"

    used = quotas.get(api_client, cluster.namespace, "team")["status"]
    assert used["used"] == {CORE: 30, f"{class_name}.{MEMORY}": "10Gi"}
    assert used["summary"] == {"cores": "30/50", "memory": "10Gi/-", "cards": "0/-"}
    # kubectl get shows used/hard (the server's Table, as kubectl asks for it).
    table = kube_request(api_client, "GET", f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{cluster.namespace}/"
                         f"{names.PLURAL_QUOTA}", headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})
    assert table.status == 200
    [row] = table.json()["rows"]
    assert row["cells"][:4] == ["team", "30/50", "10Gi/-", "0/-"]

    quotas.set_hard(api_client, cluster.namespace, "team", {CORE: 60, f"{class_name}.{MEMORY}": "40Gi"})
    work_until(controller, lambda: claim_status(cluster, pending).get("phase") == "Bound")
    used = quotas.get(api_client, cluster.namespace, "team")["status"]
    assert used["summary"]["cores"] == "60/60" and used["used"][f"{class_name}.{MEMORY}"] == "20Gi"
    assert len(used["charges"]) == 2


def test_a_quota_whose_watch_event_lags_its_claims_still_holds(
        cluster: Cluster, kube: KubeApi, api_client: client.ApiClient) -> None:
    """The claim and quota watches are separate streams: a quota created just before two claims can
    reach the controller after them. Here the controller lists (no quota yet), the quota and the
    claims are created, and only the claims are delivered: the guard must not trust "no quota" for
    claims newer than what its quota watch delivered; it reads the quotas live, so one claim binds
    and the other waits (before: both bound, 60 cores under a quota of 50)."""
    _gpus, class_name = _setup(cluster)
    controller = quota_controller(kube, cluster.namespace)
    controller.rebuild()  # quotas listed: none; no watch runs, so the quota's event never comes
    controller.drain()
    quotas.create(api_client, cluster.namespace, quotas.quota("team", {CORE: 50}))
    for name in ("first", "second"):
        controller.observe("claim", "ADDED", cluster.claim(o.claim(name, cores=30, memory="10Gi",
                                                                   class_name=class_name)))
    controller.drain()

    phases = sorted(claim_status(cluster, n).get("phase") or "" for n in ("first", "second"))
    assert phases == ["Bound", "Pending"], phases
    charged = quotas.get(api_client, cluster.namespace, "team").get("status", {}).get("charges", [])
    assert len(charged) == 1, charged


def test_a_claim_over_quota_binds_once_another_claim_is_deleted(
        cluster: Cluster, kube: KubeApi, api_client: client.ApiClient) -> None:
    _gpus, class_name = _setup(cluster)
    quotas.create(api_client, cluster.namespace, quotas.quota("cards", {CARDS: 1}))
    cluster.claim(o.claim("whole-a", cards=1, class_name=class_name))
    controller = quota_controller(kube, cluster.namespace)
    settle(controller)
    assert claim_status(cluster, "whole-a")["phase"] == "Bound"
    cluster.claim(o.claim("whole-b", cards=1, class_name=class_name))
    settle(controller)
    status = claim_status(cluster, "whole-b")
    assert (status["phase"], status["reason"]) == ("Pending", "QuotaExceeded")
    assert "ElasticGPUQuota cards" in status["message"] and "limit 1" in status["message"], status["message"]

    kube.delete_claim(cluster.namespace, "whole-a")
    work_until(controller, lambda: claim_status(cluster, "whole-b").get("phase") == "Bound")
    charges = quotas.get(api_client, cluster.namespace, "cards")["status"]["charges"]
    assert [c["claim"] for c in charges] == ["whole-b"]


def test_two_controller_processes_never_exceed_the_quota(
        cluster: Cluster, kube: KubeApi, api_client: client.ApiClient, kube_cluster: Any, tmp_path: Path) -> None:
    gpu_names, class_name = _setup(cluster, gpus=10)  # room for 40 claims; the quota allows 12
    hard_cores = 300
    quotas.create(api_client, cluster.namespace, quotas.quota("burst", {CORE: hard_cores}))
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: cluster.claim(o.claim(f"c{i}", cores=25, memory="1Gi", class_name=class_name)),
                      range(40)))
    procs = ControllerProcesses(kube_cluster.kubeconfig, cluster.namespace, tmp_path)
    try:
        procs.start()
        procs.start()
        claims = wait_quiescent(kube, cluster.namespace, quiet_s=4.0, deadline_s=120.0, procs=procs,
                                done=lambda cs: all((c.get("status") or {}).get("phase") for c in cs))
    finally:
        procs.close()
    phases = check_invariants(kube, cluster.namespace, claims, gpu_names)
    # From the API objects alone: what the namespace holds on the cards is within the quota.
    held = sum(a["cores"] for g in gpu_names for a in (kube.get_gpu(g).get("status") or {}).get("allocations") or []
               if (a.get("claimRef") or {}).get("namespace") == cluster.namespace)
    assert held <= hard_cores, held
    assert phases["Bound"] == hard_cores // 25, phases  # and all of the quota's room is used
    reasons = {(c["status"]["phase"], c["status"]["reason"]) for c in claims if c["status"]["phase"] != "Bound"}
    assert reasons == {("Pending", "QuotaExceeded")}, reasons
    status = quotas.get(api_client, cluster.namespace, "burst")["status"]
    assert status["used"] == {CORE: held} and len(status["charges"]) == phases["Bound"]


@pytest.mark.parametrize(("hard", "says"), [
    ({CORE: "1.5"}, "must be whole numbers"),
    ({CORE: -100}, "must be whole numbers"),
    ({CARDS: "2k"}, "must be whole numbers"),
    ({MEMORY: "-1Gi"}, "at least 0"),
    ({MEMORY: "10m"}, "at least 0"),
    ({MEMORY: "lots"}, "spec.hard"),
    ({"elasticgpu.io/gpu-cores": 100}, "keys must be"),
    ({"Big_Class.elasticgpu.io/gpu-core": 100}, "keys must be"),
])
def test_the_crd_refuses_bad_quantities_at_apply_time(
        cluster: Cluster, api_client: client.ApiClient, hard: dict[str, Any], says: str) -> None:
    with pytest.raises(ApiException) as refused:
        quotas.create(api_client, cluster.namespace, quotas.quota("bad", hard))
    assert refused.value.status == 422 and says in str(refused.value.body), refused.value.body


def test_the_crd_accepts_namespace_and_class_keys(cluster: Cluster, api_client: client.ApiClient) -> None:
    hard = {CORE: 400, MEMORY: "320Gi", CARDS: 4, f"a100.{CORE}": 200, f"a100.{MEMORY}": 0, f"t4.x.{CARDS}": "2"}
    created = quotas.create(api_client, cluster.namespace, quotas.quota("good", hard))
    assert created["spec"]["hard"] == hard


def test_the_resync_charges_what_was_bound_before_the_quota_and_drops_stale_charges(
        cluster: Cluster, kube: KubeApi, api_client: client.ApiClient) -> None:
    _gpus, class_name = _setup(cluster)
    created = cluster.claim(o.claim("early", cores=40, memory="8Gi", class_name=class_name))
    controller = quota_controller(kube, cluster.namespace)
    settle(controller)
    assert claim_status(cluster, "early")["phase"] == "Bound"
    # A quota created after the bind, holding a charge whose bind crashed long ago (no reservation).
    quotas.create(api_client, cluster.namespace, quotas.quota("late", {CORE: 30}))
    body = quotas.get(api_client, cluster.namespace, "late")
    body["status"] = {"charges": [{"claim": "crashed", "uid": "00000000-dead", "cores": 20, "memory": 1024,
                                   "since": "2020-01-01T00:00:00Z"}]}
    client.CustomObjectsApi(api_client).replace_namespaced_custom_object_status(
        names.GROUP, names.VERSION, cluster.namespace, names.PLURAL_QUOTA, "late", body)

    controller.resync(relist=False)
    status = quotas.get(api_client, cluster.namespace, "late")["status"]
    assert [(c["claim"], c["uid"], c["cores"], c["memory"]) for c in status["charges"]] == [
        ("early", created["metadata"]["uid"], 40, 8192)]
    assert status["used"] == {CORE: 40} and status["summary"]["cores"] == "40/30"  # over: it was there first
    cluster.claim(o.claim("next", cores=10, memory="1Gi", class_name=class_name))
    settle(controller)
    assert claim_status(cluster, "next")["reason"] == "QuotaExceeded"


def test_an_expand_over_quota_is_refused_and_a_shrink_gives_its_part_back(
        cluster: Cluster, kube: KubeApi, api_client: client.ApiClient) -> None:
    """A resize is charged like a bind: an expand that would take the quota over its limit leaves
    the claim at its size (Resizing=False, QuotaExceeded, naming the quota); a finished shrink
    lowers the quota's use."""
    model = f"T{cluster.prefix}"
    cluster.gpu(o.gpu(f"gpu-{cluster.prefix}-0", node=f"{cluster.prefix}-n", index=0, model=model))
    class_name = f"{cluster.prefix}-class"
    body = o.klass(class_name, parameters={"gpuModel": model})
    body["allowClaimResize"] = True
    cluster.klass(body)
    quotas.create(api_client, cluster.namespace, quotas.quota("team", {CORE: 50}))
    cluster.claim(o.claim("grow", cores=30, memory="10Gi", class_name=class_name))
    controller = quota_controller(kube, cluster.namespace)
    settle(controller)
    assert claim_status(cluster, "grow").get("phase") == "Bound"

    cluster.kube.patch_claim(cluster.namespace, "grow", {"spec": {"resources": {"requests": {CORE: 60}}}})
    work_until(controller,
               lambda: any(c["type"] == "Resizing" for c in claim_status(cluster, "grow").get("conditions") or []))
    status = claim_status(cluster, "grow")
    [resizing] = [c for c in status["conditions"] if c["type"] == "Resizing"]
    assert (resizing["status"], resizing["reason"]) == ("False", "QuotaExceeded"), resizing
    assert "ElasticGPUQuota team" in resizing["message"] and "limit 50" in resizing["message"], resizing
    assert status["capacity"][CORE] == 30
    assert quotas.get(api_client, cluster.namespace, "team")["status"]["used"][CORE] == 30

    # No container runs on the card: the shrink completes at once and gives back its part.
    cluster.kube.patch_claim(cluster.namespace, "grow", {"spec": {"resources": {"requests": {CORE: 20}}}})
    work_until(controller, lambda: claim_status(cluster, "grow").get("capacity", {}).get(CORE) == 20)
    work_until(controller, lambda: quotas.get(api_client, cluster.namespace, "team")["status"]["used"][CORE] == 20)
