"""The claim's status writes: Pending, Lost, Bound and "in use" (deletion waits), each with its
Event (none for the routine bind of an inline claim). Every write carries the claim's
resourceVersion as a precondition; a conflict re-reads the claim into the picture and raises, so
the retry decides from what the server holds.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from elasticgpu.allocator import Placement
from elasticgpu.api import Condition, ElasticGPU, ElasticGPUClaim, timestamps
from elasticgpu.controller import errors
from elasticgpu.controller.decisions import binder, bound_class, node_requests, preemption, release
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.binding import policing_copy
from elasticgpu.controller.flow.binding.provisioner import capacity_of
from elasticgpu.controller.flow.machinery.events import NORMAL, WARNING, EventRecorder
from elasticgpu.controller.picture import pod_index
from elasticgpu.controller.picture.picture import Body, Picture

logger = logging.getLogger(__name__)


def condition(type_: str, reason: str, message: str, previous: list[Condition]) -> dict[str, Any]:
    """One condition; keeps the old transition time when the type and reason did not change."""
    old = next((c for c in previous if c.type == type_), None)
    when = old.last_transition_time if old is not None and old.reason == reason else timestamps.now_rfc3339()
    return {"type": type_, "status": "True", "reason": reason, "message": message, "lastTransitionTime": when}


class ClaimStatus:
    """Writes a claim's status and records its Event (see the module docstring)."""

    def __init__(self, *, kube: KubeApi, picture: Picture, events: EventRecorder) -> None:
        self.kube = kube
        self.picture = picture
        self.events = events

    def body(self, claim: ElasticGPUClaim) -> Body:
        """The claim as the picture holds it (raw), for Events and the owner pod; `claim` itself when gone."""
        return self.picture.claim_body(claim.metadata.namespace or "", claim.metadata.name or "") or claim.to_dict()

    def write(self, claim: ElasticGPUClaim, status: Body) -> None:
        """Patch `status` onto the claim, guarded by its resourceVersion; the answer goes into the picture."""
        namespace, name = claim.metadata.namespace or "", claim.metadata.name or ""
        # The resourceVersion makes this a precondition: a controller with a stale picture must
        # never write Pending over a Bound another one just wrote.
        patch = {"metadata": {"resourceVersion": claim.metadata.resource_version}, "status": status}
        try:
            answer = self.kube.patch_claim_status(namespace, name, patch)
        except errors.NotFound:
            return  # deleted meanwhile: nothing to report on
        except errors.Conflict:
            self.refresh(namespace, name)
            raise
        self.picture.put_claim(answer)

    def refresh(self, namespace: str, name: str) -> None:
        """Re-read the claim into the picture (after a conflict); nothing when it is gone."""
        try:
            fresh = self.kube.get_claim(namespace, name)
        except errors.NotFound:
            return
        self.picture.put_claim(fresh)

    def pending(self, claim: ElasticGPUClaim, reason: str, message: str) -> None:
        """Say the claim is Pending for `reason` (no write, no Event when said already)."""
        current = claim.status.conditions
        if claim.status.phase == "Pending" and claim.status.reason == reason and any(
            c.type == "Pending" and c.reason == reason and c.message == message for c in current
        ):
            return  # said already: no write, no Event
        pending = condition("Pending", reason, message, current)
        # The node asked for it stays said while it waits (flow/node_autoscaling.py writes it).
        asked = [c.to_dict() for c in current if c.type == node_requests.CONDITION_NODE_REQUESTED]
        self.write(claim, {"phase": "Pending", "reason": reason, "message": message,
                           "conditions": [*asked, pending]})
        kind = NORMAL if reason == binder.REASON_WAIT_FOR_CONSUMER else WARNING
        self.events.record(self.body(claim), type_=kind, reason=reason, message=message)

    def lost(self, claim: ElasticGPUClaim, reason: str, message: str) -> None:
        """Say the claim is Lost for `reason` (no write, no Event when said already)."""
        said = any(c.type == "Lost" and c.reason == reason for c in claim.status.conditions)
        if claim.status.phase == "Lost" and said and claim.status.reason == reason:
            return
        lost = condition("Lost", reason, message, claim.status.conditions)
        # A preempted claim has a Preempted condition too (issue 27): it says by whom, the Lost one says what.
        kept = preemption.lost_conditions(claim, now=timestamps.now_rfc3339())
        self.write(claim, {"phase": "Lost", "reason": reason, "message": message, "conditions": [*kept, lost]})
        self.events.record(self.body(claim), type_=WARNING, reason=reason, message=message)

    def in_use(self, claim: ElasticGPUClaim, pods: Sequence[str]) -> None:
        """Say a deleted claim's deletion waits for `pods` (once: no write, no Event when said already)."""
        message = f"in use by pod(s) {', '.join(pods)}; deletion waits until they terminate"
        if any(c.reason == release.REASON_CLAIM_IN_USE for c in claim.status.conditions):
            return
        in_use = condition("Terminating", release.REASON_CLAIM_IN_USE, message, claim.status.conditions)
        self.write(claim, {"conditions": [*[c.to_dict() for c in claim.status.conditions
                                            if c.type != "Terminating"], in_use]})
        self.events.record(self.body(claim), type_=NORMAL, reason=release.REASON_CLAIM_IN_USE, message=message)

    def bound(self, claim: ElasticGPUClaim, egpu: ElasticGPU, *, placement: Placement | None = None) -> None:
        """Say the claim is Bound to `egpu`: capacity, node, cards, isolation, partition, policing (and
        its owner pod as user, for an inline claim). With `placement` (a dynamic bind, whose
        ElasticGPU has no status yet) capacity, node and cards come from it and the Event says
        "provisioned" too."""
        egpu_name = egpu.metadata.name or ""
        if placement is not None:
            capacity: dict[str, Any] = capacity_of(placement)
            node: str | None = placement.node
            gpus = [share.uuid for share in placement.cards]
        else:
            capacity = egpu.status.capacity or dict(egpu.spec.capacity)
            node = egpu.status.node_name or egpu.spec.node_name
            gpus = list(egpu.status.gpus)
        message = f"bound to ElasticGPU {egpu_name} on {node or '?'}" + (f" ({', '.join(gpus)})" if gpus else "")
        classes = self.picture.view().classes
        whole = any(share.whole for share in placement.cards) if placement is not None else (
            egpu.spec.physical_gpu is not None)
        isolation = binder.claim_isolation(bound_class.class_of(claim, egpu, classes), whole=whole)
        if bound_class.resizable(claim, egpu, classes) and (note := binder.resize_note(isolation)):
            message += f"; {note}"  # said where the user looks before resizing (kubectl describe)
        status: Body = {
            "phase": "Bound",
            # No reason: REASON says why a claim is not Bound, so a Bound one shows it empty
            # (null removes a Pending reason); its condition and Event keep `Bound`.
            "reason": None,
            "message": message,
            "capacity": capacity,
            "allocatedResources": capacity,  # what is reserved; differs from capacity only during a resize
            "nodeName": node,
            "gpus": gpus,
            "conditions": [condition("Bound", binder.REASON_BOUND, message, claim.status.conditions)],
        }
        # What protects the claim, for `kubectl get egpuc -o wide` and the node's agent (docs/isolation.md).
        status["isolation"] = isolation
        if bound_class.resizable(claim, egpu, classes):
            status["resizable"] = True  # read by the claim CRD's rule on spec.resources.requests
        partition = self._partition(egpu_name)
        if partition is not None:
            status["partition"] = partition  # the MIG instance it received (more than asked is normal)
        # Whether privileged containers may use the claim (issue 33.4): the agent reads it here, where only the
        # controller writes; null removes a copy left from an earlier bind.
        status["allowPrivileged"] = policing_copy.wanted_privileged(claim, egpu, classes)
        if (policing := policing_copy.wanted(claim, egpu, self.picture.view().classes)) is not None:
            status["policing"] = policing  # the agent reads it there: it may not read classes (issue 25)
        owner = pod_index.owner_pod(self.body(claim))
        if owner is not None and not claim.status.users:
            # An inline claim serves the pod that owns it: said with the bind, not in a write of its own.
            status["users"] = [{"name": owner[0], "uid": owner[1]}]
        self.write(claim, status)
        # "provisioned ElasticGPU X and bound to it on ...", not the name twice (issue 50).
        said = (f"provisioned ElasticGPU {egpu_name} and {message.replace(f'ElasticGPU {egpu_name}', 'it', 1)}"
                if placement else message)
        if owner is not None:
            # An inline claim's bind is routine, one per pod: no Event (issue 37: an Event costs the
            # API server as much as a bind's write, and a Deployment's replicas made one each). The
            # user watches the pod, whose scheduling says the rest; the claim's Bound condition
            # (with its transition time) and this log line are the record, as DRA's claim
            # controller writes none for an allocation. A claim a user made keeps its Event.
            logger.info("ElasticGPUClaim %s/%s: %s: %s", claim.metadata.namespace, claim.metadata.name,
                        binder.REASON_BOUND, said)
            return
        self.events.record(self.body(claim), type_=NORMAL, reason=binder.REASON_BOUND, message=said)

    def _partition(self, egpu_name: str) -> dict[str, Any] | None:
        """The claim's MIG instance as `status.partition` (profile, cores, memory, start), or None."""
        ledger = self.picture.ledger
        with self.picture.lock:
            for gpu_name in ledger.gpus_holding(egpu_name):
                allocation = ledger.allocation(gpu_name, egpu_name)
                if allocation is not None and allocation.partition is not None:
                    return {"profile": allocation.partition.profile, "cores": allocation.cores,
                            "memory": allocation.memory, "start": allocation.partition.start}
        return None
