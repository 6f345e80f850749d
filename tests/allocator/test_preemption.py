"""Property tests of the victim choice (issue 27 item 2, `allocator.preemption`), against a brute force.

On small random clusters (slices and whole cards held by claims of random priorities) a claim that
fits nowhere asks for victims. An independent brute force tries every subset of the lower-priority
holders of each card (a slice) or node (whole cards) on a full copy of the inventory, with the
allocator itself as judge; it agrees with `choose_victims` on whether any preemption helps and on the
least cost. Whatever the search (exact or the greedy beyond its limit), the victims are of strictly
lower priority, on one card or node (a claim group's other members wherever they are), minimal, and the
request then fits. Some holders belong to claim groups: a group goes whole or not at all (issue 33).
"""

from __future__ import annotations

import itertools

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from elasticgpu.allocator import Allocator, CardRecord, CardShare, Inventory, NodeRecord, Placement, PlacementRequest
from elasticgpu.allocator.preemption import Candidate, NoPreemption, Preemption, choose_victims, cost
from elasticgpu.api.resources import GpuRequest

MEMORY = 40960


@st.composite
def clusters(draw: st.DrawFn) -> tuple[Inventory, dict[str, Candidate]]:
    """1..2 nodes of 1..3 cards, filled with slices and whole cards of priority 0..3."""
    inventory = Inventory()
    candidates: dict[str, Candidate] = {}
    for n in range(draw(st.integers(1, 2))):
        node = f"node-{n}"
        inventory.add_node(NodeRecord(name=node))
        cards = [f"GPU-{n}-{i}" for i in range(draw(st.integers(1, 3)))]
        for i, uuid in enumerate(cards):
            inventory.add_card(CardRecord(uuid=uuid, node=node, index=i, model="A100", memory_mib=MEMORY))
        for i, uuid in enumerate(cards):
            if draw(st.booleans()) and not inventory.card(uuid).holders:
                shares: list[tuple[int, int, bool]] = [(100, MEMORY, True)]
            else:
                shares = [(draw(st.sampled_from([10, 20, 30, 50])), draw(st.sampled_from([2048, 8192, 16384])), False)
                          for _ in range(draw(st.integers(0, 4)))]
            for j, (cores, memory, whole) in enumerate(shares):
                key = f"egpu-{n}-{i}-{j}"
                placement = Placement(node=node, cards=(CardShare(uuid=uuid, cores=cores, memory_mib=memory,
                                                                  whole=whole),))
                if inventory.conflict(placement):
                    continue
                inventory.reserve(key, placement)
                candidates[key] = Candidate(key=key, priority=draw(st.integers(0, 3)),
                                            created=float(draw(st.integers(0, 5))),
                                            group=draw(st.sampled_from(["", "", "", "g1", "g2"])))
    return inventory, candidates


requests = st.one_of(
    st.builds(GpuRequest.share, st.sampled_from([30, 60, 100]), st.sampled_from([8192, 20480, None])),
    st.builds(GpuRequest.whole, st.integers(1, 2)),
)


def _fits(inventory: Inventory, request: PlacementRequest, released: tuple[str, ...]) -> bool:
    """The judge: a full copy of the inventory without `released`, asked by the allocator."""
    copy = Inventory()
    for node in inventory.nodes():
        copy.add_node(node.record)
        for card in node.cards:
            copy.add_card(card.record)
    for key, placement in inventory.reservations.items():
        if key not in released:
            copy.reserve(key, placement)
    return isinstance(Allocator(copy, policy="binpack").place(request, explain=False), Placement)


def _with_group(candidates: dict[str, Candidate], key: str) -> frozenset[str]:
    """`key` and, for a member of a claim group, every other member: what goes with it."""
    group = candidates[key].group
    return frozenset(k for k, c in candidates.items() if k == key or (group and c.group == group))


def _brute_force(inventory: Inventory, request: PlacementRequest, priority: int,
                 candidates: dict[str, Candidate]) -> tuple[int, int, float, tuple[str, ...]] | None:
    """The least cost of a minimal lower-priority set on one card (slice) or node (whole) that makes room; a
    group's members go together, and not at all when one of them is not of lower priority."""
    whole = request.gpu is not None and request.gpu.is_whole
    units: list[set[str]] = []
    for node in inventory.nodes():
        if whole:
            units.append(set(node.holders))
        else:
            units += [set(card.holders) for card in node.cards]
    best = None
    for unit in units:
        atoms = sorted({_with_group(candidates, k) for k in unit}, key=sorted)
        atoms = [a for a in atoms if all(candidates[k].priority < priority for k in a)]
        solutions: list[set[frozenset[str]]] = []
        for size in range(1, len(atoms) + 1):
            for subset in itertools.combinations(atoms, size):
                keys = tuple(sorted(set().union(*subset)))
                if any(s <= set(subset) for s in solutions) or not _fits(inventory, request, keys):
                    continue
                solutions.append(set(subset))
                score = cost(candidates[k] for k in keys)
                best = score if best is None or score < best else best
    return best


def _check_victims(inventory: Inventory, request: PlacementRequest, priority: int,
                   candidates: dict[str, Candidate], chosen: Preemption) -> None:
    assert chosen.victims, "a preemption has victims"
    assert all(candidates[k].priority < priority for k in chosen.victims), "never equal or higher priority"
    atoms = {_with_group(candidates, k) for k in chosen.victims}
    assert set().union(*atoms) == set(chosen.victims), "a group's members are victims together"
    for atom in atoms:
        placements = [inventory.reservations[k] for k in atom]
        here = [p for p in placements if p.node == chosen.node and (not chosen.card or chosen.card in p.uuids)]
        assert here, f"each victim (or a member of its group) is on node {chosen.node} {chosen.card}: {atom}"
    assert _fits(inventory, request, chosen.victims), "the request fits once the victims are gone"
    for spared in atoms:
        rest = tuple(k for k in chosen.victims if k not in spared)
        assert not _fits(inventory, request, rest), f"minimal: {sorted(spared)} could have been spared"


@settings(max_examples=150, deadline=None)
@given(cluster=clusters(), gpu=requests, priority=st.integers(0, 4))
def test_the_choice_is_the_brute_forces_least_cost(cluster: tuple[Inventory, dict[str, Candidate]],
                                                    gpu: GpuRequest, priority: int) -> None:
    inventory, candidates = cluster
    request = PlacementRequest(gpu=gpu)
    assume(not _fits(inventory, request, ()))
    chosen = choose_victims(inventory, request, priority=priority, candidates=candidates.values())
    expected = _brute_force(inventory, request, priority, candidates)
    if expected is None:
        assert isinstance(chosen, NoPreemption), f"preempted {chosen} though no set of victims makes room"
        return
    assert isinstance(chosen, Preemption), f"found no victims, the brute force found {expected}"
    assert cost(candidates[k] for k in chosen.victims) == expected
    _check_victims(inventory, request, priority, candidates, chosen)


@settings(max_examples=100, deadline=None)
@given(cluster=clusters(), gpu=requests, priority=st.integers(0, 4))
def test_the_greedy_search_is_sound_and_minimal(cluster: tuple[Inventory, dict[str, Candidate]],
                                                gpu: GpuRequest, priority: int) -> None:
    """Beyond the exact limit (here 1 candidate): the victims still make room, minimally, and a preemption
    is found exactly when the exact search finds one (feasibility does not depend on the search)."""
    inventory, candidates = cluster
    request = PlacementRequest(gpu=gpu)
    assume(not _fits(inventory, request, ()))
    greedy = choose_victims(inventory, request, priority=priority, candidates=candidates.values(), exact_limit=1)
    exact = choose_victims(inventory, request, priority=priority, candidates=candidates.values())
    assert isinstance(greedy, Preemption) == isinstance(exact, Preemption)
    if isinstance(greedy, Preemption):
        _check_victims(inventory, request, priority, candidates, greedy)


def test_equal_priority_is_never_preempted() -> None:
    inventory = Inventory()
    inventory.add_node(NodeRecord(name="n"))
    inventory.add_card(CardRecord(uuid="GPU-0", node="n", index=0, model="A100", memory_mib=MEMORY))
    inventory.reserve("a", Placement(node="n", cards=(CardShare(uuid="GPU-0", cores=100, memory_mib=MEMORY,
                                                                whole=True),)))
    request = PlacementRequest(gpu=GpuRequest.share(50, 8192))
    same = choose_victims(inventory, request, priority=5, candidates=[Candidate(key="a", priority=5)])
    assert isinstance(same, NoPreemption)
    lower = choose_victims(inventory, request, priority=6, candidates=[Candidate(key="a", priority=5)])
    assert isinstance(lower, Preemption) and lower.victims == ("a",)


def test_least_total_priority_beats_fewest_victims() -> None:
    """One victim of priority 3, or two of priority 1 each: the two (total 2 < 3). Then youngest first."""
    inventory = Inventory()
    inventory.add_node(NodeRecord(name="n"))
    inventory.add_card(CardRecord(uuid="GPU-0", node="n", index=0, model="A100", memory_mib=MEMORY))
    for key, cores in (("big", 50), ("small-1", 25), ("small-2", 25)):
        inventory.reserve(key, Placement(node="n", cards=(CardShare(uuid="GPU-0", cores=cores, memory_mib=1024),)))
    request = PlacementRequest(gpu=GpuRequest.share(50, 1024))
    chosen = choose_victims(inventory, request, priority=9, candidates=[
        Candidate(key="big", priority=3), Candidate(key="small-1", priority=1), Candidate(key="small-2", priority=1)])
    assert isinstance(chosen, Preemption) and chosen.victims == ("small-1", "small-2")
    # All of priority 1: one victim beats two; among single victims, the youngest.
    chosen = choose_victims(inventory, PlacementRequest(gpu=GpuRequest.share(25, 1024)), priority=9, candidates=[
        Candidate(key="big", priority=1, created=0.0), Candidate(key="small-1", priority=1, created=1.0),
        Candidate(key="small-2", priority=1, created=3.0)])
    assert isinstance(chosen, Preemption) and chosen.victims == ("small-2",)


def test_victims_only_on_the_nodes_the_request_may_use() -> None:
    inventory = Inventory()
    for node in ("a", "b"):
        inventory.add_node(NodeRecord(name=node))
        inventory.add_card(CardRecord(uuid=f"GPU-{node}", node=node, index=0, model="A100", memory_mib=MEMORY))
        inventory.reserve(f"on-{node}", Placement(node=node, cards=(CardShare(uuid=f"GPU-{node}", cores=100,
                                                                              memory_mib=MEMORY, whole=True),)))
    candidates = [Candidate(key="on-a", priority=0), Candidate(key="on-b", priority=1)]
    anywhere = choose_victims(inventory, PlacementRequest(gpu=GpuRequest.whole(1)), priority=5, candidates=candidates)
    assert isinstance(anywhere, Preemption) and anywhere.victims == ("on-a",)
    only_b = choose_victims(inventory, PlacementRequest(gpu=GpuRequest.whole(1), nodes=frozenset({"b"})), priority=5,
                            candidates=candidates)
    assert isinstance(only_b, Preemption) and only_b.victims == ("on-b",)


def _two_nodes_with_a_group() -> Inventory:
    """Nodes a and b, one card each, both full: "solo" (a one-member group) on a, and group "gang" with a
    member on each node."""
    inventory = Inventory()
    for node in ("a", "b"):
        inventory.add_node(NodeRecord(name=node))
        inventory.add_card(CardRecord(uuid=f"GPU-{node}", node=node, index=0, model="A100", memory_mib=MEMORY))
    for key, node, cores in (("solo", "a", 50), ("gang-a", "a", 50), ("gang-b", "b", 100)):
        inventory.reserve(key, Placement(node=node, cards=(CardShare(uuid=f"GPU-{node}", cores=cores,
                                                                     memory_mib=1024, whole=cores == 100),)))
    return inventory


def test_a_one_member_group_is_a_victim_like_any_claim() -> None:
    """Issue 33 item 3: the label `elasticgpu.io/group` made a claim immune; a group of one is a plain victim."""
    chosen = choose_victims(_two_nodes_with_a_group(), PlacementRequest(gpu=GpuRequest.share(50, 1024)), priority=5,
                            candidates=[Candidate(key="solo", priority=0, group="ns/solo"),
                                        Candidate(key="gang-a", priority=1, group="ns/gang"),
                                        Candidate(key="gang-b", priority=1, group="ns/gang")])
    assert isinstance(chosen, Preemption) and chosen.victims == ("solo",)


def test_a_group_goes_whole_and_counts_once() -> None:
    """Making room on node a takes the gang's member on b too; its priority counts once (1 < 2 for "solo")."""
    candidates = [Candidate(key="solo", priority=2, group="ns/solo"), Candidate(key="gang-a", priority=1,
                                                                                group="ns/gang"),
                  Candidate(key="gang-b", priority=1, group="ns/gang")]
    on_a = PlacementRequest(gpu=GpuRequest.share(50, 1024), nodes=frozenset({"a"}))
    chosen = choose_victims(_two_nodes_with_a_group(), on_a, priority=5, candidates=candidates)
    assert isinstance(chosen, Preemption) and chosen.victims == ("gang-a", "gang-b"), chosen
    assert chosen.total_priority == 1


def test_a_group_with_a_member_of_higher_priority_is_no_victim() -> None:
    on_a = PlacementRequest(gpu=GpuRequest.share(50, 1024), nodes=frozenset({"a"}))
    chosen = choose_victims(_two_nodes_with_a_group(), on_a, priority=5, candidates=[
        Candidate(key="gang-a", priority=1, group="ns/gang"), Candidate(key="gang-b", priority=7, group="ns/gang")])
    assert isinstance(chosen, NoPreemption)
