"""Kept room: whether nodes may be kept for a starved waiter (a claim, or a claim group, that
has waited past `group_reserve_after_s`; docs/gangs.md). Pure: the inventory, the waiter's
members and its namespace's quotas in, `Keep` (the nodes) or `NoRoom` (why not) out.

Keeping room takes nodes away from every other tenant, so it is done only for a waiter that
could bind if the room were free (issue 33: a claim its quota could never admit kept a node, and
another tenant's claim waited beside free cores). Checked first, in this order:

1. The class: every member placed on the cluster as if no claim held anything, with its class's
   `gpuModel`, `nodeSelector`, isolation and topology (`allocator.groups.place_group` on an
   empty copy). No such plan: nothing to keep room for.
2. The quotas of its namespace, as the commit would check them (`allocator.quota.check`), for
   every member at once (a group's members are charged to the same quotas):
   - *never*: the members' own request is above a hard limit, whatever else the namespace
     holds. No room, until the quota is raised.
   - *not now*: the request is within the limit, but with what the namespace's other claims
     hold it is not. No room while they hold it either: the room would sit idle while the
     tenant's own claims hold its quota, and other tenants' claims would wait behind it. The
     room is kept at the waiter's first sync after they go (its bounded wait is not started
     again: its `NoCapacity` condition stays).
   - a quota whose `spec.hard` cannot be read: no room (the claim could not bind either).

A member's amount is what its plan on the empty cluster would take (`quota.amount_of`), so a
share whose memory follows its cores is charged the memory of the card it would get.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from elasticgpu.allocator import Inventory, PlacementRequest, quota
from elasticgpu.allocator.groups import GroupMember, GroupUnplaceable, copy_inventory, place_group
from elasticgpu.api import ElasticGPUQuota, format_memory, names
from elasticgpu.api.errors import InvalidQuantity
from elasticgpu.api.quota import parse_hard, quota_key


def group_waiter(namespace: str, group: str) -> str:
    """How a waiting group is named where room is kept for it (and in the messages)."""
    return f"claim group {namespace}/{group}"


def single_waiter(namespace: str, name: str) -> str:
    """How a waiting single claim is named where room is kept for it."""
    return f"claim {namespace}/{name}"


NO_PLAN = "no-plan"
"""`NoRoom.kind`: not even an empty cluster could hold it (class, node selector, isolation)."""
QUOTA_NEVER = "quota-never"
"""`NoRoom.kind`: its request alone is above a hard limit of its namespace's quota."""
QUOTA_NOT_NOW = "quota-not-now"
"""`NoRoom.kind`: within the limit, but not with what its namespace's other claims hold."""
QUOTA_UNREADABLE = "quota-unreadable"
"""`NoRoom.kind`: a quota of its namespace cannot be read."""


@dataclass(frozen=True)
class Member:
    """One claim of a waiter: its name (unique in the waiter), uid, class and placement request."""

    name: str
    uid: str
    class_name: str
    request: PlacementRequest


@dataclass(frozen=True)
class Charge:
    """What one member would be charged: its uid, class and amount."""

    uid: str
    class_name: str
    amount: quota.Amount


@dataclass(frozen=True)
class Keep:
    """Keep these nodes for the waiter."""

    nodes: frozenset[str]


@dataclass(frozen=True)
class NoRoom:
    """Keep nothing for the waiter; `message` (for its claims' status message; their reason
    stays the wait's, `NoCapacity` or `GroupDoesNotFit`) says why, `kind` which check refused."""

    kind: str
    message: str


def _show(resource: str, amount: int) -> str:
    return format_memory(amount) if resource == names.RESOURCE_MEMORY and amount else str(amount)


def quota_verdict(quotas: Iterable[ElasticGPUQuota], charges: Sequence[Charge], *,
                  subject: str = "it") -> NoRoom | None:
    """Whether the namespace's quotas admit every charge of `charges` at once, as the commit
    would (`quota.check`, each namespace-wide key and each key of a member's class): None when
    they do, else why not (never, not now, unreadable). `subject` names the waiter in the
    message ("this claim", "the group"). The members' own charges already in a quota are
    replaced, not added, as the commit's check does. Pure."""
    uids = {c.uid for c in charges}
    # Every quota is looked at: one that never admits the waiter says more than one that admits
    # it later (which may come first by name), and the claim's message should say the worst.
    unreadable: NoRoom | None = None
    not_now: NoRoom | None = None
    for item in sorted(quotas, key=lambda q: q.metadata.name or ""):
        name = item.metadata.name or ""
        try:
            limits = parse_hard(item.spec.hard)
        except InvalidQuantity as err:
            unreadable = unreadable or NoRoom(QUOTA_UNREADABLE, f"ElasticGPUQuota {name}: {err}; fix spec.hard")
            continue
        others = [c for c in item.status.charges if c.uid not in uids]
        for (limit_class, resource), hard in sorted(limits.items(), key=lambda i: (i[0][0] or "", i[0][1])):
            wanted = sum(c.amount.of(resource) for c in charges if limit_class in (None, c.class_name))
            if wanted == 0:
                continue  # as the commit's check: a key the waiter asks nothing of never refuses it
            key = quota_key(limit_class, resource)
            if wanted > hard:
                # Never: no claim of the namespace going away makes room for it.
                return NoRoom(QUOTA_NEVER, f"ElasticGPUQuota {name} can never admit {subject}: {key} has limit"
                                           f" {_show(resource, hard)}, and {subject} asks for"
                                           f" {_show(resource, wanted)}; raise the quota or ask for less")
            used = quota.used_by(others, limit_class, resource)
            if used + wanted > hard and not_now is None:
                not_now = NoRoom(QUOTA_NOT_NOW, f"ElasticGPUQuota {name}: {key} used {_show(resource, used)} of its"
                                                f" limit {_show(resource, hard)} by other claims of the namespace,"
                                                f" and {subject} asks for {_show(resource, wanted)}; room is kept"
                                                " once they leave it enough")
    return unreadable or not_now


def decide(inventory: Inventory, members: Sequence[Member], quotas: Iterable[ElasticGPUQuota], *,
           policy: str = "binpack", subject: str = "it") -> Keep | NoRoom:
    """Whether to keep room for a waiter of `members` (one namespace), and which nodes: those of
    its plan on `inventory` emptied of every reservation, if that plan exists and the quotas
    admit the amounts it takes (see the module docstring). `inventory` is not changed. Pure."""
    if not members:
        return NoRoom(NO_PLAN, "nothing to place")
    scratch = copy_inventory(inventory, keep_reservations=False)
    plan = place_group(scratch, [GroupMember(m.name, m.request) for m in members], policy=policy)
    if isinstance(plan, GroupUnplaceable):
        return NoRoom(NO_PLAN, f"even with every card free, {subject} would not fit the cards its class may use"
                               f" ({plan.message})")
    charges = [Charge(m.uid, m.class_name, quota.amount_of(plan.placements[m.name])) for m in members]
    refused = quota_verdict(quotas, charges, subject=subject)
    if refused is not None:
        return refused
    return Keep(frozenset(scratch.card(share.uuid).record.node
                          for placement in plan.placements.values() for share in placement.cards))
