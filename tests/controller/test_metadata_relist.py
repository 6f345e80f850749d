"""The periodic relist by metadata (issue 49): a relist with nothing changed reads no whole object,
and what no watch delivered (a change, a deletion, a name created again) is still repaired, on the
real local API server.

Whole objects are counted where the client parses answers (`Counting`): an item or an answer
with a spec or a status is a body; PartialObjectMetadata carries neither. Before, every periodic
relist read every object of every kind whole.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from elasticgpu.api import names
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.machinery.metadata_relist import MetadataRelist
from elasticgpu.controller.process.reconciling import Controller
from elasticgpu.controller.settings import ControllerSettings, ResyncSettings
from tests.binding import objects as o
from tests.binding.conftest import Cluster, settle


class Counting(KubeApi):
    """A KubeApi that counts the whole objects its answers carried, and how many answers."""

    bodies = 0

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        answer = super()._call(method, path, **kwargs)
        if method == "GET":
            items = answer.get("items")
            for body in items if isinstance(items, list) else [answer]:
                if "spec" in body or "status" in body:
                    self.bodies += 1
        return answer


def _counting(kube_cluster: Any) -> Counting:
    return Counting.from_kubeconfig(str(kube_cluster.kubeconfig))  # type: ignore[return-value]


def _controller(kube: KubeApi, cluster: Cluster, *, by_metadata: bool = True) -> Controller:
    settings = ControllerSettings(resync=ResyncSettings(relist_by_metadata=by_metadata))
    return Controller(kube, settings, namespace=cluster.namespace)


def _fleet(cluster: Cluster, *, gpus: int, claims: int) -> str:
    """`gpus` cards of a class of this test and `claims` claims of that class, a quarter card each."""
    model = f"T{cluster.prefix}"
    for index in range(gpus):
        cluster.gpu(o.gpu(f"gpu-{cluster.prefix}-{index}", node=f"{cluster.prefix}-node", index=index, model=model))
    class_name = f"{cluster.prefix}-class"
    cluster.klass(o.klass(class_name, provisioner=names.PROVISIONER_GPUSHARE, parameters={"gpuModel": model}))
    for index in range(claims):
        cluster.claim(o.claim(f"c{index}", cores=25, memory="10Gi", class_name=class_name))
    return class_name


def _listed_once(controller: Controller, cluster: Cluster, bound: int) -> None:
    """The controller's picture from one list, worked until `bound` claims are Bound; no watch runs,
    so nothing reaches the picture after this but what a relist fetches."""
    deadline = time.monotonic() + 60
    while True:
        controller.rebuild()
        controller.drain()
        phases = [c.get("status", {}).get("phase") for c in cluster.kube.list_claims(cluster.namespace)]
        if phases.count("Bound") >= bound and not controller.queue.waiting():
            return
        assert time.monotonic() < deadline, f"the claims did not bind: {phases}"


def test_a_relist_with_nothing_changed_reads_no_whole_object(cluster: Cluster, kube_cluster: Any) -> None:
    """Before: the periodic relist read every object whole (here 4 GPUs + 6 claims + 6 ElasticGPUs
    + 1 class + this session's other objects); now none."""
    kube = _counting(kube_cluster)
    try:
        _fleet(cluster, gpus=4, claims=6)
        controller = _controller(kube, cluster)
        settle(controller)  # a list, then the watches: the picture is level with the server
        assert all(c["status"]["phase"] == "Bound" for c in kube.list_claims(cluster.namespace))
        kube.bodies = 0
        controller.resync(relist=True)
        by_metadata = kube.bodies

        full = _controller(kube, cluster, by_metadata=False)
        full.rebuild()
        kube.bodies = 0
        full.resync(relist=True)
        assert kube.bodies >= 4 + 6 + 6 + 1, kube.bodies  # the full relist, for comparison
        assert by_metadata == 0, f"whole objects read by a relist with nothing changed: {by_metadata}"
    finally:
        kube.close()


def test_a_change_and_a_deletion_no_watch_delivered_are_repaired(cluster: Cluster, kube_cluster: Any) -> None:
    kube = _counting(kube_cluster)
    try:
        _fleet(cluster, gpus=3, claims=2)
        controller = _controller(kube, cluster)
        _listed_once(controller, cluster, bound=2)
        spare = f"gpu-{cluster.prefix}-2"
        assert kube.get_gpu(spare).get("status", {}).get("allocations") in (None, [])
        kube.patch_claim(cluster.namespace, "c0", {"metadata": {"labels": {"changed": "while-unwatched"}}})
        kube.delete_gpu(spare)
        assert spare in controller.ledger.gpu_names()

        kube.bodies = 0
        controller.resync(relist=True)
        assert (controller.picture.claim_body(cluster.namespace, "c0") or {})["metadata"].get("labels") == {
            "changed": "while-unwatched"}
        assert spare not in controller.ledger.gpu_names()
        # Before: every object read whole; now the one changed claim (a deletion needs no body).
        assert kube.bodies == 1, kube.bodies
    finally:
        kube.close()


def test_a_name_created_again_is_taken_in_fresh(cluster: Cluster, kube: KubeApi) -> None:
    """A GPU deleted and created again (another uid, another node) while no watch ran: the old one is
    taken in as deleted and the new one as added, read whole alone."""
    _fleet(cluster, gpus=2, claims=0)
    controller = _controller(kube, cluster)
    _listed_once(controller, cluster, bound=0)
    name = f"gpu-{cluster.prefix}-1"
    old_uid = kube.get_gpu(name)["metadata"]["uid"]
    kube.delete_gpu(name)
    again = kube.create_gpu(o.gpu(name, node=f"{cluster.prefix}-other", index=0, model=f"T{cluster.prefix}"))
    assert again["metadata"]["uid"] != old_uid

    relisted = MetadataRelist(informer=controller.informer).relist()
    gpu = controller.ledger.gpu(name)
    assert gpu is not None and gpu.metadata.uid == again["metadata"]["uid"], gpu
    assert gpu.spec.node_name == f"{cluster.prefix}-other"
    done = relisted.kinds["gpu"]
    assert (done.fetched, done.deleted, done.taken_in, done.whole) == (1, 1, 1, False), done


def test_many_changes_list_the_kind_whole(cluster: Cluster, kube: KubeApi) -> None:
    """Past the threshold a kind is listed whole (one list beats a GET each), and taken in the same."""
    _fleet(cluster, gpus=3, claims=0)
    controller = _controller(kube, cluster)
    _listed_once(controller, cluster, bound=0)
    for index in range(3):
        kube.delete_gpu(f"gpu-{cluster.prefix}-{index}")
    name = f"gpu-{cluster.prefix}-0"
    again = kube.create_gpu(o.gpu(name, node=f"{cluster.prefix}-other", model=f"T{cluster.prefix}"))

    relisted = MetadataRelist(informer=controller.informer, fetch_at_most=0).relist()
    done = relisted.kinds["gpu"]
    assert done.whole and done.fetched == 0, done
    gpu = controller.ledger.gpu(name)
    assert gpu is not None and gpu.metadata.uid == again["metadata"]["uid"]
    assert {f"gpu-{cluster.prefix}-{i}" for i in (1, 2)}.isdisjoint(controller.ledger.gpu_names())


def test_the_full_relist_is_one_setting_away() -> None:
    assert ControllerSettings.from_env({}).resync.relist_by_metadata
    assert not ControllerSettings.from_env({"ELASTICGPU_RELIST_BY_METADATA": "false"}).resync.relist_by_metadata
    assert "ELASTICGPU_RELIST_BY_METADATA (true)" in ControllerSettings.environment_help()
    with pytest.raises(ValueError, match="ELASTICGPU_RELIST_BY_METADATA"):
        ControllerSettings.from_env({"ELASTICGPU_RELIST_BY_METADATA": "sometimes"})
