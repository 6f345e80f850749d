"""A claim may ask for RDMA NICs with its whole cards (issue 27): the API server stores it, the
model reads it; with a share of one card both refuse it (tests/invalid/95-*, 96-*)."""

from __future__ import annotations

import pytest

from elasticgpu.api.errors import InvalidRequest
from elasticgpu.api.resources import GpuRequest, parse_claim_resources
from tests.crds.objects import Objects

CLAIM = {
    "apiVersion": "elasticgpu.io/v1alpha1",
    "kind": "ElasticGPUClaim",
    "metadata": {"name": "train-8"},
    "spec": {"resources": {"requests": {"nvidia.com/gpu": 8, "elasticgpu.io/rdma": 2}}},
}


def test_server_stores_a_claim_with_rdma(objects: Objects) -> None:
    objects.delete(CLAIM)
    try:
        objects.create(CLAIM)
        stored = objects.get(CLAIM)
        assert stored["spec"]["resources"]["requests"]["elasticgpu.io/rdma"] == 2
    finally:
        objects.delete(CLAIM)


def test_the_model_reads_rdma_with_whole_cards_only() -> None:
    request, limit = parse_claim_resources({"nvidia.com/gpu": 8, "elasticgpu.io/rdma": "2"})
    assert request == limit == GpuRequest.whole(8, rdma=2)
    assert request.describe() == "8 whole cards and 2 RDMA NICs"
    assert parse_claim_resources({"elasticgpu.io/gpu-core": 200, "elasticgpu.io/rdma": 1})[0].rdma == 1
    with pytest.raises(InvalidRequest, match=r"requests\[elasticgpu.io/rdma\].*whole cards only"):
        parse_claim_resources({"elasticgpu.io/gpu-core": 30, "elasticgpu.io/rdma": 1})
    with pytest.raises(InvalidRequest, match=r"limits.*same whole cards and NICs"):
        parse_claim_resources({"nvidia.com/gpu": 2, "elasticgpu.io/rdma": 1}, {"nvidia.com/gpu": 2})
