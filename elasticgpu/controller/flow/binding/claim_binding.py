"""A claim's bind steps: a static bind (point the admin's ElasticGPU at the claim, charged to the
namespace's quota), completing a bind, and the rest of a dynamic bind after its commit point
(create the ElasticGPU, bind the claim, mark the ElasticGPU Bound), inline or handed to the pool
(`HandOff`). Every failure leaves the objects as they were after the last successful write and
raises; the worker retries the key from what it then finds.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from elasticgpu.allocator import Placement
from elasticgpu.api import ElasticGPU, ElasticGPUClaim, names, timestamps
from elasticgpu.controller import errors
from elasticgpu.controller.decisions import binder, provisioned_names
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.binding.claim_status import ClaimStatus
from elasticgpu.controller.flow.binding.commit import Commit
from elasticgpu.controller.flow.binding.elasticgpu_sync import ElasticGPUSync
from elasticgpu.controller.flow.binding.provisioner import build_elastic_gpu, claim_ref_of
from elasticgpu.controller.flow.machinery.handoff import HandOff
from elasticgpu.controller.flow.machinery.workqueue import Key, WorkQueue
from elasticgpu.controller.flow.quota_guard import QuotaExceeded
from elasticgpu.controller.metrics import ControllerMetrics
from elasticgpu.controller.picture.picture import Body, Picture
from elasticgpu.controller.settings import ControllerSettings


class ClaimBinding:
    """Carries out a claim's bind steps (see the module docstring)."""

    def __init__(self, *, kube: KubeApi, picture: Picture, queue: WorkQueue, status: ClaimStatus, commit: Commit,
                 elastic_gpus: ElasticGPUSync, hand_off: HandOff, settings: ControllerSettings,
                 metrics: Callable[[], ControllerMetrics | None] = lambda: None) -> None:
        """`status`: the claim's status writes; `metrics`: the controller's metrics when it has them
        (counts binds and provisions)."""
        self.kube = kube
        self.picture = picture
        self.queue = queue
        self.status = status
        self.commit = commit
        self.elastic_gpus = elastic_gpus
        self.hand_off = hand_off
        self.settings = settings
        self.metrics = metrics

    def complete_bind(self, claim: ElasticGPUClaim, egpu_name: str) -> None:
        """Finish the bind of a claim whose ElasticGPU `egpu_name` points at it already."""
        egpu = self.picture.egpu(egpu_name)
        if egpu is None:
            raise errors.BindingError(f"ElasticGPU {egpu_name} left the picture; the next sync re-decides")
        if not provisioned_names.is_provisioned_for(egpu_name, claim) and not self._charge_static(
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
                self.status.refresh(namespace, name)
                raise
            claim = self.picture.put_claim(answer)
        self.status.bound(claim, egpu, placement=placement)
        metrics = self.metrics()
        if metrics is not None:
            metrics.bound(mode="dynamic" if placement else "static",
                          waited_s=_since(claim.metadata.creation_timestamp))
            if placement:
                metrics.provisioned()

    def bind_existing(self, claim: ElasticGPUClaim, egpu_name: str) -> None:
        """Static bind, step 2: point the Available ElasticGPU `egpu_name` at the claim (with its
        resourceVersion), then bind the claim (also the pod sync's path for a WaitForFirstConsumer
        claim that matches an existing ElasticGPU)."""
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
            self.status.pending(claim, err.reason, err.message)
            self.queue.add(("claim", claim.metadata.namespace or "", claim.metadata.name or ""),
                           delay_s=self.settings.quota.recheck_s, recheck=True)
            return False
        return True

    # -- after the commit point ------------------------------------------------------------------

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
            self.complete_bind(claim, key)
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


def _since(stamp: str | None) -> float | None:
    """Seconds from `stamp` (RFC 3339) to now; None when it is unreadable."""
    began = timestamps.epoch_seconds(stamp)
    return None if began is None else max(0.0, time.time() - began)
