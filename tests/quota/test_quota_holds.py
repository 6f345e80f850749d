"""A quota's charge covers what the namespace holds on the cards, against the API server (issue 23).

- A resync between an expand's charge and its GPU write does not lower the charge (item 1).
- A claim bound to an admin's (static) ElasticGPU is charged at bind, like a dynamic one (item 5).
- A deleted claim whose pods still run on the card stays charged until its reservation is freed (item 7).
"""

from __future__ import annotations

from kubernetes import client

from elasticgpu.allocator import Placement
from elasticgpu.api import ObjectReference, names
from elasticgpu.controller.edge.kube import KubeApi
from tests.binding import objects as o
from tests.binding.agent_status import write_gpu_status
from tests.binding.conftest import Cluster, settle
from tests.quota import quotas
from tests.quota.quota_controller import claim_status, quota_controller, work_until

CORE = names.RESOURCE_CORE


def _setup(cluster: Cluster, *, resize: bool = False) -> tuple[str, str]:
    model = f"T{cluster.prefix}"
    gpu_name = f"gpu-{cluster.prefix}-0"
    cluster.gpu(o.gpu(gpu_name, node=f"{cluster.prefix}-n", index=0, model=model))
    class_name = f"{cluster.prefix}-class"
    body = o.klass(class_name, parameters={"gpuModel": model})
    if resize:
        body["allowClaimResize"] = True
    cluster.klass(body)
    return gpu_name, class_name


def _held(kube: KubeApi, gpu_name: str, namespace: str) -> int:
    """Cores the GPU object reserves for the claims of `namespace` (the API server's truth)."""
    allocations = (kube.get_gpu(gpu_name).get("status") or {}).get("allocations") or []
    return sum(a["cores"] for a in allocations if (a.get("claimRef") or {}).get("namespace") == namespace)


def _used(api_client: client.ApiClient, namespace: str, name: str) -> int:
    used: int = ((quotas.get(api_client, namespace, name).get("status") or {}).get("used") or {}).get(CORE, 0)
    return used


def test_a_resync_between_an_expands_charge_and_its_reservation_keeps_the_charge(
        cluster: Cluster, kube: KubeApi, api_client: client.ApiClient) -> None:
    """Item 1, as reproduced: quota 60 cores, claim a 30 -> 50 with a resync between the expand's
    charge and its GPU write, then claim b (30) must be refused."""
    gpu_name, class_name = _setup(cluster, resize=True)
    quotas.create(api_client, cluster.namespace, quotas.quota("team", {CORE: 60}))
    cluster.claim(o.claim("a", cores=30, memory="10Gi", class_name=class_name))
    controller = quota_controller(kube, cluster.namespace)
    settle(controller)
    assert claim_status(cluster, "a").get("phase") == "Bound"

    guard = controller.quota
    charge = guard.charge
    resynced: list[int] = []

    def charge_then_resync(claim_ref: ObjectReference, placement: Placement) -> list[str]:
        written = charge(claim_ref, placement)
        if claim_ref.name == "a" and placement.cards[0].cores == 50 and not resynced:
            resynced.append(_used(api_client, cluster.namespace, "team"))
            guard.resync()  # the repair thread, in the window: the picture still shows 30 reserved
            resynced.append(_used(api_client, cluster.namespace, "team"))
        return written

    guard.charge = charge_then_resync  # type: ignore[method-assign]
    kube.patch_claim(cluster.namespace, "a", {"spec": {"resources": {"requests": {CORE: 50}}}})
    work_until(controller, lambda: claim_status(cluster, "a").get("capacity", {}).get(CORE) == 50)
    assert resynced == [50, 50], f"quota used before/after the resync in the expand's window: {resynced}"

    cluster.claim(o.claim("b", cores=30, memory="10Gi", class_name=class_name))
    settle(controller)
    status = claim_status(cluster, "b")
    assert (status.get("phase"), status.get("reason")) == ("Pending", "QuotaExceeded"), status
    assert _held(kube, gpu_name, cluster.namespace) == 50 == _used(api_client, cluster.namespace, "team")


def test_a_claim_bound_to_a_static_elastic_gpu_is_charged_at_bind(
        cluster: Cluster, kube: KubeApi, api_client: client.ApiClient) -> None:
    """Item 5: binding to an admin's ElasticGPU charges what it reserves (50 cores, though the
    claim asks 30), at once; the next claim finds the quota used."""
    gpu_name, class_name = _setup(cluster)
    quotas.create(api_client, cluster.namespace, quotas.quota("team", {CORE: 60}))
    cluster.egpu(o.share_egpu(f"{cluster.prefix}-static", gpu_name, cores=50, memory="20Gi", class_name=class_name))
    controller = quota_controller(kube, cluster.namespace)
    settle(controller)
    cluster.claim(o.claim("s", cores=30, memory="10Gi", class_name=class_name))
    settle(controller)
    claim = cluster.get_claim("s")
    assert (claim["status"]["phase"], claim["spec"]["elasticGPUName"]) == ("Bound", f"{cluster.prefix}-static")
    status = quotas.get(api_client, cluster.namespace, "team")["status"]
    assert [(c["claim"], c["cores"]) for c in status["charges"]] == [("s", 50)], status
    assert status["used"] == {CORE: 50}

    cluster.claim(o.claim("d", cores=20, memory="1Gi", class_name=class_name))
    settle(controller)
    status = claim_status(cluster, "d")
    assert (status.get("phase"), status.get("reason")) == ("Pending", "QuotaExceeded")


def test_a_static_bind_over_quota_stays_pending_and_the_elastic_gpu_available(
        cluster: Cluster, kube: KubeApi, api_client: client.ApiClient) -> None:
    """Item 5: a static bind that would take the quota over its limit is refused before the
    ElasticGPU is pointed at the claim."""
    gpu_name, class_name = _setup(cluster)
    quotas.create(api_client, cluster.namespace, quotas.quota("team", {CORE: 40}))
    egpu_name = f"{cluster.prefix}-static"
    cluster.egpu(o.share_egpu(egpu_name, gpu_name, cores=50, memory="20Gi", class_name=class_name))
    cluster.claim(o.claim("s", cores=30, memory="10Gi", class_name=class_name, selector={"matchLabels": {}}))
    controller = quota_controller(kube, cluster.namespace)
    settle(controller)
    status = claim_status(cluster, "s")
    assert (status.get("phase"), status.get("reason")) == ("Pending", "QuotaExceeded"), status
    assert "ElasticGPUQuota team" in status["message"] and "would be 50" in status["message"], status["message"]
    egpu = kube.get_elastic_gpu(egpu_name)
    assert egpu["status"]["phase"] == "Available" and not egpu["spec"].get("claimRef"), egpu
    assert _used(api_client, cluster.namespace, "team") == 0

    quotas.set_hard(api_client, cluster.namespace, "team", {CORE: 50})
    work_until(controller, lambda: claim_status(cluster, "s").get("phase") == "Bound")
    assert _used(api_client, cluster.namespace, "team") == 50


def test_a_deleted_claim_stays_charged_while_its_pods_hold_the_card(
        cluster: Cluster, kube: KubeApi, api_client: client.ApiClient) -> None:
    """Item 7: the agent reports the deleted claim running on the card, so the controller keeps its
    reservation; the quota keeps its charge too (also through a resync) until the reservation goes."""
    gpu_name, class_name = _setup(cluster)
    quotas.create(api_client, cluster.namespace, quotas.quota("team", {CORE: 60}))
    first = cluster.claim(o.claim("first", cores=40, memory="10Gi", class_name=class_name))
    controller = quota_controller(kube, cluster.namespace)
    settle(controller)
    assert claim_status(cluster, "first").get("phase") == "Bound"
    meta = first["metadata"]
    write_gpu_status(kube, gpu_name, runningClaims=[{
        "namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"],
        "pods": [f"{meta['namespace']}/p1"], "since": "2026-01-01T00:00:00Z"}])
    settle(controller)

    kube.delete_claim(cluster.namespace, "first")
    settle(controller)
    assert _held(kube, gpu_name, cluster.namespace) == 40, "the running claim's reservation is kept"
    assert _used(api_client, cluster.namespace, "team") == 40, "its charge is kept with it"
    controller.resync(relist=False)
    assert _used(api_client, cluster.namespace, "team") == 40, "the resync keeps it too"
    cluster.claim(o.claim("second", cores=30, memory="10Gi", class_name=class_name))
    settle(controller)
    status = claim_status(cluster, "second")
    assert (status.get("phase"), status.get("reason")) == ("Pending", "QuotaExceeded"), status

    # The containers stop: the agent drops the entry, the reservation and then the charge go.
    write_gpu_status(kube, gpu_name, runningClaims=[])
    work_until(controller, lambda: claim_status(cluster, "second").get("phase") == "Bound")
    assert _held(kube, gpu_name, cluster.namespace) == 30 == _used(api_client, cluster.namespace, "team")


def test_the_resync_reads_the_gpus_live_before_it_lowers_a_charge(
        cluster: Cluster, kube: KubeApi, api_client: client.ApiClient) -> None:
    """Item 1, with a lagging GPU watch: another controller expanded claim a to 50 (charge, then
    GPU write) long ago, and this controller's picture still shows 30. Its resync must not lower
    the charge to 30: the API server's GPU object reserves 50."""
    gpu_name, class_name = _setup(cluster, resize=True)
    quotas.create(api_client, cluster.namespace, quotas.quota("team", {CORE: 60}))
    created = cluster.claim(o.claim("a", cores=30, memory="10Gi", class_name=class_name))
    controller = quota_controller(kube, cluster.namespace)
    controller.rebuild()  # one list, no watch: the picture sees only this controller's own writes
    work_until(controller, lambda: claim_status(cluster, "a").get("phase") == "Bound")
    assert _used(api_client, cluster.namespace, "team") == 30

    # The other controller's expand, as the API server holds it; this one's picture never hears of it.
    body = quotas.get(api_client, cluster.namespace, "team")
    [charge] = body["status"]["charges"]
    charge.update(cores=50, since="2020-01-01T00:00:00Z")
    body["status"]["used"] = {CORE: 50}
    client.CustomObjectsApi(api_client).replace_namespaced_custom_object_status(
        names.GROUP, names.VERSION, cluster.namespace, names.PLURAL_QUOTA, "team", body)
    gpu = kube.get_gpu(gpu_name)
    [allocation] = gpu["status"]["allocations"]
    assert allocation["claimRef"]["uid"] == created["metadata"]["uid"]
    allocation["cores"] = 50
    kube.replace_gpu_status(gpu)

    controller.quota.resync()
    assert _held(kube, gpu_name, cluster.namespace) == 50
    assert _used(api_client, cluster.namespace, "team") == 50, "the charge was lowered below the reservation"
