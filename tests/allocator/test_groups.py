"""Property tests of group placement (issue 27): all or none, never over capacity, pure."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from elasticgpu.allocator import Allocator, Inventory, Placement, PlacementRequest
from elasticgpu.allocator.groups import GroupMember, GroupPlacement, GroupUnplaceable, place_group, room_for_group
from tests.allocator.test_invariants import build, check_capacity, clusters, gpu_requests

POLICIES = ["binpack", "spread", "fragmentation"]
groups = st.lists(st.builds(PlacementRequest, gpu=gpu_requests), min_size=1, max_size=8)
# Claims already holding capacity before the group comes.
background = st.lists(st.builds(PlacementRequest, gpu=gpu_requests), max_size=8)


def _occupied(cluster: list[list[int]], others: list[PlacementRequest]) -> Inventory:
    inventory = build(cluster)
    allocator = Allocator(inventory, policy="spread")
    for i, request in enumerate(others):
        allocator.allocate(f"other-{i}", request)
    return inventory


@settings(max_examples=80, deadline=None)
@given(cluster=clusters, others=background, group=groups, policy=st.sampled_from(POLICIES))
def test_a_group_is_placed_whole_or_not_at_all_and_never_over_capacity(
        cluster: list[list[int]], others: list[PlacementRequest], group: list[PlacementRequest], policy: str) -> None:
    inventory = _occupied(cluster, others)
    before = inventory.snapshot()
    members = [GroupMember(f"m{i}", request) for i, request in enumerate(group)]
    result = place_group(inventory, members, policy=policy)
    assert inventory.snapshot() == before, "place_group changed the caller's inventory"
    if isinstance(result, GroupPlacement):
        assert set(result.placements) == {m.name for m in members}, "a partial placement"
        # Reserving every member on the real inventory must succeed and stay within capacity.
        for name, placement in result.placements.items():
            assert isinstance(placement, Placement)
            inventory.reserve(f"g/{name}", placement)
        check_capacity(inventory)
    else:
        assert isinstance(result, GroupUnplaceable)
        assert result.member in {m.name for m in members}
        assert 0 <= result.placed < len(members)
        assert result.member in result.message


@settings(max_examples=60, deadline=None)
@given(cluster=clusters, group=groups)
def test_a_group_alone_on_an_empty_cluster_fits_when_each_member_fits_a_card_of_its_own(
        cluster: list[list[int]], group: list[PlacementRequest]) -> None:
    """A sanity bound: when the room kept for a group exists, the group does fit an empty cluster."""
    inventory = build(cluster)
    members = [GroupMember(f"m{i}", request) for i, request in enumerate(group)]
    room = room_for_group(inventory, members)
    placed = place_group(inventory, members)
    assert (room is None) == isinstance(placed, GroupUnplaceable)


def test_the_short_member_is_named() -> None:
    from elasticgpu.api.resources import GpuRequest
    inventory = build([[40960, 40960]])
    members = [GroupMember("small", PlacementRequest(gpu=GpuRequest.share(50, 1024))),
               GroupMember("big", PlacementRequest(gpu=GpuRequest.whole(2)))]
    result = place_group(inventory, members)
    assert isinstance(result, GroupUnplaceable)
    assert result.member == "small" and result.placed == 1  # the big one went first and took both cards
