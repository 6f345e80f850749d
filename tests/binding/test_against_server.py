"""Binding transitions against the API server: objects before -> controller syncs -> objects after."""

from __future__ import annotations

from typing import Any

import pytest

from elasticgpu.api import names
from elasticgpu.controller import errors
from elasticgpu.controller.edge.kube import KubeApi
from tests.binding import objects as o
from tests.binding.conftest import Cluster, new_controller, settle


def _condition(claim: dict[str, Any]) -> dict[str, Any]:
    conditions = (claim.get("status") or {}).get("conditions") or []
    assert len(conditions) == 1, conditions
    return conditions[0]


def _allocations(kube: KubeApi, gpu_name: str) -> list[dict[str, Any]]:
    return (kube.get_gpu(gpu_name).get("status") or {}).get("allocations") or []


def _setup(cluster: Cluster, *, gpus: int = 1, provisioner: str = names.PROVISIONER_GPUSHARE,
           memory: int = 81920, **class_args: Any) -> tuple[list[str], str]:
    model = f"T{cluster.prefix}"
    gpu_names = []
    for index in range(gpus):
        name = f"gpu-{cluster.prefix}-{index}"
        cluster.gpu(o.gpu(name, node=f"{cluster.prefix}-node", index=index, model=model, memory=memory))
        gpu_names.append(name)
    class_name = f"{cluster.prefix}-class"
    cluster.klass(o.klass(class_name, provisioner=provisioner, parameters={"gpuModel": model}, **class_args))
    return gpu_names, class_name


def test_dynamic_share_is_reserved_created_and_bound(cluster: Cluster, kube: KubeApi) -> None:
    gpus, class_name = _setup(cluster)
    created = cluster.claim(o.claim("c1", cores=30, memory="10Gi", class_name=class_name))
    controller = new_controller(kube, cluster.namespace)
    settle(controller)

    claim = cluster.get_claim("c1")
    uid = created["metadata"]["uid"]
    egpu_name = names.elastic_gpu_name_for_claim(uid)
    assert claim["status"]["phase"] == "Bound"
    assert claim["spec"]["elasticGPUName"] == egpu_name
    assert names.FINALIZER_CLAIM_PROTECTION in claim["metadata"]["finalizers"]
    assert claim["status"]["capacity"] == {names.RESOURCE_CORE: 30, names.RESOURCE_MEMORY: "10Gi"}
    assert claim["status"]["nodeName"] == f"{cluster.prefix}-node"
    assert claim["status"]["gpus"] == [gpus[0].upper()]
    assert _condition(claim)["reason"] == "Bound"
    # REASON says why an object is not where it should be: a Bound claim needs none (issue 29).
    assert "reason" not in claim["status"] and egpu_name in claim["status"]["message"]

    egpu = kube.get_elastic_gpu(egpu_name)
    assert egpu["status"]["phase"] == "Bound" and "reason" not in egpu["status"]
    assert egpu["spec"]["claimRef"]["uid"] == uid
    assert egpu["spec"]["gpuShare"] == {"gpuName": gpus[0]}
    assert names.FINALIZER_EGPU_PROTECTION in egpu["metadata"]["finalizers"]
    [allocation] = _allocations(kube, gpus[0])
    assert (allocation["elasticGPU"], allocation["cores"], allocation["memory"]) == (egpu_name, 30, 10240)

    reasons = [e["reason"] for e in kube.list_events(cluster.namespace)]
    assert "Bound" in reasons

    # Idempotent: another round writes nothing new.
    before = cluster.get_claim("c1")["metadata"]["resourceVersion"]
    settle(controller)
    assert cluster.get_claim("c1")["metadata"]["resourceVersion"] == before


def test_no_capacity_is_pending_with_the_allocators_reason(cluster: Cluster, kube: KubeApi) -> None:
    gpus, class_name = _setup(cluster)
    cluster.claim(o.claim("a", cores=80, memory="10Gi", class_name=class_name))
    cluster.claim(o.claim("b", cores=80, memory="10Gi", class_name=class_name))
    settle(new_controller(kube, cluster.namespace))
    phases = sorted(cluster.get_claim(n)["status"]["phase"] for n in ("a", "b"))
    assert phases == ["Bound", "Pending"]
    pending = next(cluster.get_claim(n) for n in ("a", "b") if cluster.get_claim(n)["status"]["phase"] == "Pending")
    condition = _condition(pending)
    assert (condition["type"], condition["reason"]) == ("Pending", "NoCapacity")
    assert "80% cores" in condition["message"]
    assert (pending["status"]["reason"], pending["status"]["message"]) == ("NoCapacity", condition["message"])
    assert sum(a["cores"] for a in _allocations(kube, gpus[0])) == 80


def test_pending_reasons(cluster: Cluster, kube: KubeApi) -> None:
    _gpus, class_name = _setup(cluster)
    cluster.claim(o.claim("noclass", class_name=f"{cluster.prefix}-missing"))
    bad = o.claim("badlimit", cores=30, memory="10Gi", class_name=class_name)
    bad["spec"]["resources"]["limits"] = {names.RESOURCE_CORE: 10}
    try:
        cluster.claim(bad)
        refused_at_apply = ""
    except errors.Rejected as err:  # the CRD's CEL rule refuses it up front (the controller checks too)
        refused_at_apply = str(err)
    foreign = f"{cluster.prefix}-foreign"
    cluster.klass(o.klass(foreign, provisioner="example.com/other"))
    cluster.claim(o.claim("theirs", class_name=foreign))
    settle(new_controller(kube, cluster.namespace))

    assert _condition(cluster.get_claim("noclass"))["reason"] == "ClassNotFound"
    if refused_at_apply:
        assert "spec.resources.limits[elasticgpu.io/gpu-core]" in refused_at_apply
    else:
        invalid = _condition(cluster.get_claim("badlimit"))
        assert invalid["reason"] == "InvalidRequest"
        assert "spec.resources.limits[elasticgpu.io/gpu-core]" in invalid["message"]
    assert "status" not in cluster.get_claim("theirs") or not cluster.get_claim("theirs")["status"]


def test_physical_whole_cards(cluster: Cluster, kube: KubeApi) -> None:
    gpus, class_name = _setup(cluster, gpus=3, provisioner=names.PROVISIONER_PHYSICAL)
    cluster.claim(o.claim("two", cards=2, class_name=class_name))
    settle(new_controller(kube, cluster.namespace))
    claim = cluster.get_claim("two")
    assert claim["status"]["phase"] == "Bound"
    egpu = kube.get_elastic_gpu(claim["spec"]["elasticGPUName"])
    assert len(egpu["spec"]["physicalGPU"]["gpuNames"]) == 2
    held = [g for g in gpus if _allocations(kube, g)]
    assert len(held) == 2
    assert all(_allocations(kube, g)[0]["exclusive"] for g in held)


def test_admin_elastic_gpu_available_then_bound_by_name(cluster: Cluster, kube: KubeApi) -> None:
    gpus, _class_name = _setup(cluster)
    cluster.egpu(o.share_egpu(f"{cluster.prefix}-e1", gpus[0], cores=50, memory="20Gi"))
    cluster.egpu(o.share_egpu(f"{cluster.prefix}-e2", gpus[0], cores=60, memory="20Gi"))
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    e1 = kube.get_elastic_gpu(f"{cluster.prefix}-e1")
    e2 = kube.get_elastic_gpu(f"{cluster.prefix}-e2")
    assert {e1["status"]["phase"], e2["status"]["phase"]} == {"Available", "Failed"}
    failed = e1 if e1["status"]["phase"] == "Failed" else e2
    available = e2 if failed is e1 else e1
    assert failed["status"]["reason"] == "DoesNotFit" and "cores free" in failed["status"]["message"]

    cluster.claim(o.claim("static", cores=40, memory="10Gi", egpu=available["metadata"]["name"]))
    settle(controller)
    claim = cluster.get_claim("static")
    assert claim["status"]["phase"] == "Bound"
    bound = kube.get_elastic_gpu(available["metadata"]["name"])
    assert bound["status"]["phase"] == "Bound"
    assert bound["spec"]["claimRef"]["uid"] == claim["metadata"]["uid"]
    # The reservation made while it was Available now names the claim too (with its uid).
    [allocation] = [a for a in _allocations(kube, gpus[0]) if a["elasticGPU"] == available["metadata"]["name"]]
    assert allocation["claimRef"]["uid"] == claim["metadata"]["uid"]


def test_release_delete_frees_and_retain_keeps(cluster: Cluster, kube: KubeApi) -> None:
    gpus, class_name = _setup(cluster)
    keep_class = f"{cluster.prefix}-keep"
    cluster.klass(o.klass(keep_class, parameters={"gpuModel": f"T{cluster.prefix}"}, reclaim="Retain"))
    cluster.claim(o.claim("gone", cores=20, memory="5Gi", class_name=class_name))
    cluster.claim(o.claim("kept", cores=20, memory="5Gi", class_name=keep_class))
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    gone_egpu = cluster.get_claim("gone")["spec"]["elasticGPUName"]
    kept_egpu = cluster.get_claim("kept")["spec"]["elasticGPUName"]
    kube.delete_claim(cluster.namespace, "gone")
    kube.delete_claim(cluster.namespace, "kept")
    settle(controller)

    for name in ("gone", "kept"):
        try:
            cluster.get_claim(name)
            raise AssertionError(f"claim {name} still exists")
        except errors.NotFound:
            pass
    try:
        kube.get_elastic_gpu(gone_egpu)
        raise AssertionError("the Delete ElasticGPU still exists")
    except errors.NotFound:
        pass
    assert kube.get_elastic_gpu(kept_egpu)["status"]["phase"] == "Released"
    assert [a["elasticGPU"] for a in _allocations(kube, gpus[0])] == [kept_egpu]


def test_gpu_that_disappears_fails_elastic_gpu_and_loses_claim(cluster: Cluster, kube: KubeApi) -> None:
    """The card goes: the ElasticGPU fails and its claim is Lost. Then the claim is deleted: its
    Failed ElasticGPU is Released and reclaimed by its policy (the class's Delete: deleted), not
    kept Failed for ever beside no claim."""
    gpus, class_name = _setup(cluster)
    cluster.claim(o.claim("c", class_name=class_name))
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    egpu_name = cluster.get_claim("c")["spec"]["elasticGPUName"]
    kube.delete_gpu(gpus[0])
    settle(controller)
    egpu = kube.get_elastic_gpu(egpu_name)
    assert (egpu["status"]["phase"], egpu["status"]["reason"]) == ("Failed", "GPUNotFound")
    claim = cluster.get_claim("c")
    assert claim["status"]["phase"] == "Lost"
    assert _condition(claim)["reason"] == "ElasticGPUFailed"

    kube.delete_claim(cluster.namespace, "c")
    settle(controller)
    with pytest.raises(errors.NotFound):
        cluster.get_claim("c")
    with pytest.raises(errors.NotFound):
        kube.get_elastic_gpu(egpu_name)


def test_crash_after_reservation_reuses_it(cluster: Cluster, kube: KubeApi) -> None:
    gpus, class_name = _setup(cluster)
    created = cluster.claim(o.claim("c", cores=30, memory="10Gi", class_name=class_name))
    egpu_name = names.elastic_gpu_name_for_claim(created["metadata"]["uid"])
    body = kube.get_gpu(gpus[0])
    body["status"] = {"allocations": [{"elasticGPU": egpu_name, "cores": 30, "memory": 10240}]}
    kube.replace_gpu_status(body)  # what a controller that died after the commit point left
    settle(new_controller(kube, cluster.namespace))
    assert cluster.get_claim("c")["status"]["phase"] == "Bound"
    assert [a["elasticGPU"] for a in _allocations(kube, gpus[0])] == [egpu_name]


def test_orphan_reservation_is_freed_after_the_grace(cluster: Cluster, kube: KubeApi) -> None:
    gpus, _class_name = _setup(cluster)
    body = kube.get_gpu(gpus[0])
    body["status"] = {"allocations": [{"elasticGPU": f"egpu-{cluster.prefix}-orphan", "cores": 30, "memory": 10}]}
    kube.replace_gpu_status(body)
    controller = new_controller(kube, cluster.namespace, grace_s=0.0)
    controller.resync()
    controller.drain()
    assert _allocations(kube, gpus[0]) == []


def test_a_reservation_whose_claim_is_still_binding_is_not_an_orphan(cluster: Cluster, kube: KubeApi) -> None:
    # The commit point passed, the ElasticGPU's create failed (API errors, then backoff longer
    # than the grace): the resync must leave the reservation to the claim's own sync. Freeing it
    # (as it did) let that sync create the ElasticGPU right after, with no reservation under it.
    gpus, class_name = _setup(cluster)
    created = cluster.claim(o.claim("slow", cores=30, memory="10Gi", class_name=class_name))
    egpu_name = names.elastic_gpu_name_for_claim(created["metadata"]["uid"])
    claim_ref = {"namespace": cluster.namespace, "name": "slow", "uid": created["metadata"]["uid"]}
    body = kube.get_gpu(gpus[0])
    body["status"] = {"allocations": [
        {"elasticGPU": egpu_name, "claimRef": claim_ref, "cores": 30, "memory": 10240, "exclusive": False,
         "reservedAt": "2026-01-01T00:00:00Z"},
        {"elasticGPU": f"egpu-{cluster.prefix}-gone", "cores": 10, "memory": 10, "exclusive": False,
         "claimRef": {"namespace": cluster.namespace, "name": "gone", "uid": "no-such-uid"},
         "reservedAt": "2026-01-01T00:00:00Z"},
    ]}  # fmt: skip
    kube.replace_gpu_status(body)
    controller = new_controller(kube, cluster.namespace, grace_s=0.0)
    controller.rebuild()  # the picture, no sync yet: as when the claim's retry is backed off
    controller.resync(relist=False)
    assert [a["elasticGPU"] for a in _allocations(kube, gpus[0])] == [egpu_name]  # the claim's kept
    settle(controller)
    assert cluster.get_claim("slow")["status"]["phase"] == "Bound"
    assert [a["elasticGPU"] for a in _allocations(kube, gpus[0])] == [egpu_name]


def test_two_controllers_never_oversubscribe(cluster: Cluster, kube: KubeApi) -> None:
    gpus, class_name = _setup(cluster)
    first = new_controller(kube, cluster.namespace)
    second = new_controller(kube, cluster.namespace)
    cluster.claim(o.claim("a", cores=80, memory="10Gi", class_name=class_name))
    cluster.claim(o.claim("b", cores=80, memory="10Gi", class_name=class_name))
    first.rebuild()
    second.rebuild()  # both pictures say the card is empty
    first.sync(("claim", cluster.namespace, "a"))
    second.sync(("claim", cluster.namespace, "b"))  # stale: its write conflicts, it re-plans
    second.drain()
    settle(first)
    settle(second)
    assert sum(a["cores"] for a in _allocations(kube, gpus[0])) == 80
    phases = sorted(cluster.get_claim(n)["status"]["phase"] for n in ("a", "b"))
    assert phases == ["Bound", "Pending"]


def test_claim_used_by_a_pod_keeps_its_finalizer(cluster: Cluster, kube: KubeApi, api_client: Any) -> None:
    from kubernetes import client

    _gpus, class_name = _setup(cluster)
    cluster.claim(o.claim("used", class_name=class_name))
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    core = client.CoreV1Api(api_client)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        # labelled as the admission webhook labels it: the controller watches only such pods
        "metadata": {"name": "p", "annotations": {names.claim_annotation("main"): "used"},
                     "labels": {names.LABEL_USES_CLAIMS: "true"}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }
    core.create_namespaced_pod(cluster.namespace, pod)
    kube.delete_claim(cluster.namespace, "used")
    settle(controller)
    claim = cluster.get_claim("used")  # still there: the pod may be using the GPU
    assert names.FINALIZER_CLAIM_PROTECTION in claim["metadata"]["finalizers"]
    assert any(c["reason"] == "ClaimInUse" for c in claim["status"]["conditions"])

    core.delete_namespaced_pod("p", cluster.namespace, grace_period_seconds=0, _preload_content=False)
    settle(controller)
    try:
        cluster.get_claim("used")
        raise AssertionError("claim still exists after its pod is gone")
    except errors.NotFound:
        pass


def test_claim_without_class_uses_the_default_class(cluster: Cluster, kube: KubeApi) -> None:
    model = f"T{cluster.prefix}"
    cluster.gpu(o.gpu(f"gpu-{cluster.prefix}-0", node=f"{cluster.prefix}-node", model=model))
    default = f"{cluster.prefix}-default"
    cluster.klass(o.klass(default, default=True, parameters={"gpuModel": model}))
    cluster.claim(o.claim("plain", cores=10, memory="1Gi"))
    settle(new_controller(kube, cluster.namespace))
    claim = cluster.get_claim("plain")
    assert claim["status"]["phase"] == "Bound"
    egpu = kube.get_elastic_gpu(claim["spec"]["elasticGPUName"])
    assert egpu["spec"]["elasticGPUClassName"] == default
    # what kubectl get shows: the class the claim was bound under, the ElasticGPU's cards as
    # text and its claim as namespace/name
    assert claim["spec"]["elasticGPUClassName"] == default
    assert egpu["status"]["gpuList"] == f"gpu-{cluster.prefix}-0".upper()
    assert egpu["status"]["claim"] == f"{cluster.namespace}/plain"


def test_selector_binds_to_a_labelled_admin_elastic_gpu(cluster: Cluster, kube: KubeApi) -> None:
    gpus, class_name = _setup(cluster)
    name = f"{cluster.prefix}-labelled"
    cluster.egpu(o.share_egpu(name, gpus[0], cores=40, class_name=class_name, labels={"tier": "gold"}))
    cluster.claim(o.claim("sel", cores=30, memory="10Gi", class_name=class_name,
                          selector={"matchLabels": {"tier": "gold"}}))
    settle(new_controller(kube, cluster.namespace))
    claim = cluster.get_claim("sel")
    assert claim["status"]["phase"] == "Bound"
    assert claim["spec"]["elasticGPUName"] == name


def test_relist_never_rolls_the_picture_back(cluster: Cluster, kube: KubeApi) -> None:
    """A list read while watch events and write answers arrive must not replace newer copies
    with older ones, nor drop an object created after the list's snapshot; an object the list
    proves deleted is dropped."""
    _gpus, class_name = _setup(cluster)
    created = cluster.claim(o.claim("kept", cores=30, memory="10Gi", class_name=class_name))
    gone = cluster.claim(o.claim("gone", cores=30, memory="10Gi", class_name=class_name))
    controller = new_controller(kube, cluster.namespace)
    controller.rebuild()
    version = int(created["metadata"]["resourceVersion"])

    # As if a watch had delivered a change the next list does not hold yet (a newer version)...
    newer = {**created, "metadata": {**created["metadata"], "resourceVersion": str(version + 10_000),
                                     "labels": {"seen": "by-watch"}}}
    controller.observe("claim", "MODIFIED", newer)
    # ...and a claim created after the list's snapshot.
    young = o.claim("young", cores=30, memory="10Gi", class_name=class_name)
    young["metadata"].update(namespace=cluster.namespace, resourceVersion=str(version + 10_000))
    controller.observe("claim", "ADDED", young)
    # "gone" is deleted on the server (finalizer-free: nothing bound it).
    kube.delete_claim(cluster.namespace, "gone")

    controller.rebuild()

    kept = controller.claim(cluster.namespace, "kept")
    assert kept is not None and kept.metadata.labels == {"seen": "by-watch"}
    assert controller.claim(cluster.namespace, "young") is not None
    assert controller.claim(cluster.namespace, gone["metadata"]["name"]) is None


def test_a_deletion_the_watch_delivered_is_not_undone_by_an_older_copy(cluster: Cluster, kube: KubeApi) -> None:
    """The informer race: a list read before a deletion (or a write answer that arrives after
    it) still holds the object; merging it must not bring the object back."""
    gpus, class_name = _setup(cluster)
    zombie = cluster.claim(o.claim("zombie", cores=30, memory="10Gi", class_name=class_name))
    controller = new_controller(kube, cluster.namespace)
    controller.rebuild()
    assert controller.claim(cluster.namespace, "zombie") is not None
    gpu = kube.get_gpu(gpus[0])
    later = str(int(zombie["metadata"]["resourceVersion"]) + 10_000)

    # Deletions delivered by a watch, at a resourceVersion the next list has not reached yet.
    controller.observe("claim", "DELETED", {**zombie, "metadata": {**zombie["metadata"], "resourceVersion": later}})
    controller.observe("gpu", "DELETED", {**gpu, "metadata": {**gpu["metadata"], "resourceVersion": later}})
    controller.rebuild()  # the server still holds both: the list is "older" than the deletions
    assert controller.claim(cluster.namespace, "zombie") is None
    assert controller.ledger.gpu(gpus[0]) is None
    controller.observe("claim", "MODIFIED", zombie)  # e.g. a write answer that arrives late
    assert controller.claim(cluster.namespace, "zombie") is None

    # A claim of that name created after the deletion is a new object: it is taken in.
    reborn = {**zombie, "metadata": {**zombie["metadata"], "resourceVersion": str(int(later) + 1)}}
    controller.observe("claim", "ADDED", reborn)
    assert controller.claim(cluster.namespace, "zombie") is not None


def test_a_pod_reported_deleted_by_the_label_selected_watch_but_alive_keeps_its_claim(
        cluster: Cluster, kube: KubeApi, api_client: Any) -> None:
    """Issue 15 item 4: the controller watches only pods labelled elasticgpu.io/uses-claims=true, so a pod
    whose label is removed arrives as DELETED. A GET must confirm it is gone before its claims lose it.
    (The pod is created without the label, as if it had been removed: the immutable-label policy, when
    installed, refuses the removal itself; the watch's DELETED event is fed as the watch would send it.)"""
    from kubernetes import client

    _gpus, class_name = _setup(cluster)
    cluster.claim(o.claim("used", class_name=class_name))
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    core = client.CoreV1Api(api_client)
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "annotations": {names.claim_annotation("main"): "used"}},
           "spec": {"containers": [{"name": "main", "image": "busybox"}]}}
    created = client.ApiClient().sanitize_for_serialization(core.create_namespaced_pod(cluster.namespace, pod))
    labelled = {**created, "metadata": {**created["metadata"], "labels": {names.LABEL_USES_CLAIMS: "true"}}}
    controller.observe("pod", "ADDED", labelled)  # what the watch delivered while it carried the label
    kube.delete_claim(cluster.namespace, "used")
    settle(controller)
    assert names.FINALIZER_CLAIM_PROTECTION in cluster.get_claim("used")["metadata"]["finalizers"]

    controller.observe("pod", "DELETED", labelled)  # the label went: the watch says DELETED
    settle(controller)
    claim = cluster.get_claim("used")  # the pod still runs: the claim stays in use
    assert names.FINALIZER_CLAIM_PROTECTION in claim["metadata"]["finalizers"]
    assert any(c["reason"] == "ClaimInUse" for c in claim["status"]["conditions"])
    controller.resync()  # a relist: the label-selected list lacks the pod, a GET finds it alive
    settle(controller)
    assert names.FINALIZER_CLAIM_PROTECTION in cluster.get_claim("used")["metadata"]["finalizers"]

    core.delete_namespaced_pod("p", cluster.namespace, grace_period_seconds=0, _preload_content=False)
    controller.resync()  # no watch event comes for an unlabelled pod: the relist's GET finds it gone
    settle(controller)
    try:
        cluster.get_claim("used")
        raise AssertionError("claim still exists after its pod is gone")
    except errors.NotFound:
        pass
