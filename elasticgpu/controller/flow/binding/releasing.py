"""Releasing a deleted claim (`decisions.release`): while pods use it, its deletion waits (said
once on the claim); then its ElasticGPU is marked Released, the claim's protection finalizer
goes, and its quota charge with it (unless its reservation still stands: then the ElasticGPU's
sync frees both).
"""

from __future__ import annotations

from elasticgpu.api import ElasticGPUClaim, names
from elasticgpu.controller import errors
from elasticgpu.controller.decisions import binder, provisioned_names, release
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.binding.claim_status import ClaimStatus
from elasticgpu.controller.flow.binding.commit import Commit
from elasticgpu.controller.flow.binding.elasticgpu_sync import ElasticGPUSync
from elasticgpu.controller.flow.machinery.workqueue import WorkQueue
from elasticgpu.controller.picture import pod_index
from elasticgpu.controller.picture.picture import Picture


class Releaser:
    """Releases deleted claims (see the module docstring)."""

    def __init__(self, *, kube: KubeApi, picture: Picture, queue: WorkQueue, status: ClaimStatus, commit: Commit,
                 elastic_gpus: ElasticGPUSync) -> None:
        self.kube = kube
        self.picture = picture
        self.queue = queue
        self.status = status
        self.commit = commit
        self.elastic_gpus = elastic_gpus

    def release(self, claim: ElasticGPUClaim) -> None:
        """The next step of a deleted claim's release (see the module docstring)."""
        namespace, name = claim.metadata.namespace or "", claim.metadata.name or ""
        with self.picture.lock:
            users = self.picture.pods_using(namespace, name)
            owner = pod_index.owner_pod(self.status.body(claim))
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
            self.status.in_use(claim, decision.pods)
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
            self.commit.quota.release(namespace, uid, decision.elastic_gpu or provisioned_names.provisioned_name(claim))
