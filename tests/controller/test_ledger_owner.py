"""The ledger's last check before a GPU write, owner half (docs/dra.md, issue 48): a reservation decided
on a copy of the card from before the platform team set spec.owner to DRA is refused when the picture
already holds the new copy (its newest resourceVersion would pass the server's precondition, and the
CRD refuses a reservation only once status.owner is DRA). Seen on the real kubelet
(tests/realcluster/test_dra_moves.py): a reservation written onto a card whose spec.owner was DRA."""

from __future__ import annotations

from typing import Any

import pytest

from elasticgpu.api import GPUAllocation
from elasticgpu.controller.errors import CardClosed, CardOverfilled
from elasticgpu.controller.picture.reservations import Ledger
from tests.binding import objects as o


def _gpu(allocations: list[str], *, desired: str = "ElasticGPU", effective: str | None = None,
         version: int = 7) -> dict[str, Any]:  # fmt: skip
    body = o.gpu("gpu-0", node="node-1", index=0, allocations=[
        {"elasticGPU": key, "cores": 10, "memory": 1024, "reservedAt": "2026-12-05T00:00:00Z"} for key in allocations])
    body["spec"]["owner"] = desired
    if effective is not None:
        body["status"]["owner"] = effective
    body["metadata"]["resourceVersion"] = str(version)
    return body


def _allocation(key: str, cores: int = 10) -> GPUAllocation:
    return GPUAllocation.model_validate({"elasticGPU": key, "cores": cores, "memory": 1024,
                                         "reservedAt": "2026-12-05T00:00:00Z"})  # fmt: skip


def test_a_reservation_decided_before_the_move_to_dra_started_is_refused_at_the_write() -> None:
    ledger = Ledger()
    ledger.observe_gpu(_gpu([]))
    assert ledger.with_allocation("gpu-0", _allocation("early"))["status"]["allocations"]  # ours: it goes
    # The decision was made; spec.owner changes before the write (the agent's watch or a relist brings it).
    ledger.observe_gpu(_gpu(["held"], desired="DRA", version=8))
    with pytest.raises(CardClosed, match=r"GPU gpu-0: not reserving late: the card is moving to DRA") as refused:
        ledger.with_allocation("gpu-0", _allocation("late"))
    assert isinstance(refused.value, CardOverfilled)  # every writer already re-plans on it
    # What the card already holds may still change or go: the move waits for it to end.
    body = ledger.with_allocation("gpu-0", _allocation("held", cores=20))
    assert [(a["elasticGPU"], a["cores"]) for a in body["status"]["allocations"]] == [("held", 20)]
    assert ledger.without_allocation("gpu-0", "held") is not None


@pytest.mark.parametrize(("desired", "effective"), [("DRA", "DRA"), ("ElasticGPU", "DRA"), ("DRA", "ElasticGPU")])
def test_no_new_reservation_on_a_card_that_is_not_ours_alone(desired: str, effective: str) -> None:
    ledger = Ledger()
    ledger.observe_gpu(_gpu([], desired=desired, effective=effective))
    with pytest.raises(CardClosed, match=f"spec.owner {desired}, status.owner {effective}"):
        ledger.with_allocations("gpu-0", [_allocation("a"), _allocation("b")])
