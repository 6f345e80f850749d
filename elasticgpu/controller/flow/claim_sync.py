"""The claim sync: ask `binder.decide_claim` for a claim's next step and carry it out (wait,
lose, bind to an existing ElasticGPU, provision one, release on deletion), through the classes
that do each: `ClaimStatus` (status writes and Events), `ClaimBinding` (the bind steps),
`Reserver` (step 1 of a dynamic bind: the reservation), `GroupBinding` (claim groups),
`Releaser` (deletion), and, for claims in sync, `Resizer`, `Recommender` and `PolicingCopy`.

A dynamic bind is: reserve (`Commit`, the commit point), then hand the rest to the pool
(`HandOff`): create the ElasticGPU, bind the claim, mark the ElasticGPU Bound. Every failure
leaves the objects as they were after the last successful write and raises; the worker
retries the key from what it then finds.
"""

from __future__ import annotations

from elasticgpu.api import ElasticGPUClaim
from elasticgpu.controller.decisions import binder, groups, pod_gate, provisioned_names
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.binding import policing_copy
from elasticgpu.controller.flow.binding.claim_binding import ClaimBinding
from elasticgpu.controller.flow.binding.claim_status import ClaimStatus
from elasticgpu.controller.flow.binding.commit import Commit
from elasticgpu.controller.flow.binding.elasticgpu_sync import ElasticGPUSync
from elasticgpu.controller.flow.binding.releasing import Releaser
from elasticgpu.controller.flow.binding.reserving import Reserver
from elasticgpu.controller.flow.elastic.recommending import Recommender
from elasticgpu.controller.flow.elastic.resizing import Resizer
from elasticgpu.controller.flow.groups.group_binding import GroupBinding
from elasticgpu.controller.flow.machinery.events import EventRecorder
from elasticgpu.controller.flow.machinery.handoff import HandOff
from elasticgpu.controller.flow.machinery.workqueue import WorkQueue
from elasticgpu.controller.flow.preemption import preempting
from elasticgpu.controller.metrics import ControllerMetrics
from elasticgpu.controller.picture.picture import Picture
from elasticgpu.controller.settings import ControllerSettings


class ClaimSync:
    """Syncs one claim at a time (see the module docstring)."""

    def __init__(self, *, kube: KubeApi, picture: Picture, queue: WorkQueue, events: EventRecorder,
                 commit: Commit, elastic_gpus: ElasticGPUSync, hand_off: HandOff,
                 settings: ControllerSettings) -> None:
        self.picture = picture
        self.metrics: ControllerMetrics | None = None
        """Counts binds, provisions and preemptions when set (`Operability` sets it)."""
        self.status = ClaimStatus(kube=kube, picture=picture, events=events)
        """The claim's status writes (Pending, Lost, Bound, in use) and their Events."""
        self.binding = ClaimBinding(kube=kube, picture=picture, queue=queue, status=self.status, commit=commit,
                                    elastic_gpus=elastic_gpus, hand_off=hand_off, settings=settings,
                                    metrics=lambda: self.metrics)
        """The bind steps: static binds, completing a bind, the rest of a dynamic one (`after_commit`)."""
        self.resizer = Resizer(kube=kube, picture=picture, events=events, commit=commit, elastic_gpus=elastic_gpus,
                               settings=settings)
        """Resizes Bound claims in place (issue 17): called when the binder finds a claim in sync."""
        self.recommender = Recommender(kube=kube, picture=picture, queue=queue, events=events, settings=settings)
        """Recommends sizes from measured use (issue 17), after the resizer, for claims in sync."""
        self.policing = policing_copy.PolicingCopy(kube=kube, picture=picture)
        """Keeps a Bound claim's status.policing true to its class (issue 25), for claims in sync."""
        self.groups = GroupBinding(picture=picture, queue=queue, commit=commit, settings=settings,
                                   status=self.status, binding=self.binding)
        """Binds claim groups all or none (issue 27, docs/gangs.md)."""
        commit.kept_nodes = self.groups.kept_nodes
        self.preempting = preempting.Preempter(kube=kube, picture=picture, queue=queue, events=events, commit=commit,
                                               elastic_gpus=elastic_gpus, pending=self.status.pending,
                                               metrics=lambda: self.metrics)
        """Preempts claims of lower priority for a claim that fits nowhere (issue 27, docs/preemption.md)."""
        self.reserver = Reserver(kube=kube, picture=picture, queue=queue, status=self.status, commit=commit,
                                 elastic_gpus=elastic_gpus, groups=self.groups, preempter=self.preempting,
                                 settings=settings)
        """Step 1 of a dynamic bind: plans and commits the reservation, or says why the claim waits."""
        self.releaser = Releaser(kube=kube, picture=picture, queue=queue, status=self.status, commit=commit,
                                 elastic_gpus=elastic_gpus)
        """Releases deleted claims."""

    def sync(self, namespace: str, name: str) -> bool:
        """Decide and carry out the next step of one claim. True when nothing is pending: the
        claim is gone, ignored, or Bound and in sync with no resize waiting (the periodic resync
        may leave it alone until it changes, `settled.SettledKeys`); False while it waits or
        binds (the resync looks at it each pass: a Pending claim's wait may end without an event)."""
        with self.picture.lock:
            claim = self.picture.claim(namespace, name)
            if claim is None:
                return True
            decision = binder.decide_claim(claim, self.picture.view())
        if isinstance(decision, binder.InSync):
            at_rest = self.resizer.sync(namespace, name, decision.elastic_gpu)
            self.recommender.sync(namespace, name, decision.elastic_gpu)
            self.policing.sync(namespace, name, decision.elastic_gpu)
            self.preempting.settled(namespace, name)
            return at_rest
        if isinstance(decision, binder.Ignore):
            return True
        if isinstance(decision, binder.Wait):
            if decision.reason == binder.REASON_WAIT_FOR_CONSUMER:
                decision = self._consumer_placement(claim) or decision
            self.status.pending(claim, decision.reason, decision.message)
        elif isinstance(decision, binder.MarkLost):
            self.status.lost(claim, decision.reason, decision.message)
        elif isinstance(decision, binder.CompleteBind):
            self.binding.complete_bind(claim, decision.elastic_gpu)
        elif isinstance(decision, binder.BindToExisting):
            self.binding.bind_existing(claim, decision.elastic_gpu)
        elif isinstance(decision, binder.Provision):
            if groups.group_name(claim):
                self.groups.provision(claim, decision)  # a gang: all of its members or none
            else:
                self._provision(claim, decision)
        elif isinstance(decision, binder.Deleting):
            self.releaser.release(claim)
        return False

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

    def _provision(self, claim: ElasticGPUClaim, decision: binder.Provision) -> None:
        """A single claim's dynamic bind: reserve (the commit point), then the rest (`after_commit`)."""
        key = provisioned_names.provisioned_name(claim)
        placement = self.reserver.reserve(claim, key, decision)
        if placement is None:
            return
        # A preemption wrote the claim (its plan) on the way: bind from that version, not a stale one.
        claim = self.preempting.current(claim)
        self.binding.after_commit(claim, decision, key, placement)
