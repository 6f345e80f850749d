"""Reserving: step 1 of a claim's dynamic bind. Plan a placement on the picture's ledger (a MIG
instance for a `partitioning: MIG` class) and commit it (`Commit`, the commit point), or say on
the claim why it waits: no capacity (after trying preemption, with the nodes kept for a starved
claim group avoided), never fits, or a quota's no. A lost race re-plans, up to
`conflict_retries` times.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Protocol

from elasticgpu.allocator import Placement, PlacementRequest, Unplaceable
from elasticgpu.api import ElasticGPUClaim
from elasticgpu.controller import errors
from elasticgpu.controller.decisions import binder, capacity, kept_room
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow import mig_binding
from elasticgpu.controller.flow.binding.claim_status import ClaimStatus
from elasticgpu.controller.flow.binding.commit import Commit
from elasticgpu.controller.flow.binding.elasticgpu_sync import ElasticGPUSync
from elasticgpu.controller.flow.binding.provisioner import claim_ref_of
from elasticgpu.controller.flow.machinery.workqueue import WorkQueue
from elasticgpu.controller.flow.quota_guard import QuotaExceeded
from elasticgpu.controller.picture.picture import Picture
from elasticgpu.controller.settings import ControllerSettings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreemptionOutcome:
    """What a preemption did for a claim that fits nowhere: `handled` (the claim's status says Preempting;
    nothing more to write), or not, with a `note` for the claim's NoCapacity message ("" for none)."""

    handled: bool
    note: str = ""
    retry: bool = False
    """The victims' room was freed just now (no agent reports them running): place the claim again at once."""


class Preempting(Protocol):
    """Preemption, as reserving asks for it (`preemption/preempting.py` does it): binding knows no more of it."""

    def try_preempt(self, claim: ElasticGPUClaim, decision: binder.Provision,
                    request: PlacementRequest) -> PreemptionOutcome: ...


class RoomKeeping(Protocol):
    """Room kept for starved waiters, as reserving asks for it (the claim groups' room keeps it,
    `groups/group_binding.py`): the nodes kept from this claim, a single claim's bounded wait, and its end."""

    def kept_nodes(self, *, but: str = "") -> dict[str, str]: ...

    def single_waits(self, claim: ElasticGPUClaim, decision: binder.Provision) -> str: ...

    def done_waiting(self, waiter: str) -> None: ...


def _waiter(claim: ElasticGPUClaim) -> str:
    return kept_room.single_waiter(claim.metadata.namespace or "", claim.metadata.name or "")


class Reserver:
    """Plans and commits a claim's reservation (see the module docstring)."""

    def __init__(self, *, kube: KubeApi, picture: Picture, queue: WorkQueue, status: ClaimStatus, commit: Commit,
                 elastic_gpus: ElasticGPUSync, groups: RoomKeeping, preempter: Preempting,
                 settings: ControllerSettings) -> None:
        """`status`: the claim's status writes (why it waits); `groups`: the nodes kept for starved
        waiters; `preempter`: tried where the claim fits nowhere."""
        self.kube = kube
        self.picture = picture
        self.queue = queue
        self.status = status
        self.commit = commit
        self.elastic_gpus = elastic_gpus
        self.groups = groups
        self.preempter = preempter
        self.settings = settings

    def reserve(self, claim: ElasticGPUClaim, key: str, decision: binder.Provision) -> Placement | None:
        """Step 1: plan and commit the reservation; None when the claim must wait (status written)."""
        klass = self.picture.view().classes.get(decision.class_name)
        if klass is not None and klass.is_mig:
            return self._reserve_mig(claim, key, decision)
        request = PlacementRequest(
            gpu=decision.request,
            models=decision.parameters.gpu_model,
            node_selector=decision.parameters.node_selector,
            isolation=decision.required_isolation,
            topology=decision.topology,
        )
        ledger = self.picture.ledger
        kept = self.groups.kept_nodes(but=_waiter(claim))
        if kept and not request.nodes:
            # A claim group has waited too long: its nodes are kept from smaller claims (docs/gangs.md).
            with self.picture.lock:
                others = frozenset(n for n in ledger.inventory.node_names() if n not in kept)
            if not others:  # (an empty `nodes` would mean any node)
                self.status.pending(claim, binder.REASON_NO_CAPACITY, f"every node is kept for"
                                    f" {', '.join(sorted(set(kept.values())))}, which waited too long; this claim"
                                    " is placed once that binds")
                return None
            request = dataclasses.replace(request, nodes=others)
        for attempt in range(self.settings.binding.conflict_retries):
            with self.picture.lock:
                held = ledger.held(key)
                if held is not None and len(held.cards) == max(1, decision.request.cards):
                    return held  # committed before a crash, a lost answer, or by the other controller
                result = None if held is not None else ledger.place(request, policy=decision.parameters.policy)
            if held is not None:
                # Not the claim's shape: a partial multi-card write, or two controllers reserved
                # the same key on different cards. If the ElasticGPU exists, its spec decided
                # which cards are the claim's: keep those and finish that bind (the claim's next
                # sync finds it prebound); otherwise start over.
                if self._adopt_existing(claim, key):
                    return None
                self.commit.free_reservation(key)
                continue
            if isinstance(result, Unplaceable):
                with self.picture.lock:
                    never = capacity.never_fits(ledger.inventory, decision.request, models=request.models,
                                                node_selector=request.node_selector)
                if never:
                    # OBSERVATION: not even an empty card could hold it: waiting will not help.
                    self.status.pending(claim, capacity.REASON_NEVER_FITS, never)
                    return None
                outcome = self.preempter.try_preempt(claim, decision, request)
                if outcome.retry:
                    continue  # the victims' room is free: place again
                if outcome.handled:
                    return None  # it waits for its victims to go (status written)
                # The words `elasticgpu plan` prints too, and what only the controller knows.
                message = capacity.no_capacity_message(decision.request, result)
                if kept:
                    message += f" (nodes {', '.join(sorted(kept))} are kept for" \
                               f" {', '.join(sorted(set(kept.values())))}, which waited too long)"
                if outcome.note:
                    message += f"; {outcome.note}"
                # Not starved for ever either, if it could bind were room kept for it (docs/gangs.md).
                no_room = self.groups.single_waits(claim, decision)
                if no_room:
                    message += f"; {no_room}"
                self.status.pending(claim, binder.REASON_NO_CAPACITY, message)
                return None
            assert result is not None
            try:
                self.commit.commit(key, result, claim_ref_of(claim))
                self.groups.done_waiting(_waiter(claim))
            except QuotaExceeded as err:
                # Nothing reserved. Quotas are not watched: check again after a while (docs/quota.md).
                self._quota_refused(claim, err)
                return None
            except (errors.Conflict, errors.Rejected) as err:
                logger.debug("reservation lost a race, re-planning: %s", err)
                self.commit.backoff(attempt)
                continue
            return result
        raise errors.BindingError(f"claim {claim.metadata.namespace}/{claim.metadata.name}: too many conflicts on"
                                  " the GPUs; retrying later")

    def _reserve_mig(self, claim: ElasticGPUClaim, key: str, decision: binder.Provision) -> Placement | None:
        """Step 1 for a `partitioning: MIG` class: a MIG instance's card and start, committed with
        the reservation (`flow/mig_binding.py`); None when the claim must wait (status written)."""
        ledger = self.picture.ledger
        for attempt in range(self.settings.binding.conflict_retries):
            with self.picture.lock:
                held = ledger.held(key)
                if held is not None:
                    return held  # committed before a crash, or by the other controller
                planned = mig_binding.plan(ledger, decision.request, decision.parameters)
            if isinstance(planned, mig_binding.MigWait):
                reason = capacity.REASON_NEVER_FITS if planned.never else binder.REASON_NO_CAPACITY
                self.status.pending(claim, reason, planned.message)
                return None
            try:
                self.commit.commit(key, planned.placement, claim_ref_of(claim), planned.partitions)
            except QuotaExceeded as err:
                self._quota_refused(claim, err)
                return None
            except (errors.Conflict, errors.Rejected) as err:
                logger.debug("MIG reservation lost a race, re-planning: %s", err)
                self.commit.backoff(attempt)
                continue
            return planned.placement
        raise errors.BindingError(f"claim {claim.metadata.namespace}/{claim.metadata.name}: too many conflicts on"
                                  " the GPUs; retrying later")

    def _quota_refused(self, claim: ElasticGPUClaim, err: QuotaExceeded) -> None:
        """A quota had no room (nothing reserved): say so, and look again after a while. Room kept
        for the claim is freed: it could not bind in it (docs/gangs.md)."""
        self.groups.done_waiting(_waiter(claim))
        self.status.pending(claim, err.reason, err.message)
        self.queue.add(("claim", claim.metadata.namespace or "", claim.metadata.name or ""),
                       delay_s=self.settings.quota.recheck_s, recheck=True)

    def _adopt_existing(self, claim: ElasticGPUClaim, key: str) -> bool:
        """When ElasticGPU `key` exists (live read): free what `key` holds outside its spec's
        cards, requeue the claim, and answer True. False when it does not exist."""
        try:
            existing = self.kube.get_elastic_gpu(key)
        except errors.NotFound:
            return False
        self.commit.free_extra_cards(self.elastic_gpus.put(existing))
        self.queue.add(("claim", claim.metadata.namespace or "", claim.metadata.name or ""))
        return True
