"""The claim sync: ask `binder.decide_claim` for a claim's next step and carry it out (wait,
lose, bind to an existing ElasticGPU, provision one, release on deletion).

A dynamic bind is: reserve (`Commit`, the commit point), then hand the rest to the pool
(`HandOff`): create the ElasticGPU, bind the claim, mark the ElasticGPU Bound. Every failure
leaves the objects as they were after the last successful write and raises; the worker
retries the key from what it then finds.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from elasticgpu.allocator import Placement, PlacementRequest, Unplaceable
from elasticgpu.api import Condition, ElasticGPU, ElasticGPUClaim, names, timestamps
from elasticgpu.controller import errors
from elasticgpu.controller.decisions import binder, capacity, groups, pod_gate, release
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow import group_binding, mig_binding, policing_copy, preempting
from elasticgpu.controller.flow.commit import Commit
from elasticgpu.controller.flow.elasticgpu_sync import ElasticGPUSync
from elasticgpu.controller.flow.events import NORMAL, WARNING, EventRecorder
from elasticgpu.controller.flow.group_binding import GroupBinding
from elasticgpu.controller.flow.handoff import HandOff
from elasticgpu.controller.flow.provisioner import build_elastic_gpu, capacity_of, claim_ref_of
from elasticgpu.controller.flow.quota_guard import QuotaExceeded
from elasticgpu.controller.flow.recommending import Recommender
from elasticgpu.controller.flow.resizing import Resizer, class_of, resizable
from elasticgpu.controller.flow.workqueue import Key, WorkQueue
from elasticgpu.controller.metrics import ControllerMetrics
from elasticgpu.controller.picture import pod_index
from elasticgpu.controller.picture.picture import Body, Picture
from elasticgpu.controller.settings import ControllerSettings

logger = logging.getLogger(__name__)


def condition(type_: str, reason: str, message: str, previous: list[Condition]) -> dict[str, Any]:
    """One condition; keeps the old transition time when the type and reason did not change."""
    old = next((c for c in previous if c.type == type_), None)
    when = old.last_transition_time if old is not None and old.reason == reason else timestamps.now_rfc3339()
    return {"type": type_, "status": "True", "reason": reason, "message": message, "lastTransitionTime": when}


class ClaimSync:
    """Syncs one claim at a time (see the module docstring)."""

    def __init__(self, *, kube: KubeApi, picture: Picture, queue: WorkQueue, events: EventRecorder,
                 commit: Commit, elastic_gpus: ElasticGPUSync, hand_off: HandOff,
                 settings: ControllerSettings) -> None:
        self.kube = kube
        self.picture = picture
        self.queue = queue
        self.events = events
        self.metrics: ControllerMetrics | None = None
        """Counts binds and provisions when set (`Operability` sets it)."""
        self.commit = commit
        self.elastic_gpus = elastic_gpus
        self.hand_off = hand_off
        self.settings = settings
        self.resizer = Resizer(kube=kube, picture=picture, events=events, commit=commit, elastic_gpus=elastic_gpus,
                               settings=settings)
        """Resizes Bound claims in place (issue 17): called when the binder finds a claim in sync."""
        self.recommender = Recommender(kube=kube, picture=picture, events=events, settings=settings)
        """Recommends sizes from measured use (issue 17), after the resizer, for claims in sync."""
        self.policing = policing_copy.PolicingCopy(kube=kube, picture=picture)
        """Keeps a Bound claim's status.policing true to its class (issue 25), for claims in sync."""
        self.groups = GroupBinding(self)
        """Binds claim groups all or none (issue 27, docs/gangs.md)."""
        commit.kept_nodes = self.groups.kept_nodes
        self.preempting = preempting.Preempter(kube=kube, picture=picture, queue=queue, events=events, commit=commit,
                                               elastic_gpus=elastic_gpus, pending=self._pending,
                                               metrics=lambda: self.metrics)
        """Preempts claims of lower priority for a claim that fits nowhere (issue 27, docs/preemption.md)."""

    def sync(self, namespace: str, name: str) -> None:
        """Decide and carry out the next step of one claim."""
        with self.picture.lock:
            claim = self.picture.claim(namespace, name)
            if claim is None:
                return
            decision = binder.decide_claim(claim, self.picture.view())
        if isinstance(decision, binder.InSync):
            self.resizer.sync(namespace, name, decision.elastic_gpu)
            self.recommender.sync(namespace, name, decision.elastic_gpu)
            self.policing.sync(namespace, name, decision.elastic_gpu)
            self.preempting.settled(namespace, name)
            return
        if isinstance(decision, binder.Ignore):
            return
        if isinstance(decision, binder.Wait):
            if decision.reason == binder.REASON_WAIT_FOR_CONSUMER:
                decision = self._consumer_placement(claim) or decision
            self._pending(claim, decision.reason, decision.message)
        elif isinstance(decision, binder.MarkLost):
            self._lost(claim, decision.reason, decision.message)
        elif isinstance(decision, binder.CompleteBind):
            self._complete_bind(claim, decision.elastic_gpu)
        elif isinstance(decision, binder.BindToExisting):
            self._bind_existing(claim, decision.elastic_gpu)
        elif isinstance(decision, binder.Provision):
            if groups.group_name(claim):
                self.groups.provision(claim, decision)  # a gang: all of its members or none
            else:
                self._provision(claim, decision)
        elif isinstance(decision, binder.Deleting):
            self._release(claim)

    def _consumer_placement(self, claim: ElasticGPUClaim) -> binder.Wait | None:
        """A WaitForFirstConsumer claim whose pod came but could not be placed (the pod sync wrote
        `ClaimsReady=False`, `FailedClaimPlacement`): the wait that says so, or None (no pod yet,
        or its placement has not failed). "Waiting for a pod" would send the user looking for
        a pod that exists."""
        namespace = claim.metadata.namespace or ""
        with self.picture.lock:
            for user in sorted(self.picture.pods_using(namespace, claim.metadata.name or "")):
                pod = self.picture.pods.pod(namespace, user)
                said = pod_gate.condition_of(pod) if pod is not None else None
                if said is not None and said.get("status") == "False" \
                        and said.get("reason") == pod_gate.REASON_FAILED_PLACEMENT:
                    return binder.Wait(pod_gate.REASON_FAILED_PLACEMENT, f"pod {user} uses this claim, but no node can"
                                       f" take it with its claims: {said.get('message', '')}")
        return None

    # -- status --------------------------------------------------------------------------------

    def _body(self, claim: ElasticGPUClaim) -> Body:
        return self.picture.claim_body(claim.metadata.namespace or "", claim.metadata.name or "") or claim.to_dict()

    def _write_status(self, claim: ElasticGPUClaim, status: Body) -> None:
        namespace, name = claim.metadata.namespace or "", claim.metadata.name or ""
        # The resourceVersion makes this a precondition: a controller with a stale picture must
        # never write Pending over a Bound another one just wrote.
        patch = {"metadata": {"resourceVersion": claim.metadata.resource_version}, "status": status}
        try:
            answer = self.kube.patch_claim_status(namespace, name, patch)
        except errors.NotFound:
            return  # deleted meanwhile: nothing to report on
        except errors.Conflict:
            self._refresh(namespace, name)
            raise
        self.picture.put_claim(answer)

    def _refresh(self, namespace: str, name: str) -> None:
        try:
            fresh = self.kube.get_claim(namespace, name)
        except errors.NotFound:
            return
        self.picture.put_claim(fresh)

    def pending(self, claim: ElasticGPUClaim, reason: str, message: str) -> None:
        """Say the claim is Pending for `reason` (no write, no Event when said already)."""
        self._pending(claim, reason, message)

    def _pending(self, claim: ElasticGPUClaim, reason: str, message: str) -> None:
        current = claim.status.conditions
        if claim.status.phase == "Pending" and claim.status.reason == reason and any(
            c.type == "Pending" and c.reason == reason and c.message == message for c in current
        ):
            return  # said already: no write, no Event
        pending = condition("Pending", reason, message, current)
        self._write_status(claim, {"phase": "Pending", "reason": reason, "message": message, "conditions": [pending]})
        kind = NORMAL if reason == binder.REASON_WAIT_FOR_CONSUMER else WARNING
        self.events.record(self._body(claim), type_=kind, reason=reason, message=message)

    def _lost(self, claim: ElasticGPUClaim, reason: str, message: str) -> None:
        said = any(c.type == "Lost" and c.reason == reason for c in claim.status.conditions)
        if claim.status.phase == "Lost" and said and claim.status.reason == reason:
            return
        lost = condition("Lost", reason, message, claim.status.conditions)
        # A preempted claim has a Preempted condition too (issue 27): it says by whom, the Lost one says what.
        kept = preempting.preempted_conditions(claim)
        self._write_status(claim, {"phase": "Lost", "reason": reason, "message": message,
                                   "conditions": [*kept, lost]})
        self.events.record(self._body(claim), type_=WARNING, reason=reason, message=message)

    # -- binding -------------------------------------------------------------------------------

    def _complete_bind(self, claim: ElasticGPUClaim, egpu_name: str) -> None:
        egpu = self.picture.egpu(egpu_name)
        if egpu is None:
            raise errors.BindingError(f"ElasticGPU {egpu_name} left the picture; the next sync re-decides")
        if egpu_name != names.elastic_gpu_name_for_claim(claim.metadata.uid or "") and not self._charge_static(
                claim, egpu):
            return  # an admin pre-bound it: charged like any static bind (a dynamic one was at its commit)
        if egpu.status.phase != "Bound":
            egpu = self.elastic_gpus.set_phase(egpu, "Bound", binder.REASON_BOUND,
                                               f"bound to claim {claim.metadata.namespace}/{claim.metadata.name}")
        self._bind_claim(claim, egpu)

    def _bind_claim(self, claim: ElasticGPUClaim, egpu: ElasticGPU, *, placement: Placement | None = None) -> None:
        """Step 3: the claim names the ElasticGPU (and the class it was bound under, when it named
        none: the default class, as a PVC's storageClassName is filled in), keeps the finalizer,
        and says Bound. With `placement` (a dynamic bind, whose ElasticGPU has no status yet)
        capacity, node and cards come from it and the Event says "provisioned" too."""
        namespace, name = claim.metadata.namespace or "", claim.metadata.name or ""
        egpu_name = egpu.metadata.name or ""
        finalizers = list(claim.metadata.finalizers)
        # The class actually used, for `kubectl get egpuc` (spec.elasticGPUClassName may be set once).
        used_class = None if claim.spec.elastic_gpu_class_name else egpu.spec.elastic_gpu_class_name
        if (claim.spec.elastic_gpu_name != egpu_name or names.FINALIZER_CLAIM_PROTECTION not in finalizers
                or used_class):
            if names.FINALIZER_CLAIM_PROTECTION not in finalizers:
                finalizers.append(names.FINALIZER_CLAIM_PROTECTION)
            spec: Body = {"elasticGPUName": egpu_name}
            if used_class:
                spec["elasticGPUClassName"] = used_class
            patch = {
                "metadata": {"finalizers": finalizers, "resourceVersion": claim.metadata.resource_version},
                "spec": spec,
            }
            try:
                answer = self.kube.patch_claim(namespace, name, patch)
            except errors.Conflict:
                # Changed since our picture (often: the other controller bound it). Re-read it, so
                # the retry decides from what the server holds (InSync when it is Bound already).
                self._refresh(namespace, name)
                raise
            claim = self.picture.put_claim(answer)
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
        isolation = binder.claim_isolation(class_of(claim, egpu, classes), whole=whole)
        if resizable(claim, egpu, classes) and (note := binder.resize_note(isolation)):
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
        if resizable(claim, egpu, classes):
            status["resizable"] = True  # read by the claim CRD's rule on spec.resources.requests
        partition = self._partition(egpu_name)
        if partition is not None:
            status["partition"] = partition  # the MIG instance it received (more than asked is normal)
        if (policing := policing_copy.wanted(claim, egpu, self.picture.view().classes)) is not None:
            status["policing"] = policing  # the agent reads it there: it may not read classes (issue 25)
        owner = pod_index.owner_pod(self._body(claim))
        if owner is not None and not claim.status.users:
            # An inline claim serves the pod that owns it: said with the bind, not in a write of its own.
            status["users"] = [{"name": owner[0], "uid": owner[1]}]
        self._write_status(claim, status)
        self.events.record(self._body(claim), type_=NORMAL, reason=binder.REASON_BOUND,
                           message=f"provisioned ElasticGPU {egpu_name} and {message}" if placement else message)
        if self.metrics is not None:
            self.metrics.bound(mode="dynamic" if placement else "static")
            if placement:
                self.metrics.provisioned()

    def bind_existing(self, claim: ElasticGPUClaim, egpu_name: str) -> None:
        """Bind `claim` to the Available ElasticGPU `egpu_name` now (the pod sync's path for a
        WaitForFirstConsumer claim that matches an existing ElasticGPU)."""
        self._bind_existing(claim, egpu_name)

    def _bind_existing(self, claim: ElasticGPUClaim, egpu_name: str) -> None:
        """Static bind, step 2: point the ElasticGPU at the claim (with its resourceVersion)."""
        egpu = self.picture.egpu(egpu_name)
        if egpu is None:
            raise errors.BindingError(f"ElasticGPU {egpu_name} left the picture; the next sync re-decides")
        if not self._charge_static(claim, egpu):
            return
        patch = {
            "metadata": {"resourceVersion": egpu.metadata.resource_version},
            "spec": {"claimRef": claim_ref_of(claim).to_dict()},
        }
        try:
            answer = self.kube.patch_elastic_gpu(egpu_name, patch)
        except errors.Conflict:
            # Someone else changed it (maybe bound it): re-read and decide again.
            self.elastic_gpus.put(self.kube.get_elastic_gpu(egpu_name))
            self.queue.add(("claim", claim.metadata.namespace or "", claim.metadata.name or ""))
            return
        patched = self.elastic_gpus.put(answer)
        egpu = self.elastic_gpus.set_phase(patched, "Bound", binder.REASON_BOUND,
                                           f"bound to claim {claim.metadata.namespace}/{claim.metadata.name}")
        self.commit.stamp_claim_ref(egpu)
        self._bind_claim(claim, egpu)

    def _charge_static(self, claim: ElasticGPUClaim, egpu: ElasticGPU) -> bool:
        """Charge the claim, before it is bound to the admin's ElasticGPU `egpu`, what that
        ElasticGPU reserves on its cards (as a ResourceQuota counts every PVC, static or
        dynamic: issue 23). False, with the claim Pending and rechecked later, when a quota of
        its namespace has no room."""
        if self.commit.quota is None or not claim.metadata.uid:
            return True
        with self.picture.lock:
            placement = self.picture.ledger.held(egpu.metadata.name or "")
            if placement is None:
                planned = binder.placement_of(egpu, self.picture.ledger.gpu)
                placement = planned if isinstance(planned, Placement) else None
        if placement is None:
            return True  # it cannot be served: its own sync fails it, and the claim waits for that
        try:
            self.commit.quota.charge(claim_ref_of(claim), placement)
        except QuotaExceeded as err:
            self._pending(claim, err.reason, err.message)
            self.queue.add(("claim", claim.metadata.namespace or "", claim.metadata.name or ""),
                           delay_s=self.settings.quota.recheck_s, recheck=True)
            return False
        return True

    # -- provisioning --------------------------------------------------------------------------

    def _provision(self, claim: ElasticGPUClaim, decision: binder.Provision) -> None:
        key = names.elastic_gpu_name_for_claim(claim.metadata.uid or "")
        placement = self._reserve(claim, key, decision)
        if placement is None:
            return
        # A preemption wrote the claim (its plan) on the way: bind from that version, not a stale one.
        claim = self.preempting.current(claim)
        self.after_commit(claim, decision, key, placement)

    def after_commit(self, claim: ElasticGPUClaim, decision: binder.Provision, key: str,
                     placement: Placement) -> None:
        """After the commit point: the rest of the bind, inline or handed to the pool."""
        body = build_elastic_gpu(claim, decision, placement, self.picture.ledger)
        if not self.hand_off.enabled:
            self._finish_provision(claim, placement, key, body)
            return
        claim_key: Key = ("claim", claim.metadata.namespace or "", claim.metadata.name or "")
        self.hand_off.submit((claim_key, ("egpu", key)), lambda: self._finish_provision(claim, placement, key, body))

    def _finish_provision(self, claim: ElasticGPUClaim, placement: Placement, key: str, body: Body) -> None:
        """Steps 2 and 3 of a dynamic bind, after the commit point."""
        try:
            created = self.kube.create_elastic_gpu(body)
        except errors.AlreadyExists:
            # Another controller (or this one before a crash) provisioned it first, maybe on other
            # cards: free what this attempt reserved beyond its cards, then finish its bind.
            model = self.elastic_gpus.put(self.kube.get_elastic_gpu(key))
            self.commit.free_extra_cards(model)
            if not binder.points_to(model, claim):
                raise errors.BindingError(f"ElasticGPU {key} exists but points to another claim;"
                                          " an admin must delete it") from None
            self._complete_bind(claim, key)
            return
        egpu = self.elastic_gpus.put(created)
        # The claim first: it is what the user waits for, and the ElasticGPU already points at it
        # (pre-bound), so a crash before the ElasticGPU's status is repaired by either sync
        # (`CompleteBind` for the claim, `MarkBound` for the ElasticGPU).
        self._bind_claim(claim, egpu, placement=placement)
        # One Event for the whole provisioning (the claim's Bound, where the user looks), none for
        # the ElasticGPU's first phase: Events cost the API server as much as the bind's writes.
        self.elastic_gpus.set_status(egpu, placement, "Bound", binder.REASON_BOUND,
                                     f"provisioned for claim {claim.metadata.namespace}/{claim.metadata.name}",
                                     event=False)

    def _reserve(self, claim: ElasticGPUClaim, key: str, decision: binder.Provision) -> Placement | None:
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
        kept = self.groups.kept_nodes(but=group_binding.single_waiter(claim))
        if kept and not request.nodes:
            # A claim group has waited too long: its nodes are kept from smaller claims (docs/gangs.md).
            with self.picture.lock:
                others = frozenset(n for n in ledger.inventory.node_names() if n not in kept)
            if not others:  # (an empty `nodes` would mean any node)
                self._pending(claim, binder.REASON_NO_CAPACITY, f"every node is kept for"
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
                    self._pending(claim, capacity.REASON_NEVER_FITS, never)
                    return None
                outcome = self.preempting.try_preempt(claim, decision, request)
                if outcome.retry:
                    continue  # the victims' room is free: place again
                if outcome.handled:
                    return None  # it waits for its victims to go (status written)
                message = f"no card can give {decision.request.describe()}: {result.reason}"
                if kept:
                    message += f" (nodes {', '.join(sorted(kept))} are kept for" \
                               f" {', '.join(sorted(set(kept.values())))}, which waited too long)"
                if result.closest:
                    message += f" (closest: {result.closest})"
                if outcome.note:
                    message += f"; {outcome.note}"
                self._pending(claim, binder.REASON_NO_CAPACITY, message)
                self.groups.single_waits(claim, decision)  # not starved for ever either (docs/gangs.md)
                return None
            assert result is not None
            try:
                self.commit.commit(key, result, claim_ref_of(claim))
                self.groups.done_waiting(group_binding.single_waiter(claim))
            except QuotaExceeded as err:
                # Nothing reserved. Quotas are not watched: check again after a while (docs/quota.md).
                self._pending(claim, err.reason, err.message)
                self.queue.add(("claim", claim.metadata.namespace or "", claim.metadata.name or ""),
                               delay_s=self.settings.quota.recheck_s, recheck=True)
                return None
            except (errors.Conflict, errors.Rejected) as err:
                logger.debug("reservation lost a race, re-planning: %s", err)
                self.commit.backoff(attempt)
                continue
            return result
        raise errors.BindingError(f"claim {claim.metadata.namespace}/{claim.metadata.name}: too many conflicts on"
                                  " the GPUs; retrying later")

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
                self._pending(claim, reason, planned.message)
                return None
            try:
                self.commit.commit(key, planned.placement, claim_ref_of(claim), planned.partitions)
            except QuotaExceeded as err:
                self._pending(claim, err.reason, err.message)
                self.queue.add(("claim", claim.metadata.namespace or "", claim.metadata.name or ""),
                               delay_s=self.settings.quota.recheck_s, recheck=True)
                return None
            except (errors.Conflict, errors.Rejected) as err:
                logger.debug("MIG reservation lost a race, re-planning: %s", err)
                self.commit.backoff(attempt)
                continue
            return planned.placement
        raise errors.BindingError(f"claim {claim.metadata.namespace}/{claim.metadata.name}: too many conflicts on"
                                  " the GPUs; retrying later")

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

    # -- release -------------------------------------------------------------------------------

    def _release(self, claim: ElasticGPUClaim) -> None:
        namespace, name = claim.metadata.namespace or "", claim.metadata.name or ""
        with self.picture.lock:
            users = self.picture.pods_using(namespace, name)
            owner = pod_index.owner_pod(self._body(claim))
            if owner is not None:
                # An inline claim serves only the pod that owns it: a pod recreated under the
                # same name names it too, and waits for it to go (then gets a claim of its own).
                users = {u for u in users if (p := self.picture.pods.pod(namespace, u)) is None
                         or (p.get("metadata") or {}).get("uid") == owner[1]}
            # The live map, under the lock: a copy would build the model of every Bound
            # ElasticGPU (`records`) where the decision reads one.
            decision = release.decide_release(claim, pods_using=users, elastic_gpus=self.picture.elastic_gpus())
        if isinstance(decision, release.NothingToRelease):
            return
        if isinstance(decision, release.KeepFinalizer):
            message = f"in use by pod(s) {', '.join(decision.pods)}; deletion waits until they terminate"
            if not any(c.reason == release.REASON_CLAIM_IN_USE for c in claim.status.conditions):
                in_use = condition("Terminating", release.REASON_CLAIM_IN_USE, message, claim.status.conditions)
                self._write_status(claim, {"conditions": [*[c.to_dict() for c in claim.status.conditions
                                                           if c.type != "Terminating"], in_use]})
                self.events.record(self._body(claim), type_=NORMAL, reason=release.REASON_CLAIM_IN_USE,
                                   message=message)
            return
        if decision.elastic_gpu is not None:
            egpu = self.picture.egpu(decision.elastic_gpu)
            if egpu is not None and egpu.status.phase not in ("Released", "Failed"):
                self.elastic_gpus.set_phase(egpu, "Released", binder.REASON_RELEASED,
                                            f"claim {namespace}/{name} was deleted")
            self.queue.add(("egpu", decision.elastic_gpu))
        kept = [f for f in claim.metadata.finalizers if f != names.FINALIZER_CLAIM_PROTECTION]
        try:
            self.kube.patch_claim(namespace, name, {"metadata": {"finalizers": kept,
                                                                 "resourceVersion": claim.metadata.resource_version}})
        except errors.NotFound:
            return
        if self.commit.quota is not None:
            # The claim is gone: its quota charge goes now, unless the namespace still holds its
            # reservation (its pods still run on the card, or it is being reclaimed): then once
            # the ElasticGPU's sync frees it (docs/quota.md).
            uid = claim.metadata.uid or ""
            self.commit.quota.release(namespace, uid, decision.elastic_gpu or names.elastic_gpu_name_for_claim(uid))
