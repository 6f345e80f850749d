"""Group binding (gangs, issue 27): a claim group's members are reserved all or none.

A member's sync plans the whole group on the picture (`allocator.groups.place_group`: every
member placed, or the short one named), then reserves it in one commit attempt
(`flow/groups/group_commit.py`): each member's reservation is a resourceVersion-guarded write of the
GPU's status, as a single bind's is, carrying the attempt's record (token, anchor, anchor GPU,
state Committing); then one guarded write of the anchor's reservation makes the attempt
Complete. A failed write aborts the attempt (Aborted on the anchor first) and frees its
reservations, by token. Members bind (create the ElasticGPU, bind the claim) only from a
Complete attempt, each in its own sync, as a single claim does after its commit point.

Attempts found on the GPUs (another controller's, or one a crash left) are judged by
`decisions/group_attempts.py`: a live one is waited for (`GroupReserving`), one past
`group_partial_grace_s` is aborted by the same one write on its anchor and freed, an Aborted
one is freed. So a group left partial by a crash is released and planned again, and no
controller frees what another may still bind. A group that does not fit says so on every
member (`GroupDoesNotFit`, naming the short member) and holds nothing; after
`group_reserve_after_s` of that, the nodes its plan needs on an empty cluster are kept from
smaller claims (`kept_nodes`) until the group binds.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from elasticgpu.allocator import Placement, PlacementRequest
from elasticgpu.allocator.groups import GroupMember, GroupPlacement, GroupUnplaceable, place_group
from elasticgpu.api import ElasticGPUClaim, ElasticGPUQuota, GPUAllocation, timestamps
from elasticgpu.api.gpu import GPUAllocationGroup
from elasticgpu.controller import errors
from elasticgpu.controller.decisions import binder, group_attempts, groups, kept_room, provisioned_names
from elasticgpu.controller.flow.binding.claim_binding import ClaimBinding
from elasticgpu.controller.flow.binding.claim_status import ClaimStatus
from elasticgpu.controller.flow.binding.commit import Commit
from elasticgpu.controller.flow.binding.provisioner import claim_ref_of
from elasticgpu.controller.flow.groups.group_commit import GroupCommit, age_s
from elasticgpu.controller.flow.machinery.workqueue import WorkQueue
from elasticgpu.controller.flow.quota_guard import QuotaExceeded
from elasticgpu.controller.picture.picture import Picture
from elasticgpu.controller.settings import ControllerSettings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Found:
    """A group as one look at the picture shows it."""

    attempts: list[group_attempts.Attempt]
    provisioned: frozenset[str]
    held: dict[str, Placement]
    """Reservation key -> placement, of members a Complete attempt holds."""
    todo: list[_Member]
    plan: GroupPlacement | GroupUnplaceable


@dataclass(frozen=True)
class _Member:
    claim: ElasticGPUClaim
    decision: binder.Provision
    key: str  # its ElasticGPU's name: the reservation key

    @property
    def name(self) -> str:
        return self.claim.metadata.name or ""


def request_of(decision: binder.Provision) -> PlacementRequest:
    """The placement request of a provisioning decision (as a single bind builds it, topology
    included: room kept for several NVLinked cards must be on cards that are)."""
    return PlacementRequest(gpu=decision.request, models=decision.parameters.gpu_model,
                            node_selector=decision.parameters.node_selector, isolation=decision.required_isolation,
                            topology=decision.topology)


class GroupBinding:
    """Binds claim groups all or none (see the module docstring)."""

    def __init__(self, *, picture: Picture, queue: WorkQueue, commit: Commit, settings: ControllerSettings,
                 status: ClaimStatus, binding: ClaimBinding) -> None:
        """`status`: the claims' status writes (why a member waits); `binding`: finishes a member's
        bind after the group's commit point."""
        self.picture = picture
        self.queue = queue
        self.commit = commit
        self.settings = settings
        self.status = status
        self.binding = binding
        self._kept: dict[str, tuple[frozenset[str], float]] = {}
        """Waiter ("claim group ns/name" or "claim ns/name") -> the nodes kept for it and until
        when (monotonic). One waiter at a time: the first to have waited past the bound."""
        self._rechecks: dict[str, float] = {}
        """Waiter -> when its bounded wait is looked at again (monotonic)."""
        self.attempts = GroupCommit(commit)
        """The attempts' writes: reserve with the record, decide on the anchor, free by token."""
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_lock = threading.Lock()
        self._abandoned: set[str] = set()
        """Tokens of our own attempts we could not roll back (the server failed): ours to abort
        at once, without waiting out the grace."""

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

    def single_waits(self, claim: ElasticGPUClaim, decision: binder.Provision) -> str:
        """A single claim said NoCapacity: the same bounded wait as a group of one (the issue's
        "big claims can wait indefinitely"). Returns why no room is kept for it once its wait
        is over ("" when room is kept, or its wait is not over yet)."""
        key = provisioned_names.provisioned_name(claim)
        waiter = kept_room.single_waiter(claim.metadata.namespace or "", claim.metadata.name or "")
        return self._keep_room(waiter, [_Member(claim, decision, key)], binder.REASON_NO_CAPACITY,
                               subject="this claim")

    def _keep_room(self, waiter: str, members: list[_Member], reason: str, *, subject: str) -> str:
        """Keep room for `waiter` once it has waited past the bound, if it could bind were the
        room free (`decisions/kept_room.py`); else the note for its claims' message, why not."""
        settings = self.settings
        after = settings.binding.group_reserve_after_s
        if after <= 0 or not members:
            return ""
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
                self.queue.add(("claim", namespace, members[0].name), delay_s=after - waited + 1.0,
                               recheck=True)
            return ""
        if any(other != waiter and until >= now for other, (_, until) in self._kept.items()):
            return ""  # one starved waiter at a time: keeping room for all would keep every node
        try:
            quotas = self._quotas(namespace, members[0].name)
        except errors.ApiError as err:
            # Room is never kept on a guess: the waiter's next sync reads them again.
            logger.debug("quotas of %s unreadable, room for %s left as it was: %s", namespace, waiter, err)
            return ""
        picture = self.picture
        with picture.lock:
            verdict = kept_room.decide(
                picture.ledger.inventory,
                [kept_room.Member(m.name, m.claim.metadata.uid or "", m.decision.class_name, request_of(m.decision))
                 for m in members],
                quotas, policy=members[0].decision.parameters.policy, subject=subject)
        if isinstance(verdict, kept_room.NoRoom):
            if self._kept.pop(waiter, None) is not None:
                logger.info("no longer keeping nodes for %s: %s", waiter, verdict.message)
            return f"no room is kept for it: {verdict.message}"
        # Refreshed by every sync of the waiter; lapses when it stops waiting (deleted, say).
        until = now + 2 * settings.resync.interval_s + after
        if self._kept.get(waiter, (None, 0.0))[0] != verdict.nodes:
            logger.info("keeping nodes %s for %s, waiting since %s", sorted(verdict.nodes), waiter,
                        min(known).isoformat())
        self._kept[waiter] = (verdict.nodes, until)
        return ""

    def _quotas(self, namespace: str, claim: str) -> list[ElasticGPUQuota]:
        """The namespace's quotas, read live (no request where it has none, or quotas are not
        enforced); raises `errors.ApiError` when they cannot be read."""
        guard = self.commit.quota
        if guard is None:
            return []
        return guard.read(namespace, claim)

    # -- the group's sync ------------------------------------------------------------------------

    def _members(self, namespace: str, group: str) -> list[ElasticGPUClaim]:
        picture = self.picture
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
        """The `Provision` step of a group member: reserve the group all or none in one attempt,
        then finish this member's bind (the others' syncs finish theirs)."""
        group = groups.group_of(claim)
        if isinstance(group, groups.InvalidGroup):
            self.status.pending(claim, groups.REASON_INVALID_GROUP, group.message)
            return
        assert group is not None
        namespace = claim.metadata.namespace or ""
        claims = self._members(namespace, group.name)
        missing = groups.incomplete(group, claims)
        if missing:
            self.status.pending(claim, groups.REASON_GROUP_INCOMPLETE, missing)
            return
        # One sync of a group at a time in this process (its workers would race each other's
        # attempts); another controller's are kept apart by the attempt records.
        with self._locks_lock:
            lock = self._locks.setdefault((namespace, group.name), threading.Lock())
        if not lock.acquire(timeout=self.settings.binding.requeue_delay_s):
            self.queue.add(("claim", namespace, claim.metadata.name or ""),
                           delay_s=self.settings.binding.requeue_delay_s)
            return
        try:
            self._provision(claim, decision, group.name, claims)
        finally:
            lock.release()

    def _provision(self, claim: ElasticGPUClaim, decision: binder.Provision, group: str,
                   claims: list[ElasticGPUClaim]) -> None:
        namespace = claim.metadata.namespace or ""
        own_key = provisioned_names.provisioned_name(claim)
        grace = self.settings.binding.group_partial_grace_s
        for attempt in range(self.settings.binding.conflict_retries):
            found = self._look(claim, group, claims)
            if found is None:
                return  # said why on the claim
            # Attempts found on the GPUs first: finish off the dead ones, wait for the live ones.
            changed = False
            waits: list[tuple[group_attempts.Attempt, float]] = []
            for seen in found.attempts:
                verdict = group_attempts.judge(seen, grace_s=grace, ours=self._abandoned,
                                               provisioned=found.provisioned)
                if verdict.action == "abort":
                    outcome = self.attempts.decide(seen.anchor_gpu, seen.anchor_key, seen.token, "Aborted")
                    if outcome in ("Aborted", "Gone"):
                        logger.info("rolling back claim group %s/%s attempt %s (%s, anchor written %.0fs ago)",
                                    namespace, group, seen.token, seen.state, seen.age_s)
                        self.attempts.release(seen.entries)
                        self._abandoned.discard(seen.token)
                    changed = True
                elif verdict.action == "release":
                    logger.info("freeing %d reservation(s) of claim group %s/%s left by attempt %s (%s)",
                                len(verdict.release), namespace, group, seen.token or "(no record)", seen.state)
                    self.attempts.release(verdict.release)
                    changed = True
                elif verdict.action == "wait":
                    waits.append((seen, verdict.wait_s))
            if changed:
                continue
            if waits:
                seen, wait_s = min(waits, key=lambda w: w[1])
                self.status.pending(claim, group_attempts.REASON_GROUP_RESERVING,
                                    f"group {group}: another commit attempt ({seen.token or 'no record'},"
                                    f" {seen.state}) holds reservations of its members; it completes, or is"
                                    f" rolled back within {grace:g}s of its start")
                self.queue.add(("claim", namespace, claim.metadata.name or ""), delay_s=wait_s + 0.1, recheck=True)
                return
            if isinstance(found.plan, GroupUnplaceable):
                self._does_not_fit(claim, found.todo, found.plan)
                return
            placements = dict(found.held)
            if found.todo:
                committed = self._commit_attempt(claim, found.todo, found.plan, attempt)
                if committed is None:
                    if self._quota_refused:
                        return
                    continue
                placements.update(committed)
            self.done_waiting(kept_room.group_waiter(namespace, group))
            for member in found.todo:
                if member.key != own_key:
                    self.queue.add(("claim", namespace, member.name))
            placement = placements.get(own_key)
            if placement is not None:
                self.binding.after_commit(claim, decision, own_key, placement)
            return
        raise errors.BindingError(f"claim group {namespace}/{group}: too many conflicts on the GPUs;"
                                  " retrying later")

    def _look(self, claim: ElasticGPUClaim, group: str, claims: list[ElasticGPUClaim]) -> _Found | None:
        """The group as the picture shows it: its members' attempts, who holds what, the plan
        for the rest. None when a member holds the group back (said on `claim`)."""
        picture = self.picture
        ledger = picture.ledger
        entries: list[group_attempts.Entry] = []
        provisioning: list[_Member] = []
        with picture.lock:
            view = picture.view()
            for member in claims:
                said = binder.decide_claim(member, view)
                key = provisioned_names.provisioned_name(member)
                mine = self.attempts.entries(key, member.metadata.name or "")
                if isinstance(said, binder.Wait | binder.MarkLost):
                    if mine or picture.egpu(key) is not None:
                        continue  # reserved already, mid-way through its own bind: not holding anyone back
                    # The gang binds whole: a member that cannot bind for its own reason holds all back.
                    self.status.pending(claim, groups.REASON_GROUP_INCOMPLETE,
                                        f"group {group}: member {member.metadata.name} cannot bind yet"
                                        f" ({said.reason}: {said.message})")
                    return None
                if not isinstance(said, binder.Provision):
                    continue  # bound, or binding to its ElasticGPU already
                entries += mine
                provisioning.append(_Member(member, said, key))
            anchors: dict[str, tuple[GPUAllocation, str, str, float]] = {}
            for entry in entries:
                record = entry.allocation.group
                if record is not None and record.token not in anchors:
                    anchor = self.attempts.anchor(record.token, record.anchor_gpu, record.anchor)
                    if anchor is not None:
                        anchors[record.token] = anchor
            ages = {(e.gpu, e.key): age_s(e.allocation) for e in entries}
            attempts = group_attempts.attempts_of(entries, anchors, ages)
            provisioned = frozenset(e.key for e in entries if picture.egpu(e.key) is not None)
            kept = {a.token for a in attempts if a.state == "Complete"} | {
                a.token for a in attempts if a.state == "Gone" and all(e.key in provisioned for e in a.entries)}
            node_of = {e.gpu: (gpu.spec.node_name, gpu.spec.uuid) for e in entries
                       if (gpu := ledger.gpu(e.gpu)) is not None}
            held: dict[str, Placement] = {}
            todo: list[_Member] = []
            for waiting in provisioning:
                tokens = sorted({e.token for e in entries if e.key == waiting.key and e.token in kept})
                if tokens:
                    # Two controllers' attempts may both have completed: one placement each,
                    # the lowest token's; the ElasticGPU made from it frees the other (as a
                    # single bind does when two controllers reserved one claim).
                    held[waiting.key] = GroupCommit.placement_of(
                        [e for e in entries if e.key == waiting.key and e.token == tokens[0]], node_of)
                else:
                    todo.append(waiting)
            plan = place_group(ledger.inventory, [GroupMember(m.name, request_of(m.decision)) for m in todo],
                               policy=provisioning[0].decision.parameters.policy if provisioning else "binpack")
        return _Found(attempts=attempts, provisioned=provisioned, held=held, todo=todo, plan=plan)

    _quota_refused = False

    def _commit_attempt(self, claim: ElasticGPUClaim, todo: list[_Member], plan: GroupPlacement,
                        attempt: int) -> dict[str, Placement] | None:
        """Reserve every planned member in one attempt: anchor first, the others, then Complete
        on the anchor. The placements by reservation key; None when the attempt was rolled back
        (`_quota_refused` tells a quota's no, said on the claim, from a lost race)."""
        ledger = self.picture.ledger
        token = uuid.uuid4().hex
        first = plan.placements[todo[0].name]
        record = GPUAllocationGroup.model_validate({
            "token": token, "anchor": todo[0].name, "anchorGPU": ledger.name_of_uuid(first.cards[0].uuid),
            "state": "Committing"})
        anchor_key = todo[0].key
        written: list[group_attempts.Entry] = []
        self._quota_refused = False
        try:
            for member in todo:
                written += self.attempts.reserve(member.key, plan.placements[member.name],
                                                 claim_ref_of(member.claim), record)
            outcome = self.attempts.decide(record.anchor_gpu, anchor_key, token, "Complete")
        except QuotaExceeded as err:
            self._roll_back(record, anchor_key, written)
            self._quota_refused = True
            # Room kept for the group is freed: it could not bind in it (docs/gangs.md).
            self.done_waiting(kept_room.group_waiter(claim.metadata.namespace or "", groups.group_name(claim)))
            self.status.pending(claim, err.reason, f"group member {member.name}: {err.message}")
            self.queue.add(("claim", claim.metadata.namespace or "", claim.metadata.name or ""),
                           delay_s=self.settings.quota.recheck_s, recheck=True)
            return None
        except (errors.Conflict, errors.Rejected) as err:
            logger.debug("claim group attempt %s lost a race, rolling back %d reservation(s): %s",
                         token, len(written), err)
            self._roll_back(record, anchor_key, written)
            self.commit.backoff(attempt)
            return None
        except BaseException:
            self._roll_back(record, anchor_key, written, then_raise=True)
            raise
        if outcome != "Complete":
            # Aborted by another controller that took it for dead (past the grace): free ours.
            logger.info("claim group attempt %s was %s by another controller; re-planning", token, outcome.lower())
            self.attempts.release(written)
            return None
        logger.info("reserved claim group %s/%s: %d member(s), attempt %s", claim.metadata.namespace,
                    groups.group_name(claim), len(todo), token)
        return {m.key: plan.placements[m.name] for m in todo}

    def _roll_back(self, record: GPUAllocationGroup, anchor_key: str, written: list[group_attempts.Entry], *,
                   then_raise: bool = False) -> None:
        """Abort our own attempt (the anchor says so first, so nobody completes it) and free what
        it wrote. When that fails too (the server unreachable), the token is remembered as
        ours to abort at once on the next sync, and the caller's error is raised."""
        if not written:
            return
        try:
            self.attempts.decide(record.anchor_gpu, anchor_key, record.token, "Aborted")
            self.attempts.release(written)
        except errors.ControllerError:
            self._abandoned.add(record.token)
            if not then_raise:
                raise

    def _does_not_fit(self, claim: ElasticGPUClaim, todo: list[_Member], plan: GroupUnplaceable) -> None:
        """Say GroupDoesNotFit on every waiting member, and keep room for the group once it has
        waited long enough (or say why none is kept). It holds nothing: only Complete attempts
        are kept, and those bound."""
        namespace = claim.metadata.namespace or ""
        note = self._keep_room(kept_room.group_waiter(namespace, groups.group_name(claim)), todo,
                               groups.REASON_GROUP_DOES_NOT_FIT, subject="the group")
        message = f"{plan.message}; {note}" if note else plan.message
        for member in todo:
            try:
                self.status.pending(member.claim, groups.REASON_GROUP_DOES_NOT_FIT, message)
            except errors.Conflict:
                self.queue.add(("claim", namespace, member.name))
