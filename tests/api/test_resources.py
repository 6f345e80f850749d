"""Parsing claim resources into one normalised GpuRequest."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticgpu.api import GpuRequest, InvalidQuantity, InvalidRequest, names, parse_claim_resources, parse_memory_mib
from elasticgpu.api.quantities import format_memory

CORE, MEMORY, NVIDIA = names.RESOURCE_CORE, names.RESOURCE_MEMORY, names.RESOURCE_NVIDIA_GPU


@pytest.mark.parametrize(
    ("text", "mib"),
    [("8Gi", 8192), ("8192", 8192), (8192, 8192), ("512Mi", 512), ("1Ti", 1048576), ("10G", 9537), ("1.5Gi", 1536)],
)
def test_memory_quantities_read_as_mib(text: object, mib: int) -> None:
    assert parse_memory_mib(text, field="f") == mib


@pytest.mark.parametrize("text", ["ten", "10 Gb", "1.5", "10Qi", True, [1]])
def test_bad_memory_names_the_field(text: object) -> None:
    with pytest.raises(InvalidQuantity, match=r"^spec\.x:"):
        parse_memory_mib(text, field="spec.x")


@given(st.integers(min_value=1, max_value=2**20))
def test_memory_format_round_trips(mib: int) -> None:
    assert parse_memory_mib(format_memory(mib), field="f") == mib


def test_slice_with_cores_and_memory() -> None:
    request, limit = parse_claim_resources({CORE: "30", MEMORY: "10Gi"})
    assert request == GpuRequest.share(30, 10240) == limit
    assert not request.is_whole
    assert request.describe() == "30% cores, 10Gi"


def test_cores_only_gets_memory_in_proportion() -> None:
    request, _ = parse_claim_resources({CORE: 25})
    assert request.memory_mib is None
    assert request.memory_on(16384) == 4096


def test_memory_only_is_best_effort() -> None:
    request, _ = parse_claim_resources({MEMORY: "2Gi"})
    assert request == GpuRequest.share(0, 2048)


@pytest.mark.parametrize(
    ("resources", "cards"), [({NVIDIA: 2}, 2), ({CORE: 300}, 3), ({CORE: 100}, 1), ({CORE: 200, NVIDIA: 2}, 2)]
)
def test_whole_cards(resources: dict[str, object], cards: int) -> None:
    request, _ = parse_claim_resources(resources)
    assert request.is_whole and request.cards == cards and request.cores == 100 * cards
    assert request.memory_on(81920) == 81920


def test_limits_default_to_requests_and_requests_to_limits() -> None:
    assert parse_claim_resources(None, {CORE: 40})[0] == GpuRequest.share(40)
    request, limit = parse_claim_resources({CORE: 20}, {CORE: 60, MEMORY: 1024})
    assert (request.cores, limit.cores, limit.memory_mib) == (20, 60, 1024)


@pytest.mark.parametrize(
    ("requests", "limits", "field"),
    [
        ({CORE: 0}, None, f"spec.resources.requests[{CORE}]"),
        ({CORE: 150}, None, f"spec.resources.requests[{CORE}]"),
        ({CORE: -1}, None, f"spec.resources.requests[{CORE}]"),
        ({MEMORY: 0}, None, f"spec.resources.requests[{MEMORY}]"),
        ({NVIDIA: 0}, None, f"spec.resources.requests[{NVIDIA}]"),
        ({NVIDIA: 2, CORE: 100}, None, f"spec.resources.requests[{CORE}]"),
        ({"nvidia.com/gpumem": 1}, None, "spec.resources.requests[nvidia.com/gpumem]"),
        ({}, None, "spec.resources.requests"),
        ({CORE: 50}, {CORE: 20}, f"spec.resources.limits[{CORE}]"),
        ({CORE: 50}, {NVIDIA: 1}, "spec.resources.limits"),
    ],
)
def test_invalid_requests_name_the_field(
    requests: dict[str, object], limits: dict[str, object] | None, field: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_claim_resources(requests, limits)
    assert caught.value.field == field
    assert str(caught.value).startswith(field + ":")


@given(
    cores=st.integers(min_value=-500, max_value=1000),
    memory=st.one_of(st.none(), st.integers(min_value=-10, max_value=200_000)),
)
def test_parse_accepts_exactly_the_documented_rule(cores: int, memory: int | None) -> None:
    resources: dict[str, object] = {CORE: cores}
    if memory is not None:
        resources[MEMORY] = memory
    valid = (1 <= cores <= 100 or (cores > 100 and cores % 100 == 0)) and (memory is None or memory > 0)
    if not valid:
        with pytest.raises(InvalidRequest):
            parse_claim_resources(resources)
        return
    request, _ = parse_claim_resources(resources)
    assert request.cores == cores
    assert request.cards == (cores // 100 if cores >= 100 else 0)
    assert request.cores_on_card() == min(cores, 100)


def test_a_share_of_nothing_cannot_be_built() -> None:
    with pytest.raises(ValueError, match="needs cores, memory or both"):
        GpuRequest.share(0)
