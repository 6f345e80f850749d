"""The periodic resync at rest (issue 49 item 2): work that follows the changes, not the objects.

A resync pass used to queue every GPU, ElasticGPU and claim; at 40,000 cards and 50,000 Bound
claims that is ~3,300 syncs a second doing nothing. Now a key whose last sync settled is looked
at again only when something changes it, a relist finds it changed, its own timer is due, or the
slow walk comes round (`flow/machinery/settled.py`). These tests hold the first on the real
local API server and check that what the blanket walk repaired is still repaired.
"""

from __future__ import annotations

import time

from elasticgpu.api import names
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.process.reconciling import Controller
from elasticgpu.controller.settings import ControllerSettings, RecommendSettings, ResyncSettings
from tests.binding import objects as o
from tests.binding.conftest import Cluster, settle

CORE, MEMORY = names.RESOURCE_CORE, names.RESOURCE_MEMORY
INTERVAL_S = ResyncSettings.interval_s
ONE_A_PASS = 1.0 / INTERVAL_S
"""A walk of one settled key per resync pass (`settled_walk_per_s` x `interval_s`)."""


def _controller(kube: KubeApi, cluster: Cluster, **recommend: float) -> Controller:
    settings = ControllerSettings(resync=ResyncSettings(settled_walk_per_s=ONE_A_PASS, orphan_grace_s=0.0),
                                  recommend=RecommendSettings(min_samples=3, **recommend))
    return Controller(kube, settings, namespace=cluster.namespace)


def _class(cluster: Cluster, gpus: int, **fields: object) -> str:
    model = f"T{cluster.prefix}"
    for index in range(gpus):
        cluster.gpu(o.gpu(f"gpu-{cluster.prefix}-{index}", node=f"{cluster.prefix}-node", index=index, model=model))
    name = f"{cluster.prefix}-class"
    cluster.klass({**o.klass(name, provisioner=names.PROVISIONER_GPUSHARE, parameters={"gpuModel": model}),
                   **fields})
    return name


def _syncs_in_one_pass(controller: Controller) -> int:
    controller.resync(relist=False)
    return controller.drain()


def test_a_resync_pass_does_not_grow_with_settled_bound_claims(cluster: Cluster, kube: KubeApi) -> None:
    # 25 % cores and 10 GiB each: four a card, 12 claims on 3 cards. Before: a pass synced every
    # GPU, ElasticGPU and claim, 9 keys with 3 claims and 27 with 12 (3 GPUs + 2 x claims).
    class_name = _class(cluster, 3)
    controller = _controller(kube, cluster)
    passes = []
    made = 0
    for count in (3, 12):
        for index in range(made, count):
            cluster.claim(o.claim(f"c{index}", cores=25, memory="10Gi", class_name=class_name))
        made = count
        settle(controller)
        assert all(cluster.get_claim(f"c{i}")["status"]["phase"] == "Bound" for i in range(count))
        _syncs_in_one_pass(controller)  # the keys the bind's last writes left unsettled settle here
        passes.append(_syncs_in_one_pass(controller))
    assert passes == [1, 1], f"syncs per resync pass with 3 and 12 settled Bound claims: {passes}"


def test_a_claim_whose_elastic_gpu_vanished_unseen_becomes_lost_at_the_relist(cluster: Cluster,
                                                                              kube: KubeApi) -> None:
    """No watch delivers the deletion: the relist finds the ElasticGPU gone and wakes its settled claim."""
    class_name = _class(cluster, 1)
    cluster.claim(o.claim("c", class_name=class_name))
    controller = _controller(kube, cluster)
    deadline = time.monotonic() + 30
    while True:  # lists and no watches: nothing arrives but what a list fetches
        controller.rebuild()
        controller.drain()
        if cluster.get_claim("c").get("status", {}).get("phase") == "Bound" and not controller.queue.waiting():
            break
        assert time.monotonic() < deadline, "the claim did not bind"
    _syncs_in_one_pass(controller)
    egpu_name = cluster.get_claim("c")["spec"]["elasticGPUName"]
    assert controller.queue.settled.is_settled(("claim", cluster.namespace, "c"))
    kube.patch_elastic_gpu(egpu_name, {"metadata": {"finalizers": []}})
    kube.delete_elastic_gpu(egpu_name)

    assert _syncs_in_one_pass(controller) <= 1  # without a relist nothing shows the deletion
    controller.resync(relist=True)
    controller.drain()
    claim = cluster.get_claim("c")
    assert claim["status"]["phase"] == "Lost", claim["status"]


def test_an_orphan_reservation_beside_settled_claims_is_freed(cluster: Cluster, kube: KubeApi) -> None:
    class_name = _class(cluster, 1)
    cluster.claim(o.claim("c", cores=25, memory="10Gi", class_name=class_name))
    controller = _controller(kube, cluster)
    settle(controller)
    gpu_name = f"gpu-{cluster.prefix}-0"
    body = kube.get_gpu(gpu_name)
    kept = body["status"]["allocations"]
    body["status"]["allocations"] = [*kept, {"elasticGPU": f"egpu-{cluster.prefix}-orphan", "cores": 25,
                                             "memory": 10240, "reservedAt": "2026-01-01T00:00:00Z"}]
    kube.replace_gpu_status(body)
    settle(controller)  # the watch delivers the GPU; its sync writes nothing: the GPU settles
    controller.resync(relist=False)
    controller.drain()
    allocations = kube.get_gpu(gpu_name)["status"]["allocations"]
    assert [a["elasticGPU"] for a in allocations] == [a["elasticGPU"] for a in kept]


def test_a_time_based_auto_shrink_fires_without_the_blanket_walk(cluster: Cluster, kube: KubeApi) -> None:
    """Auto shrinks only after `shrink_after_s` of watching: nothing changes then, and the resync no
    longer comes round to a settled claim, so the recommender's own timer must bring it back.
    Before: nothing brought it back but the resync (the claim kept its 80 % here)."""
    class_name = _class(cluster, 1, allowClaimResize=True, resizePolicy="Auto")
    cluster.claim(o.claim("c", cores=80, memory="8Gi", class_name=class_name))
    controller = _controller(kube, cluster, shrink_after_s=8.0)
    settle(controller)
    began = time.monotonic()
    for second, (cores, memory) in enumerate([(10, 1000), (14, 1100), (10, 900)]):
        kube.patch_claim_status(cluster.namespace, "c", {"status": {"usage": {
            "coresUsed": cores, "memoryUsed": memory, "updateTime": f"2026-01-01T00:00:{second:02d}Z"}}})
        settle(controller)
    assert time.monotonic() - began < 8.0, "too slow a machine: the watch was long enough already"
    claim = cluster.get_claim("c")
    assert claim["status"]["recommendation"]["state"] == "OverSized"
    assert claim["spec"]["resources"]["requests"] == {CORE: 80, MEMORY: "8Gi"}  # watched too short to shrink

    deadline = time.monotonic() + 30
    while cluster.get_claim("c")["spec"]["resources"]["requests"] == {CORE: 80, MEMORY: "8Gi"}:
        assert time.monotonic() < deadline, "the Auto shrink never came: no timer brought the claim back"
        controller.drain()
        time.sleep(0.2)
    settle(controller)
    claim = cluster.get_claim("c")
    assert claim["spec"]["resources"]["requests"] == {CORE: 20, MEMORY: "1536Mi"}, claim["spec"]
    assert claim["status"]["capacity"] == {CORE: 20, MEMORY: "1536Mi"}, claim["status"]
