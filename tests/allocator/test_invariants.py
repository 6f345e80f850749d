"""Property tests of the allocator's invariants (hypothesis).

- no card is ever over 100 cores or over its memory;
- a card taken whole is never shared;
- release restores exactly the previous state;
- an impossible request never reserves anything.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from elasticgpu.allocator import (
    Allocator,
    CardRecord,
    Health,
    Inventory,
    NodeRecord,
    Placement,
    PlacementRequest,
    ReservationConflict,
    Unplaceable,
)
from elasticgpu.api.resources import GpuRequest

POLICY_NAMES = ["fragmentation", "binpack", "spread", "bestfit", "packing", "random"]

cards_per_node = st.lists(st.sampled_from([8192, 16384, 40960]), min_size=1, max_size=4)
clusters = st.lists(cards_per_node, min_size=1, max_size=4)
gpu_requests = st.one_of(
    st.tuples(st.integers(0, 99), st.one_of(st.none(), st.integers(1, 45000)))
    .filter(lambda pair: pair[0] > 0 or pair[1] is not None)  # a share asks for something
    .map(lambda pair: GpuRequest.share(*pair)),
    st.builds(GpuRequest.whole, st.integers(1, 5), st.one_of(st.none(), st.integers(1, 45000))),
)
requests = st.builds(
    PlacementRequest,
    gpu=gpu_requests,
    cpu_milli=st.sampled_from([0, 1000, 4000]),
    models=st.sampled_from([(), ("A*",), ("H100*",)]),
)
# Operations: place+reserve a request, or release the i-th key seen so far, or flip health.
operations = st.lists(
    st.one_of(
        st.tuples(st.just("allocate"), requests),
        st.tuples(st.just("release"), st.integers(0, 30)),
        st.tuples(st.just("health"), st.integers(0, 30)),
    ),
    max_size=30,
)


def build(cluster: list[list[int]]) -> Inventory:
    inventory = Inventory()
    for n, cards in enumerate(cluster):
        inventory.add_node(NodeRecord(name=f"node-{n}", cpu_milli=8000, memory_mib=65536))
        for i, memory in enumerate(cards):
            inventory.add_card(
                CardRecord(
                    uuid=f"GPU-{n}-{i}",
                    node=f"node-{n}",
                    index=i,
                    model="A100",
                    memory_mib=memory,
                    numa=i // 2,
                    links=frozenset({f"GPU-{n}-{i ^ 1}"}),
                )
            )
    return inventory


def check_capacity(inventory: Inventory) -> None:
    for node in inventory.nodes():
        assert node.cpu_free >= 0
        for card in node.cards:
            cores = sum(share.cores for share in card.holders.values())
            memory = sum(share.memory_mib for share in card.holders.values())
            assert cores <= 100, f"{card.record.uuid} holds {cores} cores"
            assert memory <= card.record.memory_mib, f"{card.record.uuid} holds {memory} MiB"
            assert card.free_cores == 100 - cores
            assert card.free_memory == card.record.memory_mib - memory
            if any(share.whole for share in card.holders.values()):
                assert len(card.holders) == 1, f"{card.record.uuid} is whole and shared"


@settings(max_examples=60, deadline=None)
@given(cluster=clusters, ops=operations, policy=st.sampled_from(POLICY_NAMES), seed=st.integers(0, 3))
def test_capacity_is_never_exceeded_and_whole_cards_never_shared(
    cluster: list[list[int]], ops: list[tuple[str, object]], policy: str, seed: int
) -> None:
    inventory = build(cluster)
    allocator = Allocator(inventory, policy=policy, seed=seed)
    keys: list[str] = []
    uuids = sorted(c.record.uuid for n in inventory.nodes() for c in n.cards)
    for step, (op, arg) in enumerate(ops):
        if op == "allocate":
            assert isinstance(arg, PlacementRequest)
            before = inventory.snapshot()
            result = allocator.allocate(f"claim-{step}", arg)
            if isinstance(result, Unplaceable):
                assert inventory.snapshot() == before, "a failed request changed the state"
                assert result.reason
            else:
                keys.append(f"claim-{step}")
                card_models = {inventory.card(s.uuid).record.model for s in result.cards}
                assert not arg.models or card_models <= {"A100"}
                assert all(inventory.card(s.uuid).healthy for s in result.cards)
        elif op == "release" and keys:
            allocator.release(keys.pop(int(arg) % len(keys)))  # type: ignore[call-overload]
        elif op == "health":
            uuid = uuids[int(arg) % len(uuids)]  # type: ignore[call-overload]
            card = inventory.card(uuid)
            flipped = Health.UNHEALTHY if card.healthy else Health.HEALTHY
            inventory.set_health(uuid, flipped)
        check_capacity(inventory)


@settings(max_examples=60, deadline=None)
@given(cluster=clusters, first=st.lists(requests, max_size=8), extra=requests, policy=st.sampled_from(POLICY_NAMES))
def test_release_restores_the_exact_previous_state(
    cluster: list[list[int]], first: list[PlacementRequest], extra: PlacementRequest, policy: str
) -> None:
    inventory = build(cluster)
    allocator = Allocator(inventory, policy=policy)
    for i, request in enumerate(first):
        allocator.allocate(f"claim-{i}", request)
    before = inventory.snapshot()
    decision_before = allocator.place(extra)
    result = allocator.allocate("extra", extra)
    if isinstance(result, Placement):
        assert inventory.snapshot() != before
    allocator.release("extra")
    assert inventory.snapshot() == before
    # The caches follow: the same request gets the same answer as before (random draws anew).
    if policy != "random":
        assert allocator.place(extra) == decision_before


@settings(max_examples=40, deadline=None)
@given(cluster=clusters, first=st.lists(requests, max_size=8))
def test_an_impossible_request_never_reserves_anything(cluster: list[list[int]], first: list[PlacementRequest]) -> None:
    inventory = build(cluster)
    allocator = Allocator(inventory)
    for i, request in enumerate(first):
        allocator.allocate(f"claim-{i}", request)
    before = inventory.snapshot()
    impossible = [
        PlacementRequest(gpu=GpuRequest.whole(9)),
        PlacementRequest(gpu=GpuRequest.share(10, 50000)),
        PlacementRequest(gpu=GpuRequest.share(10), models=("H100*",)),
        PlacementRequest(gpu=GpuRequest.share(10), cpu_milli=9000),
        PlacementRequest(gpu=GpuRequest.share(10), node_selector={"zone": "nowhere"}),
    ]
    for request in impossible:
        result = allocator.allocate("impossible", request)
        assert isinstance(result, Unplaceable), result
        assert inventory.snapshot() == before
        assert "impossible" not in inventory.reservations


@settings(max_examples=40, deadline=None)
@given(cluster=clusters, first=st.lists(requests, min_size=1, max_size=6))
def test_reserving_a_placement_that_no_longer_fits_changes_nothing(
    cluster: list[list[int]], first: list[PlacementRequest]
) -> None:
    inventory = build(cluster)
    allocator = Allocator(inventory)
    placed = [(f"claim-{i}", allocator.place(r)) for i, r in enumerate(first)]
    for key, placement in placed:
        if not isinstance(placement, Placement):
            continue
        before = inventory.snapshot()
        try:
            allocator.reserve(key, placement)
        except ReservationConflict:
            assert inventory.snapshot() == before
        else:
            allocator.reserve(key, placement)  # the same again is a no-op
        check_capacity(inventory)
