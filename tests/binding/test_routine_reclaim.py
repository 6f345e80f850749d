"""Which releases and reclaims are routine (no Normal Event, issue 37): an ElasticGPU the controller
provisioned for a claim (named from the claim's uid) with reclaim policy Delete. A static one, one
that is retained, or one whose name is not its claim's keeps its Events."""

from __future__ import annotations

from typing import Any

import pytest

from elasticgpu.api import ElasticGPU, names
from elasticgpu.controller.flow.binding.elasticgpu_sync import routine_reclaim
from tests.binding import objects as o

UID = "0b5e9c1e-7d3f-4f7a-9a51-3c2e8d6b1f00"
REF = {"apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM, "namespace": "ns", "name": "c", "uid": UID}


def _egpu(name: str, *, reclaim: str | None, claim_ref: dict[str, Any] | None = REF) -> ElasticGPU:
    return ElasticGPU.model_validate(o.share_egpu(name, "gpu-a", claim_ref=claim_ref, reclaim=reclaim))


@pytest.mark.parametrize(("egpu", "routine"), [
    (_egpu(names.elastic_gpu_name_for_claim(UID), reclaim="Delete"), True),
    (_egpu(names.elastic_gpu_name_for_claim(UID), reclaim="Retain"), False),  # an admin must act
    (_egpu(names.elastic_gpu_name_for_claim(UID), reclaim=None), False),  # Retain unless said
    (_egpu("admins-slice", reclaim="Delete"), False),  # static: an admin's object
    (_egpu(names.elastic_gpu_name_for_claim(UID), reclaim="Delete", claim_ref=None), False),
    (_egpu(names.elastic_gpu_name_for_claim(UID), reclaim="Delete", claim_ref={**REF, "uid": ""}), False),
])  # fmt: skip
def test_routine_reclaim(egpu: ElasticGPU, routine: bool) -> None:
    assert routine_reclaim(egpu) is routine
