"""Release: what happens when a claim is deleted.

A claim carries `elasticgpu.io/claim-protection` from its bind on. While a pod that is not
terminated (phase neither Succeeded nor Failed) names the claim in an
`egpuc.elasticgpu.io/<container>` annotation, the finalizer stays. Then, in this order:
1. its ElasticGPU (if it points to this claim) becomes Released;
2. the finalizer goes, and the claim disappears;
3. the ElasticGPU's own sync reclaims it: Delete frees the capacity and deletes it, Retain keeps
   it Released for an admin.
A crash after 1 leaves a Released ElasticGPU and a claim still being deleted: the next sync
repeats 2. A crash after 2 leaves a Released ElasticGPU: step 3 is its ordinary sync.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from elasticgpu.api import ElasticGPU, ElasticGPUClaim, names, pod_claims
from elasticgpu.controller.decisions import provisioned_names
from elasticgpu.controller.decisions.binder import points_to

REASON_CLAIM_IN_USE = "ClaimInUse"
TERMINATED_POD_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class KeepFinalizer:
    """A pod still uses the claim."""

    pods: tuple[str, ...]


@dataclass(frozen=True)
class ReleaseClaim:
    """Release the ElasticGPU (when it points to the claim), then drop the finalizer."""

    elastic_gpu: str | None


@dataclass(frozen=True)
class NothingToRelease:
    """The finalizer is already gone (or was never ours)."""


ReleaseDecision = KeepFinalizer | ReleaseClaim | NothingToRelease


def claims_of_pod(pod: Mapping[str, Any]) -> set[str]:
    """Names of the claims a pod uses: those its `egpuc.elasticgpu.io/<container>` annotations
    name, and the inline claims its `elasticgpu.io/request.<container>` annotations make (read
    leniently: protection must not depend on the annotations being valid)."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    used = {v for k, v in annotations.items() if k.startswith(names.ANNOTATION_CLAIM_PREFIX) and v}
    pod_name = meta.get("name") or ""
    used |= {pod_claims.inline_claim_name(pod_name, k.removeprefix(names.ANNOTATION_INLINE_REQUEST_PREFIX))
             for k in annotations if k.startswith(names.ANNOTATION_INLINE_REQUEST_PREFIX) and pod_name}
    return used


def pod_is_running(pod: Mapping[str, Any]) -> bool:
    """True while the pod is not terminated (it may still run a container that uses the GPU) nor shut down."""
    return (pod.get("status") or {}).get("phase") not in TERMINATED_POD_PHASES and not pod_is_shut_down(pod)


def pod_is_shut_down(pod: Mapping[str, Any]) -> bool:
    """True for a pod being deleted with grace 0: kubelet is done with it, it was never scheduled, or it was
    force-deleted; only finalizers keep its object. It runs no container, so it holds no claim: with foreground
    deletion its inline claims (blockOwnerDeletion) must go first, and waiting for the pod would be a cycle
    (Kubernetes' PVC protection controller breaks the same one with its `podIsShutDown`)."""
    meta = pod.get("metadata") or {}
    return bool(meta.get("deletionTimestamp")) and meta.get("deletionGracePeriodSeconds") == 0


def decide_release(
    claim: ElasticGPUClaim, *, pods_using: Iterable[str], elastic_gpus: Mapping[str, ElasticGPU]
) -> ReleaseDecision:
    """The next step for a claim being deleted."""
    if names.FINALIZER_CLAIM_PROTECTION not in claim.metadata.finalizers:
        return NothingToRelease()
    pods = tuple(sorted(pods_using))
    if pods:
        return KeepFinalizer(pods)
    name = claim.spec.elastic_gpu_name or provisioned_names.provisioned_name(claim)
    egpu = elastic_gpus.get(name)
    if egpu is not None and points_to(egpu, claim):
        return ReleaseClaim(name)
    return ReleaseClaim(None)
