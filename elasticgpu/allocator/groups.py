"""Group placement (gangs, issue 27): place every member of a claim group, or none.

`place_group` plans a whole group on a copy of the inventory: each member is placed and
reserved on the copy so the next member sees it, biggest first (a big member placed last finds
the cluster cut up by the small ones). The caller's inventory is never changed. The answer is
either a placement for every member (`GroupPlacement`) or the member that could not be placed
and why (`GroupUnplaceable`): never a partial plan.

`room_for_group` is the bounded-wait answer: where the group would go if only the cards' other
holders were gone (the cards to stop giving to smaller claims, so the group is not starved).
The controller asks `controller/decisions/kept_room.py` instead, which plans the same way and
also checks the namespace's quotas before any room is kept.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from elasticgpu.allocator.allocating import Allocator
from elasticgpu.allocator.inventory import Inventory
from elasticgpu.allocator.records import Placement, PlacementRequest, Unplaceable


@dataclass(frozen=True)
class GroupMember:
    """One member of a group: its name (what the user reads in a message) and its request."""

    name: str
    request: PlacementRequest


@dataclass(frozen=True)
class GroupPlacement:
    """A placement for every member, by member name; together they fit the inventory."""

    placements: Mapping[str, Placement]


@dataclass(frozen=True)
class GroupUnplaceable:
    """The group does not fit: `member` is the first that found no room once the others placed
    before it were reserved; `reason` is the allocator's word for it; `placed` how many had room."""

    member: str
    reason: str
    placed: int

    @property
    def message(self) -> str:
        """The sentence every member's status shows."""
        return (f"the group does not fit: member {self.member} finds no room once {self.placed} other member(s)"
                f" are placed ({self.reason}); nothing is held while the group waits")


def _size(member: GroupMember) -> tuple[int, int, int]:
    gpu = member.request.gpu
    if gpu is None:
        return (0, 0, 0)
    return (gpu.cards, gpu.cores, gpu.memory_mib or 0)


def copy_inventory(inventory: Inventory, *, keep_reservations: bool = True) -> Inventory:
    """A private copy of `inventory` (nodes, cards, health; reservations when
    `keep_reservations`). Nothing subscribes to it, so reserving on it disturbs no cache."""
    scratch = Inventory()
    for node in inventory.nodes():
        scratch.add_node(node.record)
        for card in node.cards:
            scratch.add_card(card.record)
    if keep_reservations:
        for key, placement in inventory.reservations.items():
            scratch.reserve(key, placement)
    return scratch


def _order(members: Sequence[GroupMember]) -> list[GroupMember]:
    # Biggest first, then by name: deterministic, and the hardest member gets the most choice.
    return sorted(members, key=lambda m: (tuple(-x for x in _size(m)), m.name))


def place_group(inventory: Inventory, members: Sequence[GroupMember], *,
                policy: str = "binpack") -> GroupPlacement | GroupUnplaceable:
    """Place every member of `members` on `inventory` (not changed), or say which one is short.
    Member names must be unique; an empty group is placed trivially."""
    if len({m.name for m in members}) != len(members):
        raise ValueError("group members must have unique names")
    scratch = copy_inventory(inventory)
    allocator = Allocator(scratch, policy=policy)
    placements: dict[str, Placement] = {}
    for member in _order(members):
        result = allocator.place(member.request)
        if isinstance(result, Unplaceable):
            return GroupUnplaceable(member=member.name, reason=result.reason, placed=len(placements))
        scratch.reserve(f"group-member/{member.name}", result)
        placements[member.name] = result
    return GroupPlacement(placements)


def room_for_group(inventory: Inventory, members: Sequence[GroupMember], *,
                   policy: str = "binpack") -> frozenset[str] | None:
    """The card uuids the group would use if no other claim held anything (to keep for it after
    its bounded wait), or None when it would not fit even then."""
    scratch = copy_inventory(inventory, keep_reservations=False)
    planned = place_group(scratch, members, policy=policy)
    if isinstance(planned, GroupUnplaceable):
        return None
    return frozenset(share.uuid for p in planned.placements.values() for share in p.cards)
