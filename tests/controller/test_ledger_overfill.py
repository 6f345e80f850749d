"""The ledger's last check before a GPU write: whatever decided a reservation, and on whatever
copy of the card, the body it builds never puts the card over 100% cores or its memory, nor
beside a whole-card claim, unless the card was already over and the write only keeps or lowers
what it holds. The Ledger does no I/O: these tests feed it GPU objects as the API server would."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elasticgpu.api import GPUAllocation
from elasticgpu.controller.errors import CardOverfilled
from elasticgpu.controller.picture.reservations import Ledger
from tests.binding import objects as o

MEMORY = 81920  # o.gpu's card memory, MiB


def _gpu(allocations: list[tuple[str, int, int, bool]], version: int = 7) -> dict[str, Any]:
    body = o.gpu("gpu-0", node="node-1", index=0, allocations=[
        {"elasticGPU": key, "cores": cores, "memory": memory, "exclusive": whole,
         "reservedAt": "2026-12-05T00:00:00Z"} for key, cores, memory, whole in allocations])
    body["metadata"]["resourceVersion"] = str(version)
    return body


def _allocation(key: str, cores: int, memory: int, whole: bool = False) -> GPUAllocation:
    return GPUAllocation.model_validate({"elasticGPU": key, "cores": cores, "memory": memory, "exclusive": whole,
                                         "reservedAt": "2026-12-05T00:00:00Z"})


def _sums(body: dict[str, Any]) -> tuple[int, int]:
    allocations = body["status"]["allocations"]
    return sum(a["cores"] for a in allocations), sum(a["memory"] for a in allocations)


def test_memory_is_the_card_memory_of_the_fixture() -> None:
    assert o.gpu("gpu-0", node="node-1", index=0)["spec"]["memory"] == MEMORY


@settings(max_examples=300, deadline=None)
@given(held=st.lists(st.tuples(st.integers(1, 100), st.integers(1, MEMORY)), max_size=5),
       wanted=st.tuples(st.integers(0, 5), st.integers(1, 100), st.integers(1, MEMORY)))
def test_a_write_never_leaves_a_card_fuller_than_its_capacity_and_fuller_than_it_was(
        held: list[tuple[int, int]], wanted: tuple[int, int, int]) -> None:
    ledger = Ledger()
    ledger.observe_gpu(_gpu([(f"k{i}", cores, memory, False) for i, (cores, memory) in enumerate(held)]))
    index, cores, memory = wanted
    before = (sum(c for c, _m in held), sum(m for _c, m in held))
    try:
        body = ledger.with_allocation("gpu-0", _allocation(f"k{index}", cores, memory))
    except CardOverfilled as refused:
        assert "GPU gpu-0" in str(refused) and "deciding again" in str(refused)
        replaced = held[index] if index < len(held) else (0, 0)
        after = (before[0] - replaced[0] + cores, before[1] - replaced[1] + memory)
        assert after[0] > 100 or after[1] > MEMORY, (held, wanted)
        assert after[0] > before[0] or after[1] > before[1] or index >= len(held)
        return
    after = _sums(body)
    assert body["metadata"]["resourceVersion"] == "7"
    assert (after[0] <= 100 and after[1] <= MEMORY) or (after[0] <= before[0] and after[1] <= before[1]), \
        (held, wanted, after)


def test_nothing_goes_beside_a_whole_card_claim_and_a_whole_card_only_on_an_empty_card() -> None:
    ledger = Ledger()
    ledger.observe_gpu(_gpu([("whole", 100, MEMORY, True)]))
    with pytest.raises(CardOverfilled, match="beside a whole-card claim"):
        ledger.with_allocations("gpu-0", [_allocation("small", 0, 0)])
    # Re-stamping the whole-card claim (its claimRef, same size) is no growth.
    assert _sums(ledger.with_allocation("gpu-0", _allocation("whole", 100, MEMORY, True))) == (100, MEMORY)

    ledger.observe_gpu(_gpu([("slice", 10, 1024, False)], version=8))
    with pytest.raises(CardOverfilled):
        ledger.with_allocation("gpu-0", _allocation("whole", 100, MEMORY, True))


def _instance(key: str, start: int) -> GPUAllocation:
    return GPUAllocation.model_validate({"elasticGPU": key, "cores": 42, "memory": 40960,
                                         "partition": {"profile": "3g.40gb", "start": start},
                                         "reservedAt": "2026-12-05T00:00:00Z"})


def test_a_mig_instance_decided_on_an_older_copy_never_shares_a_slice() -> None:
    """Two 3g.40gb instances fit the card's sums (84%, 80 GiB) at any starts, but only at 0 and 4."""
    ledger = Ledger()
    ledger.observe_gpu(_gpu([]) | {"status": {"allocations": [_instance("first", 0).to_dict()]}})
    with pytest.raises(CardOverfilled, match="shared slices"):
        ledger.with_allocation("gpu-0", _instance("second", 0))
    body = ledger.with_allocation("gpu-0", _instance("second", 4))
    assert sorted(a["partition"]["start"] for a in body["status"]["allocations"]) == [0, 4]
