"""The resize flow: carry out `allocator.resize` for a Bound claim (the claim sync calls it when
the binder finds the claim in sync).

Writes, each with its object's resourceVersion: the GPU's status (the reservation grows, gets a
limit, or shrinks: the commit point, as a bind's), then the ElasticGPU's `status.capacity`, then
the claim's `status.capacity`, `allocatedResources` and conditions. After every GPU write the
decision is taken again from what the picture holds, so a crash or a 409 between two writes is
repaired by the next step (see the module docstring of `allocator.resize`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from elasticgpu.allocator import Placement, resize
from elasticgpu.api import GPU, ElasticGPU, ElasticGPUClaim, GPUAllocation, timestamps
from elasticgpu.controller import errors
from elasticgpu.controller.decisions import binder, bound_class
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.binding.commit import Commit
from elasticgpu.controller.flow.binding.elasticgpu_sync import ElasticGPUSync
from elasticgpu.controller.flow.binding.provisioner import capacity_of, claim_ref_of
from elasticgpu.controller.flow.machinery.events import NORMAL, WARNING, EventRecorder
from elasticgpu.controller.flow.quota_guard import QuotaExceeded
from elasticgpu.controller.picture.picture import Body, Picture
from elasticgpu.controller.settings import ControllerSettings

logger = logging.getLogger(__name__)

_RESIZE_CONDITIONS = (resize.CONDITION_RESIZING, resize.CONDITION_PENDING)


def _condition(type_: str, status: str, reason: str, message: str, previous: list[Any]) -> Body:
    old = next((c for c in previous if c.type == type_), None)
    same = old is not None and old.reason == reason and old.status == status
    when = old.last_transition_time if same and old is not None else timestamps.now_rfc3339()
    return {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": when}


class Resizer:
    """Resizes Bound claims in place (see the module docstring)."""

    def __init__(self, *, kube: KubeApi, picture: Picture, events: EventRecorder, commit: Commit,
                 elastic_gpus: ElasticGPUSync, settings: ControllerSettings) -> None:
        self.kube = kube
        self.picture = picture
        self.events = events
        self.commit = commit
        self.elastic_gpus = elastic_gpus
        self.settings = settings

    def sync(self, namespace: str, name: str, egpu_name: str) -> bool:
        """Take the claim one or more resize steps, until it waits (for room, the node, the
        user) or shows its size. True when no resize is left to do (not resizable, or it shows
        its size); False while one waits (for room, a quota, the node: the resync looks again)."""
        done = ""  # what the last GPU write did, for the Event once the statuses show it
        grows = False
        for attempt in range(self.settings.binding.conflict_retries):
            with self.picture.lock:
                claim = self.picture.claim(namespace, name)
                egpu = self.picture.egpu(egpu_name)
                if claim is None or egpu is None or not binder.is_bound(claim):
                    return True
                want = bound_class.resizable(claim, egpu, self.picture.view().classes)
                ledger = self.picture.ledger
                held = [(g, a) for g in ledger.gpus_holding(egpu_name)
                        if (a := ledger.allocation(g, egpu_name)) is not None]
                gpus = [m for g, _a in held if (m := ledger.gpu(g)) is not None]
                decision = (resize.decide_resize(claim, gpus=gpus, allocations=[a for _g, a in held])
                            if want and held and len(gpus) == len(held) else None)
            if bool(claim.status.resizable) != want:
                # Recorded for the claim CRD's rule on the requests (which cannot read the class).
                self._write_claim(claim, {"resizable": want})
                continue
            if decision is None:
                return True  # not resizable, or its reservation is being repaired by the ElasticGPU's sync
            if isinstance(decision, resize.Settle):
                self._show(claim, egpu, None, done=done)
                return True
            if isinstance(decision, resize.Refuse):
                self._show(claim, egpu, (resize.CONDITION_RESIZING, "False", decision.reason, decision.message,
                                         WARNING))
                return False
            if isinstance(decision, resize.WaitForNode):
                self._show(claim, egpu, (resize.CONDITION_PENDING, "True", resize.REASON_WAITING_FOR_NODE,
                                         decision.message, NORMAL))
                return False
            gpu_name, allocation = held[0]
            if isinstance(decision, resize.SetLimit):
                changed = allocation.model_copy(update={"limit": resize.as_limit(decision.limit)})
                logger.info("resize: %s", decision.message, extra={"claim": f"{namespace}/{name}"})
            else:
                changed = allocation.model_copy(update={"cores": decision.size.cores,
                                                        "memory": decision.size.memory, "limit": None})
                done = decision.message
                grows = changed.cores > allocation.cores or changed.memory > allocation.memory
                if grows and not self._charge(claim, egpu, changed):
                    return False
            if not self._write_gpu(gpu_name, gpus[0], changed):
                self.commit.backoff(attempt)
            elif not isinstance(decision, resize.SetLimit) and not grows:
                self._charge(claim, egpu, changed)  # a finished shrink gives back its part of the quotas
        raise errors.BindingError(f"claim {namespace}/{name}: too many conflicts resizing on its GPU; retrying later")

    def _charge(self, claim: ElasticGPUClaim, egpu: ElasticGPU, size: GPUAllocation) -> bool:
        """Charge the namespace's ElasticGPUQuotas for the claim's size on its card after this
        resize (the claim's charge is replaced, as at bind): before an expand's GPU write, so that
        two controllers never take a quota over its limit; after a shrink's, to give back the
        part freed. False (and the claim says so) when a quota has no room for an expand."""
        guard = self.commit.quota
        placement = self.picture.ledger.held(egpu.metadata.name or "")
        if guard is None or placement is None:
            return True
        cards = tuple(dataclasses.replace(card, cores=size.cores, memory_mib=size.memory)
                      for card in placement.cards)
        try:
            guard.charge(claim_ref_of(claim), Placement(node=placement.node, cards=cards))
        except QuotaExceeded as refused:
            self._show(claim, egpu, (resize.CONDITION_RESIZING, "False", refused.reason, refused.message, WARNING))
            return False
        return True

    # -- writes --------------------------------------------------------------------------------

    def _write_gpu(self, gpu_name: str, before: GPU, allocation: GPUAllocation) -> bool:
        """The GPU status write with the picture's resourceVersion; False on a conflict (the
        card changed: re-read, decide again) or a refusal by the GPU CRD's rules."""
        try:
            with self.picture.lock:
                body = self.picture.ledger.with_allocation(gpu_name, allocation)
        except errors.CardOverfilled as err:
            logger.debug("resize decided on an older copy of GPU %s, deciding again: %s", gpu_name, err)
            return False
        try:
            answer = self.kube.replace_gpu_status(body)
        except (errors.Conflict, errors.Rejected) as err:
            logger.debug("resize lost a race on GPU %s, deciding again: %s", gpu_name, err)
            self.commit.refresh_gpu(gpu_name)
            return False
        # A shrink frees room on the card: the claims waiting for it are woken.
        old = next((a for a in before.status.allocations if a.elastic_gpu == allocation.elastic_gpu), None)
        freed = old is not None and (allocation.cores < old.cores or allocation.memory < old.memory)
        self.commit.queue.add_all(self.picture.gpu_written(answer, freed=freed))
        return True

    def _write_claim(self, claim: ElasticGPUClaim, status: Body) -> ElasticGPUClaim:
        namespace, name = claim.metadata.namespace or "", claim.metadata.name or ""
        patch = {"metadata": {"resourceVersion": claim.metadata.resource_version}, "status": status}
        try:
            answer = self.kube.patch_claim_status(namespace, name, patch)
        except errors.Conflict:
            # The user changed the requests meanwhile (or the agent its usage): re-read, retry.
            self.picture.put_claim(self.kube.get_claim(namespace, name))
            raise
        return self.picture.put_claim(answer)

    def _show(self, claim: ElasticGPUClaim, egpu: ElasticGPU, said: tuple[str, str, str, str, str] | None, *,
              done: str = "") -> None:
        """Make the statuses show what the card reserves, whatever the decision: the ElasticGPU's
        `status.capacity`, the claim's `status.capacity` and `allocatedResources` (a refused
        expand after a finished shrink still shows the shrink), and the claim's one resize
        condition `said` (type, status, reason, message, Event type), or none once the request is
        reserved. Writes only what differs; an Event when the condition or the size changed."""
        placement = self.picture.ledger.held(egpu.metadata.name or "")
        if placement is None:
            return
        capacity: Body = dict(capacity_of(placement))
        if dict(egpu.status.capacity) != capacity:
            phase = egpu.status.phase or "Bound"
            # No reason written means the phase is the reason (set_status writes none then either).
            self.elastic_gpus.set_phase(egpu, phase, egpu.status.reason or phase, egpu.status.message or "bound")
        current = claim.status.conditions
        kept = [c.to_dict() for c in current if c.type not in _RESIZE_CONDITIONS]
        wanted = [] if said is None else [_condition(said[0], said[1], said[2], said[3], current)]

        def shape(conditions: list[Body]) -> list[tuple[Any, ...]]:
            return sorted((c["type"], c["status"], c["reason"], c["message"]) for c in conditions)

        now_said = shape([c.to_dict() for c in current if c.type in _RESIZE_CONDITIONS])
        condition_changed = now_said != shape(wanted)
        size_changed = dict(claim.status.capacity) != capacity
        if not (condition_changed or size_changed or dict(claim.status.allocated_resources) != capacity):
            return  # said already: no write, no Event
        written = self._write_claim(claim, {"capacity": capacity, "allocatedResources": capacity,
                                            "conditions": [*kept, *wanted]})
        if said is not None and condition_changed:
            self.events.record(self._body(written), type_=said[4], reason=said[2], message=said[3])
        elif said is None and (size_changed or now_said):
            message = done or (f"claim {claim.metadata.namespace}/{claim.metadata.name}: resized to"
                               f" {placement.describe()}")
            if note := binder.resize_note(claim.status.isolation):
                message += f"; {note}"
            self.events.record(self._body(written), type_=NORMAL, reason=resize.REASON_RESIZED, message=message)

    def _body(self, claim: ElasticGPUClaim) -> Body:
        namespace, name = claim.metadata.namespace or "", claim.metadata.name or ""
        return self.picture.claim_body(namespace, name) or claim.to_dict()
