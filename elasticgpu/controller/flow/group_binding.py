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


class GroupBinding:
    """Binds claim groups all or none (see the module docstring)."""

    def __init__(self, sync: ClaimSync) -> None:
        self.sync = sync
        self._kept: dict[tuple[str, str], tuple[frozenset[str], float]] = {}
        """(namespace, group) -> the nodes kept for it and until when (monotonic)."""
        self._rechecks: dict[tuple[str, str], float] = {}
        """(namespace, group) -> when its bounded wait is looked at again (monotonic)."""

    # -- room kept for starved groups ----------------------------------------------------------

    def kept_nodes(self) -> dict[str, str]:
        """Nodes kept for a waiting group -> "namespace/group" (smaller claims avoid them)."""
        now = time.monotonic()
        kept: dict[str, str] = {}
        for (namespace, group), (nodes, until) in list(self._kept.items()):
            if until < now:
                self._kept.pop((namespace, group), None)
                continue
            for node in nodes:
                kept[node] = f"{namespace}/{group}"
        return kept

    def _keep_room(self, namespace: str, group: str, members: list[_Member]) -> None:
        settings = self.sync.settings
        after = settings.binding.group_reserve_after_s
        if after <= 0:
            return
        since = [timestamps.parse(c.last_transition_time) for m in members for c in m.claim.status.conditions
                 if c.reason == groups.REASON_GROUP_DOES_NOT_FIT]
        known = [s for s in since if s is not None]
        waited = (datetime.now(UTC) - min(known)).total_seconds() if known else 0.0
        if waited < after:
            # Look again when the wait is over, whatever else wakes the group meanwhile.
            # Once per group and wait (every member's sync comes here).
            due = time.monotonic() + after - waited + 1.0
            if self._rechecks.get((namespace, group), 0.0) < time.monotonic():
                self._rechecks[(namespace, group)] = due
                first = members[0].claim.metadata
                self.sync.queue.add(("claim", namespace, first.name or ""), delay_s=due - time.monotonic(),
                                    recheck=True)
            return
        picture = self.sync.picture
        with picture.lock:
            uuids = room_for_group(picture.ledger.inventory, [GroupMember(m.name, request_of(m.decision))
                                                              for m in members])
            if uuids is None:
                return
            nodes = frozenset(picture.ledger.inventory.card(u).record.node for u in uuids)
        # Refreshed by every sync of the waiting group; lapses when the group stops waiting.
        until = time.monotonic() + 2 * settings.resync.interval_s + after
        if self._kept.get((namespace, group), (None, 0.0))[0] != nodes:
            logger.info("keeping nodes %s for claim group %s/%s, waiting since %s", sorted(nodes), namespace, group,
                        min(known).isoformat())
        self._kept[(namespace, group)] = (nodes, until)

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
            with picture.lock:
                view = picture.view()
                for found in claims:
                    said = binder.decide_claim(found, view)
                    if isinstance(said, binder.Wait | binder.MarkLost):
                        # The gang binds whole: a member that cannot bind for its own reason holds all back.
                        sync.pending(claim, groups.REASON_GROUP_INCOMPLETE,
                                     f"group {group.name}: member {found.metadata.name} cannot bind yet"
                                     f" ({said.reason}: {said.message})")
                        return
                    if not isinstance(said, binder.Provision):
                        continue  # bound, or binding to its ElasticGPU already
                    key = names.elastic_gpu_name_for_claim(found.metadata.uid or "")
                    placement = ledger.held(key)
                    if placement is not None:
                        held[key] = placement
                    else:
                        todo.append(_Member(found, said, key))
                plan = place_group(ledger.inventory, [GroupMember(m.name, request_of(m.decision)) for m in todo],
                                   policy=decision.parameters.policy)
            if isinstance(plan, GroupUnplaceable):
                self._does_not_fit(claim, held, todo, plan)
                return
            if not self._commit_all(claim, todo, plan, attempt):
                if self._quota_refused:
                    return
                continue
            self._kept.pop((namespace, group.name), None)
            self._rechecks.pop((namespace, group.name), None)
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
        self._keep_room(namespace, groups.group_name(claim), todo)

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
