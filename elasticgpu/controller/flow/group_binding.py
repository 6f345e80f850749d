"""Group binding (gangs, issue 27): a claim group's members are reserved all or none.

A member's sync plans the whole group on the picture (`allocator.groups.place_group`: every
member placed, or the short one named), then commits each member's reservation as a single bind
does (`Commit.commit`: a resourceVersion-guarded write of the GPU's status, under the member's
ElasticGPU key, with its claim). If a commit fails, the ones this sync made are freed again and
the group is re-planned. Once every member holds its reservation, each member finishes its own
bind (create the ElasticGPU, bind the claim), as a single claim does after its commit point.

A group found partly reserved (a crash between commits, or another controller mid-way) is
completed when the rest fits, and released when it does not (after `group_partial_grace_s`,
so another controller's commits in flight are not undone under it). A group that does not fit
says so on every member (`GroupDoesNotFit`, naming the short member) and holds nothing; after
`group_reserve_after_s` of that, the nodes its plan needs on an empty cluster are kept from
smaller claims (`kept_nodes`) until the group binds.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from elasticgpu.allocator import Placement, PlacementRequest
from elasticgpu.allocator.groups import GroupMember, GroupPlacement, GroupUnplaceable, place_group, room_for_group
from elasticgpu.api import ElasticGPUClaim, names, timestamps
from elasticgpu.controller import errors
from elasticgpu.controller.decisions import binder, groups
from elasticgpu.controller.flow.provisioner import claim_ref_of
from elasticgpu.controller.flow.quota_guard import QuotaExceeded

if TYPE_CHECKING:
    from elasticgpu.controller.flow.claim_sync import ClaimSync

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Member:
    claim: ElasticGPUClaim
    decision: binder.Provision
    key: str  # its ElasticGPU's name: the reservation key

    @property
    def name(self) -> str:
        return self.claim.metadata.name or ""


def request_of(decision: binder.Provision) -> PlacementRequest:
    """The placement request of a provisioning decision (as a single bind builds it)."""
    return PlacementRequest(gpu=decision.request, models=decision.parameters.gpu_model,
                            node_selector=decision.parameters.node_selector, isolation=decision.required_isolation)


def group_waiter(namespace: str, group: str) -> str:
    """How a waiting group is named where room is kept for it (and in the messages)."""
    return f"claim group {namespace}/{group}"


def single_waiter(claim: ElasticGPUClaim) -> str:
    """How a waiting single claim is named where room is kept for it."""
    return f"claim {claim.metadata.namespace}/{claim.metadata.name}"


class GroupBinding:
    """Binds claim groups all or none (see the module docstring)."""

    def __init__(self, sync: ClaimSync) -> None:
        self.sync = sync
        self._kept: dict[str, tuple[frozenset[str], float]] = {}
        """Waiter ("claim group ns/name" or "claim ns/name") -> the nodes kept for it and until
        when (monotonic). One waiter at a time: the first to have waited past the bound."""
        self._rechecks: dict[str, float] = {}
        """Waiter -> when its bounded wait is looked at again (monotonic)."""

    # -- room kept for starved waiters -----------------------------------------------------------

    def kept_nodes(self, *, but: str = "") -> dict[str, str]:
        """Nodes kept for a starved waiter -> the waiter (other claims avoid them); `but`: the
        waiter asking, whose own room is not kept from it."""
        now = time.monotonic()
        kept: dict[str, str] = {}
        for waiter, (nodes, until) in list(self._kept.items()):
            if until < now:
                self._kept.pop(waiter, None)
                continue
            if waiter != but:
                kept.update(dict.fromkeys(nodes, waiter))
        return kept

    def done_waiting(self, waiter: str) -> None:
        """`waiter` bound (or no longer waits): its room is free for everyone again."""
        self._kept.pop(waiter, None)
        self._rechecks.pop(waiter, None)

    def single_waits(self, claim: ElasticGPUClaim, decision: binder.Provision) -> None:
        """A single claim said NoCapacity: the same bounded wait as a group of one (the issue's
        "big claims can wait indefinitely")."""
        key = names.elastic_gpu_name_for_claim(claim.metadata.uid or "")
        self._keep_room(single_waiter(claim), [_Member(claim, decision, key)], binder.REASON_NO_CAPACITY)

    def _keep_room(self, waiter: str, members: list[_Member], reason: str) -> None:
        settings = self.sync.settings
        after = settings.binding.group_reserve_after_s
        if after <= 0 or not members:
            return
        namespace = members[0].claim.metadata.namespace or ""
        since = [timestamps.parse(c.last_transition_time) for m in members for c in m.claim.status.conditions
                 if c.reason == reason]
        known = [s for s in since if s is not None]
        waited = (datetime.now(UTC) - min(known)).total_seconds() if known else 0.0
        now = time.monotonic()
        if waited < after:
            # Look again when the wait is over, whatever else wakes the waiter meanwhile; once
            # per waiter and wait (every member's sync comes here).
            if self._rechecks.get(waiter, 0.0) < now:
                self._rechecks[waiter] = now + after - waited + 1.0
                self.sync.queue.add(("claim", namespace, members[0].name), delay_s=after - waited + 1.0,
                                    recheck=True)
            return
        if any(other != waiter and until >= now for other, (_, until) in self._kept.items()):
            return  # one starved waiter at a time: keeping room for all would keep every node
        picture = self.sync.picture
        with picture.lock:
            uuids = room_for_group(picture.ledger.inventory, [GroupMember(m.name, request_of(m.decision))
                                                              for m in members])
            if uuids is None:
                return
            nodes = frozenset(picture.ledger.inventory.card(u).record.node for u in uuids)
        # Refreshed by every sync of the waiter; lapses when it stops waiting (deleted, say).
        until = now + 2 * settings.resync.interval_s + after
        if self._kept.get(waiter, (None, 0.0))[0] != nodes:
            logger.info("keeping nodes %s for %s, waiting since %s", sorted(nodes), waiter, min(known).isoformat())
        self._kept[waiter] = (nodes, until)

    # -- the group's sync ------------------------------------------------------------------------

    def _members(self, namespace: str, group: str) -> list[ElasticGPUClaim]:
        picture = self.sync.picture
        found: list[ElasticGPUClaim] = []
        with picture.lock:
            for ns, name in picture.claim_keys():
                if ns != namespace:
                    continue
                member = picture.claim(ns, name)
                if member is not None and groups.group_name(member) == group and not member.metadata.deletion_timestamp:
                    found.append(member)
        return sorted(found, key=lambda c: c.metadata.name or "")

    def provision(self, claim: ElasticGPUClaim, decision: binder.Provision) -> None:
        """The `Provision` step of a group member: reserve the group all or none, then finish
        this member's bind (the others' syncs finish theirs)."""
        sync = self.sync
        group = groups.group_of(claim)
        if isinstance(group, groups.InvalidGroup):
            sync.pending(claim, groups.REASON_INVALID_GROUP, group.message)
            return
        assert group is not None
        namespace = claim.metadata.namespace or ""
        claims = self._members(namespace, group.name)
        missing = groups.incomplete(group, claims)
        if missing:
            sync.pending(claim, groups.REASON_GROUP_INCOMPLETE, missing)
            return
        picture = sync.picture
        ledger = picture.ledger
        own_key = names.elastic_gpu_name_for_claim(claim.metadata.uid or "")
        for attempt in range(sync.settings.binding.conflict_retries):
            held: dict[str, Placement] = {}
            todo: list[_Member] = []
            misshapen: list[tuple[ElasticGPUClaim, str]] = []
            with picture.lock:
                view = picture.view()
                for found in claims:
                    said = binder.decide_claim(found, view)
                    key = names.elastic_gpu_name_for_claim(found.metadata.uid or "")
                    if isinstance(said, binder.Wait | binder.MarkLost) and (
                            ledger.held(key) is not None or picture.egpu(key) is not None):
                        continue  # reserved already, mid-way through its own bind: not holding anyone back
                    if isinstance(said, binder.Wait | binder.MarkLost):
                        # The gang binds whole: a member that cannot bind for its own reason holds all back.
                        sync.pending(claim, groups.REASON_GROUP_INCOMPLETE,
                                     f"group {group.name}: member {found.metadata.name} cannot bind yet"
                                     f" ({said.reason}: {said.message})")
                        return
                    if not isinstance(said, binder.Provision):
                        continue  # bound, or binding to its ElasticGPU already
                    placement = ledger.held(key)
                    if placement is not None and len(placement.cards) != max(1, said.request.cards):
                        misshapen.append((found, key))
                    elif placement is not None:
                        held[key] = placement
                    else:
                        todo.append(_Member(found, said, key))
                plan = place_group(ledger.inventory, [GroupMember(m.name, request_of(m.decision)) for m in todo],
                                   policy=decision.parameters.policy)
            if misshapen:
                # Two controllers reserved one member on different cards (or a multi-card write
                # was cut short): as a single bind does, keep what its ElasticGPU names, if it
                # exists, else free it, and plan again.
                for found, key in misshapen:
                    if not sync.adopt_existing(found, key):
                        sync.commit.free_reservation(key)
                continue
            if isinstance(plan, GroupUnplaceable):
                self._does_not_fit(claim, held, todo, plan)
                return
            if not self._commit_all(claim, todo, plan, attempt):
                if self._quota_refused:
                    return
                continue
            self.done_waiting(group_waiter(namespace, group.name))
            for member in todo:
                if member.key != own_key:
                    sync.queue.add(("claim", namespace, member.name))
            placement = held.get(own_key) or plan.placements.get(claim.metadata.name or "")
            if placement is not None:
                sync.after_commit(claim, decision, own_key, placement)
            return
        raise errors.BindingError(f"claim group {namespace}/{group.name}: too many conflicts on the GPUs;"
                                  " retrying later")

    _quota_refused = False

    def _commit_all(self, claim: ElasticGPUClaim, todo: list[_Member], plan: GroupPlacement, attempt: int) -> bool:
        """Commit every planned member; on a failure free what this call committed and answer
        False (`_quota_refused` tells a quota's no, said on the claim, from a lost race)."""
        sync = self.sync
        committed: list[str] = []
        self._quota_refused = False
        try:
            for member in todo:
                sync.commit.commit(member.key, plan.placements[member.name], claim_ref_of(member.claim))
                committed.append(member.key)
        except QuotaExceeded as err:
            self._rollback(committed)
            self._quota_refused = True
            sync.pending(claim, err.reason, f"group member {member.name}: {err.message}")
            sync.queue.add(("claim", claim.metadata.namespace or "", claim.metadata.name or ""),
                           delay_s=sync.settings.quota.recheck_s, recheck=True)
            return False
        except (errors.Conflict, errors.Rejected) as err:
            logger.debug("group reservation lost a race, rolling back %d and re-planning: %s", len(committed), err)
            self._rollback(committed)
            sync.commit.backoff(attempt)
            return False
        return True

    def _rollback(self, keys: list[str]) -> None:
        for key in keys:
            self.sync.commit.free_reservation(key)

    def _does_not_fit(self, claim: ElasticGPUClaim, held: dict[str, Placement], todo: list[_Member],
                      plan: GroupUnplaceable) -> None:
        """Release a partial group (past its grace), say GroupDoesNotFit on every waiting member,
        and keep room for the group once it has waited long enough."""
        sync = self.sync
        namespace = claim.metadata.namespace or ""
        if held:
            young = self._youngest_age(held)
            grace = sync.settings.binding.group_partial_grace_s
            if young < grace:
                # Maybe another controller's commits in flight: look again once they are old.
                sync.queue.add(("claim", namespace, claim.metadata.name or ""), delay_s=grace - young + 0.1)
            else:
                logger.info("releasing the partial reservations of claim group %s/%s: the group does not fit",
                            namespace, groups.group_name(claim))
                self._rollback(sorted(held))
        for member in todo:
            try:
                sync.pending(member.claim, groups.REASON_GROUP_DOES_NOT_FIT, plan.message)
            except errors.Conflict:
                sync.queue.add(("claim", namespace, member.name))
        self._keep_room(group_waiter(namespace, groups.group_name(claim)), todo, groups.REASON_GROUP_DOES_NOT_FIT)

    def _youngest_age(self, held: dict[str, Placement]) -> float:
        """Seconds since the youngest of `held`'s reservations was written (0 when unknown)."""
        ledger = self.sync.picture.ledger
        now = datetime.now(UTC)
        ages: list[float] = []
        with self.sync.picture.lock:
            for key in held:
                for gpu_name in ledger.gpus_holding(key):
                    allocation = ledger.allocation(gpu_name, key)
                    when = timestamps.parse(allocation.reserved_at) if allocation is not None else None
                    ages.append((now - when).total_seconds() if when is not None else float("inf"))
        return min(ages, default=0.0)
