"""The pure kept-room decision (issue 33 item 6, `decisions/kept_room.py`): room is kept only for
a waiter that could bind if the room were free. Properties against the commit's own quota check
and the allocator, plus the messages."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from elasticgpu.allocator import Allocator, Inventory, PlacementRequest, quota
from elasticgpu.allocator.groups import GroupMember, GroupPlacement, GroupUnplaceable, copy_inventory, place_group
from elasticgpu.api import ElasticGPUQuota, QuotaCharge, names
from elasticgpu.api.resources import GpuRequest
from elasticgpu.controller.decisions import kept_room
from tests.allocator.test_invariants import build, clusters, gpu_requests

CORE, MEMORY, CARDS = names.RESOURCE_CORE, names.RESOURCE_MEMORY, names.RESOURCE_NVIDIA_GPU
CLASSES = ["a100", "t4"]

amounts = st.builds(quota.Amount, cores=st.integers(0, 400), memory_mib=st.integers(0, 200_000),
                    cards=st.integers(0, 4))
charges = st.lists(st.tuples(st.sampled_from(CLASSES), amounts), max_size=4)
hards = st.dictionaries(
    st.tuples(st.sampled_from([None, *CLASSES]), st.sampled_from([CORE, MEMORY, CARDS])),
    st.integers(0, 500), max_size=4)


def _quota(name: str, hard: dict[tuple[str | None, str], int], held: list[tuple[str, quota.Amount]]) -> ElasticGPUQuota:
    spec = {(f"{c}.{r}" if c else r): (f"{v}Mi" if r == MEMORY else v) for (c, r), v in hard.items()}
    status = [QuotaCharge(claim=f"other-{i}", uid=f"other-{name}-{i}", class_name=c, cores=a.cores,
                          memory=a.memory_mib, cards=a.cards).to_dict() for i, (c, a) in enumerate(held)]
    return ElasticGPUQuota.model_validate({"metadata": {"name": name, "namespace": "ns"}, "spec": {"hard": spec},
                                           "status": {"charges": status}})


def _commits(quotas: list[ElasticGPUQuota], waiter: list[kept_room.Charge]) -> bool:
    """Whether the commit would admit every member, one after another, each charge written
    before the next member's check (`quota.check` and `quota.status_with`, as the guard does)."""
    current = list(quotas)
    for member in waiter:
        verdict = quota.check(current, uid=member.uid, class_name=member.class_name, amount=member.amount)
        if not isinstance(verdict, quota.Fits):
            return False
        entry = quota.charge_for(claim=member.uid, uid=member.uid, class_name=member.class_name, amount=member.amount)
        current = [ElasticGPUQuota.model_validate({**q.to_dict(), "status": quota.status_with(q, entry)})
                   for q in current]
    return True


def _without_charges(quotas: list[ElasticGPUQuota]) -> list[ElasticGPUQuota]:
    return [ElasticGPUQuota.model_validate({**q.to_dict(), "status": {}}) for q in quotas]


@settings(max_examples=300, deadline=None)
@given(specs=st.lists(st.tuples(hards, charges), max_size=2),
       waiter=st.lists(st.tuples(st.sampled_from(CLASSES), amounts), min_size=1, max_size=3))
def test_the_quota_verdict_agrees_with_the_commit(
        specs: list[tuple[dict[tuple[str | None, str], int], list[tuple[str, quota.Amount]]]],
        waiter: list[tuple[str, quota.Amount]]) -> None:
    """Room is kept (no refusal) exactly when the commit would admit every member now; `never`
    exactly when it would not even with the namespace's other claims gone; `not now` when it
    would then, but not with them."""
    quotas = [_quota(f"q{i}", hard, held) for i, (hard, held) in enumerate(specs)]
    members = [kept_room.Charge(f"m{i}", c, a) for i, (c, a) in enumerate(waiter)]
    verdict = kept_room.quota_verdict(quotas, members)
    assert (verdict is None) == _commits(quotas, members), verdict
    if verdict is not None:
        assert verdict.kind in (kept_room.QUOTA_NEVER, kept_room.QUOTA_NOT_NOW)
        alone = _commits(_without_charges(quotas), members)
        assert alone == (verdict.kind == kept_room.QUOTA_NOT_NOW), verdict
        assert "ElasticGPUQuota q" in verdict.message


background = st.lists(st.builds(PlacementRequest, gpu=gpu_requests), max_size=6)
waiters = st.lists(st.builds(PlacementRequest, gpu=gpu_requests), min_size=1, max_size=3)


def _occupied(cluster: list[list[int]], others: list[PlacementRequest]) -> Inventory:
    inventory = build(cluster)
    allocator = Allocator(inventory, policy="spread")
    for i, request in enumerate(others):
        allocator.allocate(f"other-{i}", request)
    return inventory


@settings(max_examples=150, deadline=None)
@given(cluster=clusters, others=background, waiter=waiters, hard=st.one_of(st.none(), st.integers(0, 600)),
       policy=st.sampled_from(["binpack", "spread", "fragmentation"]))
def test_room_is_kept_only_where_the_waiter_binds_once_it_is_free(
        cluster: list[list[int]], others: list[PlacementRequest], waiter: list[PlacementRequest], hard: int | None,
        policy: str) -> None:
    """Keep(nodes): with every claim on those nodes gone, the waiter places on them alone and its
    quota admits what it takes. NoRoom for the plan: not even an empty cluster holds it."""
    inventory = _occupied(cluster, others)
    before = inventory.snapshot()
    quotas = [] if hard is None else [_quota("team", {(None, CORE): hard}, [])]
    members = [kept_room.Member(f"m{i}", f"uid-{i}", "a100", r) for i, r in enumerate(waiter)]
    verdict = kept_room.decide(inventory, members, quotas, policy=policy)
    assert inventory.snapshot() == before, "decide changed the caller's inventory"
    empty = copy_inventory(inventory, keep_reservations=False)
    if isinstance(verdict, kept_room.NoRoom):
        if verdict.kind == kept_room.NO_PLAN:
            assert isinstance(place_group(empty, [GroupMember(m.name, m.request) for m in members]),
                              GroupUnplaceable)
        else:
            assert verdict.kind == kept_room.QUOTA_NEVER  # no other claim holds any quota here
        return
    # The room freed: every reservation on the kept nodes gone, the waiter limited to them.
    for key, placement in list(inventory.reservations.items()):
        if placement.node in verdict.nodes:
            inventory.release(key)
    limited = [GroupMember(m.name, PlacementRequest(gpu=m.request.gpu, nodes=verdict.nodes)) for m in members]
    placed = place_group(inventory, limited, policy=policy)
    assert isinstance(placed, GroupPlacement), placed
    taken = [kept_room.Charge(m.uid, m.class_name, quota.amount_of(placed.placements[m.name])) for m in members]
    assert _commits(quotas, taken)


def test_the_issue_s_reproduction_keeps_no_room_and_says_why() -> None:
    """A 10-core quota and one 100-core claim: never, named with the quota, its limit and the ask."""
    inventory = build([[81920]])
    member = kept_room.Member("big", "uid", "a100", PlacementRequest(gpu=GpuRequest.share(100, 10240)))
    verdict = kept_room.decide(inventory, [member], [_quota("tenant", {(None, CORE): 10}, [])], subject="this claim")
    assert isinstance(verdict, kept_room.NoRoom) and verdict.kind == kept_room.QUOTA_NEVER
    assert verdict.message == (f"ElasticGPUQuota tenant can never admit this claim: {CORE} has limit 10, and this"
                               " claim asks for 100; raise the quota or ask for less")
    assert isinstance(kept_room.decide(inventory, [member], []), kept_room.Keep)


def test_not_now_names_what_the_namespace_holds_and_an_unreadable_quota_keeps_nothing() -> None:
    inventory = build([[81920]])
    member = kept_room.Member("big", "uid", "a100", PlacementRequest(gpu=GpuRequest.share(100, 10240)))
    held = _quota("tenant", {(None, CORE): 100}, [("a100", quota.Amount(cores=60))])
    verdict = kept_room.decide(inventory, [member], [held])
    assert isinstance(verdict, kept_room.NoRoom) and verdict.kind == kept_room.QUOTA_NOT_NOW
    assert "used 60 of its limit 100" in verdict.message and "asks for 100" in verdict.message
    bad = ElasticGPUQuota.model_validate({"metadata": {"name": "bad", "namespace": "ns"},
                                          "spec": {"hard": {MEMORY: "lots"}}})
    unreadable = kept_room.decide(inventory, [member], [bad])
    assert isinstance(unreadable, kept_room.NoRoom) and unreadable.kind == kept_room.QUOTA_UNREADABLE


def test_a_class_whose_cards_cannot_hold_it_keeps_nothing() -> None:
    inventory = build([[16384, 16384]])
    member = kept_room.Member("big", "uid", "a100", PlacementRequest(gpu=GpuRequest.whole(4, None)))
    verdict = kept_room.decide(inventory, [member], [])
    assert isinstance(verdict, kept_room.NoRoom) and verdict.kind == kept_room.NO_PLAN
    picky = kept_room.Member("m", "uid", "a100", PlacementRequest(gpu=GpuRequest.share(30, None), models=("H100*",)))
    assert isinstance(kept_room.decide(inventory, [picky], []), kept_room.NoRoom)
