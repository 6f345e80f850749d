"""The name of the ElasticGPU the controller provisions for a claim. Pure: a claim in, a name out.

A claim a user made gets `egpu-<claim uid>` (`names.elastic_gpu_name_for_claim`), filled into its
`spec.elasticGPUName` when it binds. An inline claim is the controller's own: it is created with
its ElasticGPU's name in `spec.elasticGPUName` already, derived from its namespace, its name and its
owner pod's uid (`names.elastic_gpu_name_for_inline_claim`), so that its bind writes no spec
(issue 37: a write to a custom resource costs the API server 3-4 ms).

Such a name is believed only when it derives from the claim itself: from the uid of the pod that
owns it as controller, or of the pod its status (written by the controller alone) says it serves.
A name a tenant wrote that does not derive so is a static bind to an ElasticGPU an admin made,
as before; one that does names the tenant's own claim in its own namespace and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from elasticgpu.api import ElasticGPUClaim, names


def controlling_pod(owner_references: Iterable[Mapping[str, Any]]) -> tuple[str, str] | None:
    """(name, uid) of the pod among `owner_references` that owns the object as its controller."""
    for ref in owner_references:
        if ref.get("kind") == "Pod" and ref.get("apiVersion") == "v1" and ref.get("controller"):
            return str(ref.get("name", "")), str(ref.get("uid", ""))
    return None


def owner_pod_uid(claim: ElasticGPUClaim) -> str | None:
    """The uid of the pod that owns `claim` as its controller (an inline claim), or None."""
    owner = controlling_pod(claim.metadata.owner_references)
    return (owner[1] or None) if owner is not None else None


def prenamed(claim: ElasticGPUClaim) -> str | None:
    """`spec.elasticGPUName` when it is the name provisioned for this inline claim, else None."""
    name = claim.spec.elastic_gpu_name
    if not name:
        return None
    namespace, claim_name = claim.metadata.namespace or "", claim.metadata.name or ""
    pods = [owner_pod_uid(claim), *(user.uid for user in claim.status.users)]
    if any(uid and names.elastic_gpu_name_for_inline_claim(namespace, claim_name, uid) == name for uid in pods):
        return name
    return None


def provisioned_name(claim: ElasticGPUClaim) -> str:
    """The name of the ElasticGPU provisioned (or to provision) for `claim`."""
    return prenamed(claim) or names.elastic_gpu_name_for_claim(claim.metadata.uid or "")


def is_provisioned_for(egpu_name: str, claim: ElasticGPUClaim) -> bool:
    """True when `egpu_name` is the name the controller provisions for `claim` (not an admin's)."""
    return egpu_name == provisioned_name(claim)
