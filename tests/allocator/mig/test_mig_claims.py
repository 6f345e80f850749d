"""A claim of a `partitioning: MIG` class: the profile it maps to and what it receives, the
NeverFits message naming the largest profile, the class rules, and no resize in place."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticgpu.allocator import resize
from elasticgpu.allocator.mig import claims
from elasticgpu.api import GPU, ElasticGPUClaim, ElasticGPUClass, GpuRequest, InvalidSpec, names

A100 = ("NVIDIA A100-SXM4-80GB", 81920)


@pytest.mark.parametrize(
    ("request_", "profile", "cores", "memory"),
    [
        (GpuRequest.share(10, 4096), "1g.10gb", 14, 10240),
        (GpuRequest.share(10, 16384), "1g.20gb", 14, 20480),
        (GpuRequest.share(30, 10240), "3g.40gb", 42, 40960),
        (GpuRequest.share(50), "4g.40gb", 57, 40960),
        (GpuRequest.whole(1), "7g.80gb", 100, 81920),
    ],
)
def test_claim_gets_the_smallest_covering_profile(request_: GpuRequest, profile: str, cores: int, memory: int) -> None:
    size = claims.size_on(request_, card_model=A100[0], card_memory_mib=A100[1])
    assert isinstance(size, claims.MigSize)
    assert (size.profile.name, size.cores, size.memory_mib) == (profile, cores, memory)


@given(cores=st.integers(1, 100), memory=st.one_of(st.none(), st.integers(1, 81920)))
def test_what_a_claim_receives_covers_what_it_asked(cores: int, memory: int | None) -> None:
    request = GpuRequest.share(cores, memory)
    size = claims.size_on(request, card_model=A100[0], card_memory_mib=A100[1])
    assert isinstance(size, claims.MigSize)
    assert size.cores >= cores or size.profile.compute == 7
    assert size.memory_mib >= request.memory_on(A100[1])


def test_no_profile_covers_names_the_largest() -> None:
    why = claims.size_on(GpuRequest.share(50, 90_000), card_model=A100[0], card_memory_mib=A100[1])
    assert isinstance(why, str)
    assert "7g.80gb" in why and "A100-80GB" in why
    assert "cannot be partitioned" in str(claims.size_on(GpuRequest.share(10), card_model="Tesla T4",
                                                         card_memory_mib=15360))


def _class(**fields: Any) -> ElasticGPUClass:
    return ElasticGPUClass.model_validate({"metadata": {"name": "mig"}, "provisioner": names.PROVISIONER_GPUSHARE,
                                           "partitioning": "MIG", **fields})


def test_class_rules() -> None:
    _class().check()
    assert _class().is_mig
    with pytest.raises(InvalidSpec, match="partitioning"):
        _class(provisioner=names.PROVISIONER_PHYSICAL).check()
    with pytest.raises(InvalidSpec, match="allowClaimResize"):
        _class(allowClaimResize=True).check()


def _bound(cores: int, memory: int) -> tuple[ElasticGPUClaim, GPU, Any]:
    gpu = GPU.model_validate({
        "metadata": {"name": "gpu-a"},
        "spec": {"index": 0, "uuid": "GPU-A", "model": A100[0], "memory": A100[1], "nodeName": "n1"},
        "status": {"allocations": [{"elasticGPU": "egpu-mine", "cores": 42, "memory": 40960}]},
    })
    claim = ElasticGPUClaim.model_validate({
        "metadata": {"name": "c", "namespace": "ns", "uid": "u1"},
        "spec": {"resources": {"requests": {names.RESOURCE_CORE: cores, names.RESOURCE_MEMORY: memory}},
                 "elasticGPUName": "egpu-mine"},
        "status": {"phase": "Bound", "partition": {"profile": "3g.40gb", "cores": 42, "memory": 40960, "start": 4}},
    })
    return claim, gpu, gpu.status.allocations[0]


def test_a_mig_claim_cannot_resize_in_place() -> None:
    claim, gpu, held = _bound(60, 10240)
    decision = resize.decide_resize(claim, gpus=[gpu], allocations=[held])
    assert isinstance(decision, resize.Refuse)
    assert decision.reason == resize.REASON_MIG
    assert "3g.40gb" in decision.message and "cannot resize in place" in decision.message
    claim, gpu, held = _bound(20, 10240)  # smaller: another profile (2g.20gb) would be another instance too
    assert isinstance(resize.decide_resize(claim, gpus=[gpu], allocations=[held]), resize.Refuse)
    claim, gpu, held = _bound(35, 30720)  # still 3g.40gb: what it holds
    assert isinstance(resize.decide_resize(claim, gpus=[gpu], allocations=[held]), resize.Settle)
