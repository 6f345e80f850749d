"""Property tests of the topology decisions (issue 27 item 3): NVLink / NUMA / RDMA NICs.

- a claim that requires NVLink (or SameNUMA) never gets cards that break it, and stays
  unplaced only when no node has such a set free;
- without a requirement, a fully NVLinked set is chosen whenever some node has one free;
- the RDMA NICs chosen are on the chosen cards' PCIe roots, as many as asked.
"""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from elasticgpu.allocator import (
    Allocator,
    CardRecord,
    CardShare,
    Inventory,
    NodeRecord,
    Placement,
    PlacementRequest,
    Unplaceable,
)
from elasticgpu.allocator.inventory import CardState
from elasticgpu.allocator.topology import fully_linked, has_fit, pick_linked, pick_nics, same_numa
from elasticgpu.api.resources import GpuRequest


@st.composite
def nodes(draw: st.DrawFn, name: str) -> list[CardRecord]:
    """One node: 2..8 cards, a random symmetric NVLink graph (islands, all-to-all or noise),
    NUMA 0/1, PCIe roots shared by pairs, NICs on some roots."""
    count = draw(st.integers(2, 8))
    shape = draw(st.sampled_from(["islands", "all", "random", "none"]))
    pairs = list(itertools.combinations(range(count), 2))
    if shape == "islands":
        size = draw(st.integers(2, 4))
        edges = {(a, b) for a, b in pairs if a // size == b // size}
    elif shape == "all":
        edges = set(pairs)
    elif shape == "random":
        edges = {p for p in pairs if draw(st.booleans())}
    else:
        edges = set()
    numa = [draw(st.integers(0, 1)) for _ in range(count)]
    roots = [f"0000:{i // 2:02x}:00.0" for i in range(count)]
    nics_of_root = {r: frozenset(f"mlx5_{j}_{r[5:7]}" for j in range(draw(st.integers(0, 2)))) for r in set(roots)}
    uuid = [f"GPU-{name}-{i}" for i in range(count)]
    return [
        CardRecord(
            uuid=uuid[i], node=name, index=i, model="A100", memory_mib=81920, numa=numa[i],
            links=frozenset(uuid[b] for a, b in edges if a == i) | frozenset(uuid[a] for a, b in edges if b == i),
            pcie_root=roots[i], nics=nics_of_root[roots[i]],
        )
        for i in range(count)
    ]


@st.composite
def clusters(draw: st.DrawFn) -> tuple[Inventory, list[str]]:
    """1..3 nodes, some of whose cards are already taken whole (by single-card claims)."""
    inventory = Inventory()
    keys = []
    for n in range(draw(st.integers(1, 3))):
        name = f"node-{n}"
        inventory.add_node(NodeRecord(name=name))
        for record in draw(nodes(name)):
            inventory.add_card(record)
            if draw(st.integers(0, 3)) == 0:
                key = f"taken-{record.uuid}"
                share = CardShare(uuid=record.uuid, cores=100, memory_mib=record.memory_mib, whole=True)
                inventory.reserve(key, Placement(node=name, cards=(share,)))
                keys.append(key)
    return inventory, keys


def free_cards(inventory: Inventory, node: str) -> list[CardState]:
    return [c for c in inventory.node(node).cards if not c.whole and not c.holders]


def some_set(inventory: Inventory, count: int, ok: object) -> bool:
    """Brute force: does any node have `count` free cards for which `ok(cards)` holds?"""
    for node in inventory.node_names():
        for group in itertools.combinations(free_cards(inventory, node), count):
            if ok(group):  # type: ignore[operator]
                return True
    return False


def chosen(inventory: Inventory, placement: Placement) -> list[CardState]:
    return [inventory.card(u) for u in placement.uuids]


requests = st.tuples(st.integers(2, 8), st.sampled_from(["NVLink", "SameNUMA", "Any"]), st.integers(0, 3))


@settings(max_examples=300)
@given(clusters(), requests, st.sampled_from(["binpack", "spread", "fragmentation"]))
def test_required_topology_is_never_broken_and_met_when_possible(
    cluster: tuple[Inventory, list[str]], request: tuple[int, str, int], policy: str
) -> None:
    inventory, _ = cluster
    cards, topology, rdma = request
    result = Allocator(inventory, policy=policy).place(
        PlacementRequest(gpu=GpuRequest.whole(cards), topology=topology, rdma=rdma)
    )

    def ok(group: list[CardState]) -> bool:
        meets = {"NVLink": fully_linked, "SameNUMA": same_numa}.get(topology, lambda _: True)(group)
        return meets and (not rdma or pick_nics(group, rdma) is not None)

    if isinstance(result, Placement):
        got = chosen(inventory, result)
        assert len(got) == cards
        assert ok(got), f"{topology}/{rdma} NICs broken by {result.describe()}"
        roots = set().union(*(c.record.nics for c in got))
        assert len(result.nics) == rdma and set(result.nics) <= roots
    else:
        assert isinstance(result, Unplaceable)
        assert not some_set(inventory, cards, ok), f"a set meeting {topology}/{rdma} NICs exists: {result.reason}"


@settings(max_examples=300)
@given(clusters(), st.integers(2, 8), st.sampled_from(["binpack", "spread", "fragmentation"]))
def test_a_fully_linked_set_is_preferred_whenever_one_exists(
    cluster: tuple[Inventory, list[str]], cards: int, policy: str
) -> None:
    inventory, _ = cluster
    result = Allocator(inventory, policy=policy).place(PlacementRequest(gpu=GpuRequest.whole(cards)))
    if some_set(inventory, cards, fully_linked):
        assert isinstance(result, Placement)
        assert fully_linked(chosen(inventory, result)), result.describe()


@settings(max_examples=200)
@given(st.data(), st.integers(2, 8), st.sampled_from(["NVLink", "SameNUMA", "Any"]), st.integers(0, 3))
def test_pick_linked_agrees_with_brute_force(data: st.DataObject, count: int, topology: str, nics: int) -> None:
    inventory = Inventory()
    inventory.add_node(NodeRecord(name="n"))
    for record in data.draw(nodes("n")):
        inventory.add_card(record)
    cards = list(inventory.node("n").cards)
    picked = pick_linked(cards, count, topology, nics)  # type: ignore[arg-type]

    def ok(group: tuple[CardState, ...]) -> bool:
        meets = {"NVLink": fully_linked, "SameNUMA": same_numa}.get(topology, lambda _: True)(list(group))
        return meets and (not nics or pick_nics(group, nics) is not None)

    exists = any(ok(g) for g in itertools.combinations(cards, count))
    assert (picked is not None) == exists
    assert has_fit(cards, count, topology, nics) == exists  # type: ignore[arg-type]
    if picked is not None:
        assert ok(tuple(picked))
        if any(fully_linked(g) and ok(g) for g in itertools.combinations(cards, count)):
            assert fully_linked(picked)


def test_a_claims_rdma_nics_come_from_its_cards_roots() -> None:
    """`elasticgpu.io/rdma` on the claim (GpuRequest.rdma) is what the allocator honours: the node
    whose cards' roots hold the NICs is chosen, and the NICs named are on those roots."""
    inventory = Inventory()
    for node, nics in (("plain", frozenset[str]()), ("rdma", frozenset({"mlx5_0"}))):
        inventory.add_node(NodeRecord(name=node))
        for i in range(2):
            inventory.add_card(CardRecord(uuid=f"{node}-{i}", node=node, index=i, model="A100", memory_mib=1,
                                          pcie_root=f"root-{i}", nics=nics if i == 1 else frozenset()))
    allocator = Allocator(inventory, policy="binpack")
    placed = allocator.place(PlacementRequest(gpu=GpuRequest.whole(2, rdma=1)))
    assert isinstance(placed, Placement) and placed.node == "rdma" and placed.nics == ("mlx5_0",)
    missing = allocator.place(PlacementRequest(gpu=GpuRequest.whole(2, rdma=2)))
    assert isinstance(missing, Unplaceable) and "2 RDMA NIC(s) on the cards' PCIe roots" in missing.reason
