"""The pure capacity figures: free capacity a class may use, and requests that could never fit."""

from __future__ import annotations

from elasticgpu.allocator import CardRecord, CardShare, Health, Inventory, NodeRecord, Placement
from elasticgpu.api import GpuRequest
from elasticgpu.controller.decisions import capacity


def _inventory() -> Inventory:
    inventory = Inventory()
    inventory.add_node(NodeRecord(name="n1", labels={"pool": "a"}))
    inventory.add_node(NodeRecord(name="n2", labels={"pool": "b"}))
    inventory.add_card(CardRecord(uuid="GPU-1", node="n1", index=0, model="NVIDIA A100-SXM4-80GB", memory_mib=81920))
    inventory.add_card(CardRecord(uuid="GPU-2", node="n1", index=1, model="NVIDIA A100-SXM4-80GB", memory_mib=81920))
    inventory.add_card(CardRecord(uuid="GPU-3", node="n2", index=0, model="NVIDIA A100-SXM4-40GB", memory_mib=40960,
                                  health=Health.UNHEALTHY))
    inventory.reserve("e1", Placement(node="n1", cards=(CardShare(uuid="GPU-1", cores=30, memory_mib=10240),)))
    return inventory


def test_free_counts_healthy_matching_cards_and_untouched_whole_cards() -> None:
    inventory = _inventory()
    assert capacity.free_for(inventory, models=(), node_selector={}) == capacity.Free(
        cores=170, memory_mib=2 * 81920 - 10240, cards=1)
    assert capacity.free_for(inventory, models=("*40GB",), node_selector={}) == capacity.Free()
    assert capacity.free_for(inventory, models=(), node_selector={"pool": "b"}) == capacity.Free()


def test_never_fits_names_the_largest_card_or_the_most_cards_on_a_node() -> None:
    inventory = _inventory()
    fits = capacity.never_fits(inventory, GpuRequest.share(50, 96 * 1024), models=(), node_selector={})
    assert "the largest is NVIDIA A100-SXM4-80GB with 80Gi (node n1)" in fits
    assert capacity.never_fits(inventory, GpuRequest.share(50, 60 * 1024), models=(), node_selector={}) == ""
    # a 40Gi card's pool: 60Gi never fits there, even though the card is only unhealthy now
    assert "40Gi" in capacity.never_fits(inventory, GpuRequest.share(50, 60 * 1024), models=(),
                                         node_selector={"pool": "b"})
    three = GpuRequest(cards=3, cores=300)
    assert "the most on one node is 2 (node n1)" in capacity.never_fits(inventory, three, models=(), node_selector={})
    assert capacity.never_fits(inventory, GpuRequest(cards=2, cores=200), models=(), node_selector={}) == ""
    # no card of the class at all: not "never" (cards may join); NoCapacity says so
    assert capacity.never_fits(inventory, three, models=("H100*",), node_selector={}) == ""
