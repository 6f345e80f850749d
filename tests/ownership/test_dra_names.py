"""The names the DRA driver publishes cards under, and reading a ResourceClaim's allocation back
(`elasticgpu.api.dra_names`): what the controller and the driver agree on."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from elasticgpu.api import dra_names


@given(st.integers(min_value=0, max_value=10_000))
def test_a_device_name_stands_for_its_card(index: int) -> None:
    assert dra_names.card_index(dra_names.device_name(index)) == index
    assert dra_names.card_index(f"{dra_names.device_name(index)}-mig-1g-10gb-0") == index


@given(st.text(max_size=20))
def test_anything_else_is_no_card(text: str) -> None:
    index = dra_names.card_index(text)
    if index is not None:
        assert text == dra_names.device_name(index) or text.startswith(dra_names.device_name(index) + "-")


def test_no_leading_zero_or_sign_is_a_card() -> None:
    assert [dra_names.card_index(n) for n in ("gpu-01", "gpu--1", "gpu-", "GPU-1", "gpu-1x", "nic-1")] == [None] * 6


def _claim(*results: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"namespace": "ml", "name": "c"},
            "status": {"allocation": {"devices": {"results": list(results)}}}}


def test_allocated_cards_reads_our_driver_only() -> None:
    claim = _claim(
        {"request": "gpu", "driver": "gpu.elasticgpu.io", "pool": "node-1", "device": "gpu-2"},
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-1", "device": "gpu-3"},
        {"request": "gpu", "driver": "gpu.elasticgpu.io", "pool": "node-2", "device": "gpu-0-mig-1"},
        {"request": "gpu", "driver": "gpu.elasticgpu.io", "pool": "node-2", "device": "nic-0"},
        {"request": "gpu", "driver": "gpu.elasticgpu.io", "pool": 7, "device": "gpu-1"},
        "not a result",
    )
    assert sorted(dra_names.allocated_cards(claim)) == [("node-1", 2), ("node-2", 0)]
    assert dra_names.pool_name("node-1") == "node-1"


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner,
                                                                               max_size=3), max_leaves=20))
def test_a_claim_of_any_shape_reads_without_error(status: Any) -> None:
    for pool, index in dra_names.allocated_cards({"status": status}):
        assert isinstance(pool, str) and index >= 0


def test_an_unallocated_claim_holds_nothing() -> None:
    assert list(dra_names.allocated_cards({"metadata": {"name": "c"}})) == []
    assert list(dra_names.allocated_cards({"status": {"allocation": None}})) == []
