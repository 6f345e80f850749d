"""What the node's ResourceSlice offers: exactly the cards DRA owns (desired and effective), healthy
or of unknown health, each with the attributes and consumable capacity a ResourceClaim selects on."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from elasticgpu.agent.dra import card_owners, slice_content
from elasticgpu.api import dra_names

OWNERS = st.sampled_from([None, "ElasticGPU", "DRA", "dra", ""])


def gpu(index: int, *, desired: str | None = "DRA", effective: str | None = "DRA", health: str | None = None,
        memory: int = 81920) -> dict[str, Any]:  # fmt: skip
    spec: dict[str, Any] = {"index": index, "uuid": f"GPU-{index:04d}", "model": "NVIDIA A100-SXM4-80GB",
                            "memory": memory, "nodeName": "node-a", "numa": index // 4, "pcieRoot": "0000:00:01.0"}
    status: dict[str, Any] = {}
    if desired is not None:
        spec["owner"] = desired
    if effective is not None:
        status["owner"] = effective
    if health is not None:
        status["health"] = health
    return {"metadata": {"name": f"gpu-{index:04d}"}, "spec": spec, "status": status}


def test_a_dra_card_is_a_device_with_its_attributes_and_consumable_capacity() -> None:
    [device] = slice_content.devices([gpu(3)])
    assert device["name"] == "gpu-3"
    assert device["attributes"]["uuid"] == {"string": "GPU-0003"}
    assert device["attributes"]["index"] == {"int": 3}
    assert device["attributes"]["memory"] == {"int": 81920}
    assert device["attributes"]["numa"] == {"int": 0}
    assert device["attributes"]["pcieRoot"] == {"string": "0000:00:01.0"}
    assert device["attributes"]["model"] == {"string": "NVIDIA A100-SXM4-80GB"}
    assert device["allowMultipleAllocations"] is True
    # A claim that names no capacity consumes the whole card: a whole-card claim needs no numbers.
    assert device["capacity"]["cores"]["requestPolicy"]["default"] == "100"
    assert device["capacity"]["memory"] == {"value": "81920Mi", "requestPolicy": {
        "default": "81920Mi", "validRange": {"min": "1Mi", "max": "81920Mi", "step": "1Mi"}}}  # fmt: skip


def test_a_card_is_withdrawn_the_moment_its_desired_owner_leaves_dra() -> None:
    # The controller has not flipped status.owner yet: the card is still DRA's, but no new claim may land.
    assert slice_content.devices([gpu(0, desired="ElasticGPU", effective="DRA")]) == []
    # On its way to DRA (desired DRA, effective still ours): not offered until the move completes.
    assert slice_content.devices([gpu(0, desired="DRA", effective="ElasticGPU")]) == []


def test_objects_without_owner_fields_are_ours() -> None:
    assert slice_content.devices([gpu(0, desired=None, effective=None)]) == []
    assert not card_owners.owner_of({"spec": {}, "status": None}).preparable


@given(cards=st.lists(st.tuples(OWNERS, OWNERS, st.sampled_from([None, "Healthy", "Unhealthy", "Unknown"])),
                      max_size=8))  # fmt: skip
def test_the_slice_holds_exactly_the_healthy_cards_dra_owns_on_both_sides(
    cards: list[tuple[str | None, str | None, str | None]],
) -> None:
    gpus = [gpu(i, desired=d, effective=e, health=h) for i, (d, e, h) in enumerate(cards)]
    offered = {device["name"] for device in slice_content.devices(gpus)}
    expected = {dra_names.device_name(i) for i, (d, e, h) in enumerate(cards)
                if d == "DRA" and e == "DRA" and h != "Unhealthy"}  # fmt: skip
    assert offered == expected
