"""A class's isolation mode is a constraint on the cards: a slice that asks for MPS or HAMiCore goes only
to a node whose cards all provide it, and says so when none does; whole cards need none (issue 25)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticgpu.allocator import Allocator, CardRecord, Inventory, NodeRecord, Placement, PlacementRequest, Unplaceable
from elasticgpu.api import GPU
from elasticgpu.api.resources import GpuRequest

MODES = ("MPS", "HAMiCore")


def cluster(nodes: dict[str, tuple[frozenset[str], ...]]) -> Inventory:
    """Nodes by name, each a tuple of its cards' isolation modes; cards of 40 GiB."""
    inventory = Inventory()
    for name, cards in nodes.items():
        inventory.add_node(NodeRecord(name=name, cpu_milli=32000, memory_mib=131072))
        for i, modes in enumerate(cards):
            inventory.add_card(CardRecord(uuid=f"{name}-{i}", node=name, index=i, model="A100", memory_mib=40960,
                                          isolation=modes))
    return inventory


def share(cores: int, isolation: str) -> PlacementRequest:
    return PlacementRequest(gpu=GpuRequest.share(cores, None), isolation=isolation)


NONE: frozenset[str] = frozenset()
MPS = frozenset({"MPS"})


@pytest.mark.parametrize("policy", ["fragmentation", "binpack", "spread"])
def test_a_slice_goes_only_where_its_mode_is_provided(policy: str) -> None:
    inventory = cluster({"plain": (NONE, NONE), "mps": (MPS, MPS)})
    allocator = Allocator(inventory, policy=policy)
    placed = allocator.place(share(30, "MPS"))
    assert isinstance(placed, Placement) and placed.node == "mps"
    # None asks for nothing: any node.
    assert isinstance(allocator.place(share(30, "None")), Placement)


def test_the_reason_names_the_mode_when_no_card_provides_it() -> None:
    allocator = Allocator(cluster({"plain": (NONE, NONE), "mps": (MPS, MPS)}))
    result = allocator.place(share(30, "HAMiCore"))
    assert isinstance(result, Unplaceable)
    assert result.reason.startswith("no card on any node supports isolation HAMiCore"), result.reason
    assert "libvgpu.so" in result.reason


def test_a_node_whose_cards_disagree_is_not_used_for_the_mode() -> None:
    allocator = Allocator(cluster({"mixed": (MPS, NONE)}))
    result = allocator.place(share(30, "MPS"))
    assert isinstance(result, Unplaceable) and "isolation MPS" in result.reason


def test_whole_cards_need_no_isolation() -> None:
    allocator = Allocator(cluster({"plain": (NONE, NONE)}))
    assert isinstance(allocator.place(PlacementRequest(gpu=GpuRequest.whole(1), isolation="MPS")), Placement)


def test_a_card_that_gains_the_mode_is_used_at_once() -> None:
    inventory = cluster({"plain": (NONE,)})
    allocator = Allocator(inventory)
    assert isinstance(allocator.place(share(30, "MPS")), Unplaceable)
    inventory.remove_card("plain-0")
    inventory.add_card(CardRecord(uuid="plain-0", node="plain", index=0, model="A100", memory_mib=40960,
                                  isolation=MPS))
    placed = allocator.place(share(30, "MPS"))
    assert isinstance(placed, Placement) and placed.uuids == ("plain-0",)


def test_the_card_record_reads_the_gpu_status() -> None:
    gpu = GPU.model_validate({"metadata": {"name": "gpu-a"}, "spec": {"index": 0, "uuid": "GPU-A", "memory": 1024,
                                                                      "nodeName": "n"},
                              "status": {"isolation": ["HAMiCore", "MPS"]}})
    assert CardRecord.from_gpu(gpu).isolation == frozenset({"MPS", "HAMiCore"})


@given(
    nodes=st.lists(st.lists(st.frozensets(st.sampled_from(MODES)), min_size=1, max_size=4), min_size=1, max_size=6),
    requests=st.lists(st.tuples(st.integers(1, 100), st.sampled_from(("None", *MODES))), min_size=1, max_size=20),
)
def test_every_placement_of_a_slice_is_on_cards_that_provide_its_mode(
    nodes: list[list[frozenset[str]]], requests: list[tuple[int, str]]
) -> None:
    inventory = cluster({f"n{i}": tuple(cards) for i, cards in enumerate(nodes)})
    allocator = Allocator(inventory, policy="fragmentation")
    for key, (cores, mode) in enumerate(requests):
        result = allocator.allocate(str(key), share(cores, mode))
        if isinstance(result, Placement):
            for card in result.cards:
                assert mode == "None" or mode in inventory.card(card.uuid).record.isolation
        elif mode != "None":
            # Refused: either no node provides it, or the ones that do are full.
            providing = [n for n in inventory.nodes() if all(mode in c.record.isolation for c in n.cards)]
            assert not providing or "isolation" not in result.reason or not any(
                c.free_cores >= cores for n in providing for c in n.cards)
