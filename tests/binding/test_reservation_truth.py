"""The GPU objects are the truth of what is reserved; the allocator's inventory only mirrors them
(plus a batch's tentative reservations). Two ways the mirror used to drift, each of which the
fault test met as "ElasticGPU ... lost its reservation and no longer fits" and a Lost claim:

- a batch's GPU write that the server applied but whose answer was lost (a 500 after the write,
  a dropped connection), with the GPU's watch event arriving before the error: undoing the
  tentative reservation also removed the one the object now held;
- an ElasticGPU sync that found its reservation missing from the inventory (while the object
  held it) failed the ElasticGPU and freed the reservation on the server.
"""

from __future__ import annotations

from typing import Any

from elasticgpu.allocator import CardShare, Placement
from elasticgpu.api import names
from elasticgpu.controller import errors
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.process.reconciling import Controller
from tests.binding import objects as o
from tests.binding.conftest import Cluster, new_controller, settle


class _AnswerLost:
    """The controller's API client, except that its first GPU status write is applied by the
    server, its watch event reaches the controller, and then the call fails as a 500 would."""

    def __init__(self, kube: KubeApi, controller: Controller) -> None:
        self._kube = kube
        self._controller = controller
        self.lost = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kube, name)

    def replace_gpu_status(self, body: dict[str, Any]) -> dict[str, Any]:
        answer = self._kube.replace_gpu_status(body)
        if self.lost:
            return answer
        self.lost += 1
        self._controller.informer.observe("gpu", "MODIFIED", answer)
        raise errors.ApiUnavailable("HTTP 500 after the write was applied", status=500)


def _setup(cluster: Cluster, claims: int, cores: int) -> tuple[str, str]:
    model = f"T{cluster.prefix}"
    gpu_name = f"gpu-{cluster.prefix}-0"
    cluster.gpu(o.gpu(gpu_name, node=f"{cluster.prefix}-node", model=model))
    class_name = f"{cluster.prefix}-class"
    cluster.klass(o.klass(class_name, parameters={"gpuModel": model}))
    for i in range(claims):
        cluster.claim(o.claim(f"c{i}", cores=cores, memory="1Gi", class_name=class_name))
    return gpu_name, class_name


def _allocations(kube: KubeApi, gpu_name: str) -> list[dict[str, Any]]:
    return list((kube.get_gpu(gpu_name).get("status") or {}).get("allocations") or [])


def test_a_batch_write_applied_but_unanswered_keeps_its_reservation_in_the_inventory(
        cluster: Cluster, kube: KubeApi) -> None:
    gpu_name, _ = _setup(cluster, claims=2, cores=25)
    controller = new_controller(kube, cluster.namespace)
    controller.rebuild()
    lossy = _AnswerLost(kube, controller)
    controller.commit.kube = lossy  # type: ignore[assignment]
    planned = [p for i in range(2) if (p := controller.commit.plan_slice(("claim", cluster.namespace, f"c{i}")))]
    assert len(planned) == 2 and {controller.commit.card_of(p) for p in planned} == {gpu_name}
    batch = {gpu_name: planned}

    assert controller.commit.commit_batch(batch) == []  # the answer was lost: nothing counts as committed
    assert lossy.lost == 1
    ledger = controller.picture.ledger
    on_server = {a["elasticGPU"] for a in _allocations(kube, gpu_name)}
    assert on_server == {p.egpu_name for p in batch[gpu_name]}
    for p in batch[gpu_name]:
        # What the object holds, the inventory holds: the next plan must not give that room away.
        assert ledger.held(p.egpu_name) == p.placement
        assert ledger.inventory.reservations.get(p.egpu_name) == p.placement

    controller.commit.kube = kube
    settle(controller)
    for i in range(2):
        assert cluster.get_claim(f"c{i}")["status"]["phase"] == "Bound"
    allocations = _allocations(kube, gpu_name)
    assert sorted(a["elasticGPU"] for a in allocations) == sorted(p.egpu_name for p in batch[gpu_name])


def test_an_elastic_gpu_reserved_on_its_gpu_is_never_failed_for_the_inventory_s_sake(
        cluster: Cluster, kube: KubeApi) -> None:
    gpu_name, _ = _setup(cluster, claims=4, cores=25)  # the card is full
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    claim = cluster.get_claim("c0")
    assert claim["status"]["phase"] == "Bound"
    egpu_name = claim["spec"]["elasticGPUName"]
    ledger = controller.picture.ledger
    placement = ledger.held(egpu_name)
    assert placement is not None

    # The inventory drifts: c0's reservation is missing and a batch in flight tentatively took
    # its room (what the lost answer above used to leave behind).
    ledger.inventory.release(egpu_name)
    tentative = Placement(node=placement.node, cards=(CardShare(uuid=placement.cards[0].uuid, cores=25,
                                                                memory_mib=1024, whole=False),))
    ledger.inventory.reserve("egpu-tentative", tentative)
    controller.elastic_gpus.sync(egpu_name)

    egpu = kube.get_elastic_gpu(egpu_name)
    assert egpu["status"]["phase"] == "Bound", egpu["status"]
    assert egpu_name in {a["elasticGPU"] for a in _allocations(kube, gpu_name)}
    assert cluster.get_claim("c0")["status"]["phase"] == "Bound"

    # The batch fails: its room goes back, and c0's reservation is mirrored again.
    ledger.drop_tentative("egpu-tentative")
    assert ledger.inventory.reservations.get(egpu_name) == placement
    assert "egpu-tentative" not in ledger.inventory.reservations
    settle(controller)
    assert all(cluster.get_claim(f"c{i}")["status"]["phase"] == "Bound" for i in range(4))
    assert sum(a["cores"] for a in _allocations(kube, gpu_name)) == names.CORES_PER_CARD
