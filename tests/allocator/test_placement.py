"""Behaviour of placement: policies, topology, health, removal, idempotence, determinism."""

from __future__ import annotations

import pytest

import elasticgpu.allocator as allocator_pkg
from elasticgpu.allocator import (
    Allocator,
    CardRecord,
    DuplicateObject,
    Health,
    Inventory,
    NodeRecord,
    Placement,
    PlacementRequest,
    ReservationConflict,
    UnknownObject,
    Unplaceable,
    Workload,
)
from elasticgpu.api.resources import GpuRequest


def cluster(*nodes: tuple[str, int, str], links: dict[str, set[str]] | None = None) -> Inventory:
    """Nodes given as (name, cards, model); cards of 40 GiB, two NUMA halves."""
    inventory = Inventory()
    for name, count, model in nodes:
        inventory.add_node(NodeRecord(name=name, cpu_milli=32000, memory_mib=131072, labels={"model": model}))
        for i in range(count):
            uuid = f"{name}-{i}"
            inventory.add_card(
                CardRecord(
                    uuid=uuid,
                    node=name,
                    index=i,
                    model=model,
                    memory_mib=40960,
                    numa=i * 2 // count,
                    links=frozenset((links or {}).get(uuid, set())),
                )
            )
    return inventory


def share(cores: int, memory: int | None = None, **kw: object) -> PlacementRequest:
    return PlacementRequest(gpu=GpuRequest.share(cores, memory), **kw)  # type: ignore[arg-type]


def whole(cards: int, **kw: object) -> PlacementRequest:
    return PlacementRequest(gpu=GpuRequest.whole(cards), **kw)  # type: ignore[arg-type]


def test_public_surface_is_exactly_these_names() -> None:
    # Ordering of __all__ is ruff's job (RUF022); the names are this test's.
    assert set(allocator_pkg.__all__) == {
        "DEFAULT_POLICY",
        "POLICIES",
        "Allocator",
        "AllocatorError",
        "CardRecord",
        "CardShare",
        "CardState",
        "DuplicateObject",
        "Health",
        "Inventory",
        "NodeRecord",
        "NodeState",
        "Placement",
        "PlacementRequest",
        "Policy",
        "ReservationConflict",
        "UnknownObject",
        "Unplaceable",
        "Workload",
        "make_policy",
    }
    assert len(allocator_pkg.__all__) == len(set(allocator_pkg.__all__))
    for name in allocator_pkg.__all__:
        assert hasattr(allocator_pkg, name)


@pytest.mark.parametrize(
    ("policy", "expected_node"),
    [("binpack", "a"), ("spread", "b")],
)
def test_binpack_fills_the_used_node_and_spread_the_empty_one(policy: str, expected_node: str) -> None:
    inventory = cluster(("a", 2, "A100"), ("b", 2, "A100"))
    allocator = Allocator(inventory, policy=policy)
    allocator.reserve(
        "first", Placement(node="a", cards=(allocator_pkg.CardShare(uuid="a-0", cores=50, memory_mib=20480),))
    )
    result = allocator.place(share(30))
    assert isinstance(result, Placement)
    assert result.node == expected_node


def test_fragmentation_keeps_an_empty_card_for_whole_card_requests() -> None:
    # Two cards on one node, one half used: a 40% share should go next to the half-used one
    # (the empty card stays whole for the 1-card requests of the workload).
    inventory = cluster(("a", 2, "A100"))
    allocator = Allocator(inventory, policy="fragmentation", workload=Workload.default())
    allocator.allocate("first", share(50))
    result = allocator.place(share(40))
    assert isinstance(result, Placement)
    assert result.cards[0].uuid == inventory.reservations["first"].cards[0].uuid


def test_share_memory_in_proportion_to_cores() -> None:
    allocator = Allocator(cluster(("a", 1, "A100")))
    result = allocator.place(share(25))
    assert isinstance(result, Placement)
    assert (result.cards[0].cores, result.cards[0].memory_mib, result.cards[0].whole) == (25, 10240, False)


def test_whole_cards_prefer_nvlink_peers_then_numa() -> None:
    links = {"a-1": {"a-3"}, "a-3": {"a-1"}}
    allocator = Allocator(cluster(("a", 4, "A100"), links=links))
    result = allocator.place(whole(2))
    assert isinstance(result, Placement)
    assert result.uuids == ("a-1", "a-3")
    numa_only = Allocator(cluster(("b", 4, "A100")))
    result = numa_only.place(whole(2))
    assert isinstance(result, Placement)
    assert result.uuids in {("b-0", "b-1"), ("b-2", "b-3")}


def test_a_whole_card_is_never_shared_and_a_shared_card_never_taken_whole() -> None:
    allocator = Allocator(cluster(("a", 2, "A100")))
    allocator.allocate("w", whole(1))
    allocator.allocate("s", share(0, 1024))  # best effort: memory only
    taken = set(allocator.inventory.reservations["w"].uuids)
    assert not taken & set(allocator.inventory.reservations["s"].uuids)
    assert isinstance(allocator.place(whole(1)), Unplaceable)


def test_reserve_is_idempotent_and_refuses_another_placement_under_the_same_key() -> None:
    allocator = Allocator(cluster(("a", 2, "A100")))
    placement = allocator.place(share(60))
    assert isinstance(placement, Placement)
    allocator.reserve("k", placement)
    snapshot = allocator.inventory.snapshot()
    allocator.reserve("k", placement)
    assert allocator.inventory.snapshot() == snapshot
    other = allocator.place(share(10))
    assert isinstance(other, Placement)
    with pytest.raises(ReservationConflict, match="already holds"):
        allocator.reserve("k", other)
    assert allocator.release("unknown") is None
    assert allocator.release("k") == placement
    assert allocator.release("k") is None


def test_reserve_refuses_oversubscription() -> None:
    allocator = Allocator(cluster(("a", 1, "A100")))
    big = Placement(node="a", cards=(allocator_pkg.CardShare(uuid="a-0", cores=70, memory_mib=1024),))
    allocator.reserve("one", big)
    with pytest.raises(ReservationConflict, match="30% cores free"):
        allocator.reserve("two", big)
    assert "two" not in allocator.inventory.reservations


def test_unhealthy_cards_are_avoided_and_explained() -> None:
    inventory = cluster(("a", 1, "A100"), ("b", 1, "A100"))
    allocator = Allocator(inventory)
    inventory.set_health("a-0", Health.UNHEALTHY)
    result = allocator.place(share(50))
    assert isinstance(result, Placement)
    assert result.uuids == ("b-0",)
    allocator.allocate("busy", share(90))
    result = allocator.place(share(50))
    assert isinstance(result, Unplaceable)
    assert "every card with room is Unhealthy" in result.reason


def test_removing_a_node_drops_its_reservations_and_returns_their_keys() -> None:
    inventory = cluster(("a", 1, "A100"), ("b", 1, "A100"))
    allocator = Allocator(inventory, policy="binpack")
    allocator.reserve("x", Placement(node="a", cards=(allocator_pkg.CardShare(uuid="a-0", cores=10, memory_mib=10),)))
    assert inventory.remove_node("a") == ("x",)
    assert "x" not in inventory.reservations
    result = allocator.place(share(10))
    assert isinstance(result, Placement)
    assert result.node == "b"
    assert inventory.remove_card("b-0") == ()
    assert isinstance(allocator.place(share(10)), Unplaceable)
    with pytest.raises(UnknownObject):
        inventory.remove_node("a")


def test_adding_the_same_record_twice_is_a_no_op_and_a_different_one_an_error() -> None:
    inventory = cluster(("a", 1, "A100"))
    inventory.add_node(NodeRecord(name="a", cpu_milli=32000, memory_mib=131072, labels={"model": "A100"}))
    with pytest.raises(DuplicateObject):
        inventory.add_node(NodeRecord(name="a", cpu_milli=1))


def test_node_selector_models_and_pod_cpu_filter_the_nodes() -> None:
    allocator = Allocator(cluster(("a", 2, "A100"), ("h", 2, "H100")))
    for request, node in [
        (share(10, models=("H100*",)), "h"),
        (share(10, node_selector={"model": "A100"}), "a"),
        (share(10, nodes=frozenset({"h"})), "h"),
    ]:
        result = allocator.place(request)
        assert isinstance(result, Placement)
        assert result.node == node


def test_the_same_seed_gives_the_same_decisions() -> None:
    def run(seed: int, policy: str) -> list[str]:
        allocator = Allocator(cluster(*[(f"n{i}", 4, "A100") for i in range(6)]), policy=policy, seed=seed)
        out = []
        for i in range(30):
            result = allocator.allocate(f"c{i}", share(10 + (i * 37) % 80) if i % 3 else whole(1 + i % 2))
            out.append(result.describe() if isinstance(result, Placement) else result.reason)
        return out

    for policy in ("fragmentation", "random"):
        assert run(1, policy) == run(1, policy)
    assert run(1, "random") != run(2, "random")


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        (share(10, 49152), "a card 0 has 40Gi free, the claim asks 48Gi"),
        (share(10, models=("H100*",)), "no node has a H100* card yet (models here: A100); it binds once one joins,"
                                       " or fix the class's gpuModel"),
        (whole(3), "a has 2 free cards (of 2), the claim asks 3 whole cards on one node"),
        (share(10, cpu_milli=64000), "a has 32 CPU free, the pod asks 64 CPU"),
        (share(10, node_selector={"zone": "x"}), "no node matches the node selector zone=x"),
    ],
)
def test_unplaceable_says_why(request_: PlacementRequest, expected: str) -> None:
    allocator = Allocator(cluster(("a", 2, "A100")))
    result = allocator.place(request_)
    assert isinstance(result, Unplaceable)
    assert result.reason == expected
    assert not result


def test_the_closest_card_is_named_when_shares_do_not_fit() -> None:
    inventory = cluster(("node-7", 3, "A100"))
    allocator = Allocator(inventory)
    for i, cores in enumerate((90, 70, 80)):
        allocator.reserve(
            f"c{i}",
            Placement(
                node="node-7", cards=(allocator_pkg.CardShare(uuid=f"node-7-{i}", cores=cores, memory_mib=1024),)
            ),
        )
    result = allocator.place(share(50, 1024))
    assert isinstance(result, Unplaceable)
    assert result.reason == "node-7 card 1 has 30% cores free, the claim asks 50%"
    assert result.closest == "node-7 card 1"


def test_an_empty_inventory_explains_itself() -> None:
    result = Allocator().place(share(10))
    assert isinstance(result, Unplaceable)
    assert "no GPU nodes" in result.reason


def test_card_record_from_a_gpu_object() -> None:
    from elasticgpu.allocator import CardRecord, Health
    from tests.factories import GPUFactory

    gpu = GPUFactory(spec__links=["GPU-peer"], spec__numa=1)
    gpu.status.health = "Unhealthy"
    record = CardRecord.from_gpu(gpu)
    assert (record.uuid, record.node, record.memory_mib, record.numa) == (
        gpu.spec.uuid,
        gpu.spec.node_name,
        gpu.spec.memory,
        1,
    )
    assert record.links == frozenset({"GPU-peer"}) and record.health is Health.UNHEALTHY
