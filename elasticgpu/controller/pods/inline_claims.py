"""Inline claims: the claim a pod's `elasticgpu.io/request.<container>` annotation asks for.

The controller makes it, named `<pod>-<container>` (`pod_claims.inline_claim_name`: hashed when
too long), owned by the pod (an ownerReference with `controller: true` and `blockOwnerDeletion:
true`, as a generic ephemeral volume's claim is), and deletes it once that pod is gone. On a real cluster the garbage
collector deletes it too; both deletions carry the claim's uid as a precondition, so whichever
comes second finds nothing (404) or a newer claim of the same name (409) and leaves it alone.

A pod recreated under the same name (a StatefulSet's) has another uid: the old pod's claim is
deleted first and a new one made for the new pod. A claim of that name that no pod owns was made
by someone else: it is never taken over or deleted; the pod waits with a condition that says so.

When the class it will be provisioned under is sure (`provisioned_class`), the claim is created as
its bind would leave its spec, finalizer and `spec.elasticGPUName` included (see `build_claim`).

Pure: building bodies and deciding what to delete; `pod_sync` does the writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from elasticgpu.api import ElasticGPUClass, names
from elasticgpu.api.pod_claims import InlineRequest
from elasticgpu.controller.decisions import binder
from elasticgpu.controller.picture import pod_index

Body = dict[str, Any]


def owner_reference(pod: Mapping[str, Any]) -> Body:
    """The ownerReference that makes a claim the pod's own.

    `blockOwnerDeletion` as a generic ephemeral volume's claim: with foreground deletion the pod
    object stays until its claim is gone. Clusters that enforce owner-reference permissions
    (OwnerReferencesPermissionEnforcement) require `update` on pods/finalizers for it (the
    controller's RBAC, deploy/chart/templates/controller.yaml)."""
    meta = pod.get("metadata") or {}
    return {"apiVersion": "v1", "kind": "Pod", "name": meta.get("name", ""), "uid": meta.get("uid", ""),
            "controller": True, "blockOwnerDeletion": True}


def provisioned_class(request: InlineRequest, view: binder.Picture) -> ElasticGPUClass | None:
    """The class an inline claim will be provisioned under, when that is sure at its creation: the
    class it names, else the default one, if that class is ours and no Available ElasticGPU of it
    (an admin's, which a claim binds before one is provisioned) is free. None: it binds as a claim
    a user made."""
    klass = view.classes.get(request.spec.class_name) if request.spec.class_name else view.default_class()
    if klass is None or klass.provisioner not in names.OWN_PROVISIONERS:
        return None
    candidates = view.elastic_gpus if view.unclaimed_available is None else view.unclaimed_available
    if any(binder.is_free_static(egpu, klass.metadata.name) for egpu in candidates.values()):
        return None
    return klass


def build_claim(pod: Mapping[str, Any], request: InlineRequest, *, provisioned: ElasticGPUClass | None = None) -> Body:
    """The claim to create for one inline request of `pod`. With `provisioned` (`provisioned_class`)
    it is made as its bind would leave its spec: the protection finalizer, that class, and the name
    of the ElasticGPU to provision (`names.elastic_gpu_name_for_inline_claim`), so the bind writes
    only statuses (issue 37: a spec write to a claim costs the API server 3-4 ms per pod)."""
    meta = pod.get("metadata") or {}
    pod_name = str(meta.get("name", ""))
    namespace, claim_name = str(meta.get("namespace", "")), request.claim_name(pod_name)
    metadata: Body = {
        "name": claim_name,
        "namespace": namespace,
        "ownerReferences": [owner_reference(pod)],
        "annotations": {names.inline_request_annotation(request.container): request.text},
    }
    spec = request.spec.to_dict()
    if provisioned is not None:
        metadata["finalizers"] = [names.FINALIZER_CLAIM_PROTECTION]
        spec["elasticGPUClassName"] = provisioned.metadata.name
        spec["elasticGPUName"] = names.elastic_gpu_name_for_inline_claim(namespace, claim_name,
                                                                         str(meta.get("uid", "")))
    return {"apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM, "metadata": metadata, "spec": spec}


@dataclass(frozen=True)
class Stale:
    """A claim owned by an earlier pod of the same name (or by a pod that is gone): delete it."""

    name: str
    uid: str


def owned_by(claim: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """True when `claim` is owned (as controller) by this incarnation of `pod`."""
    owner = pod_index.owner_pod(claim)
    return owner is not None and owner[1] == str((pod.get("metadata") or {}).get("uid", ""))


def stale_claims(owned: Mapping[str, Mapping[str, Any]], pod: Mapping[str, Any] | None) -> list[Stale]:
    """Of the claims a pod of this name owns (`owned`: name -> body), those to delete: all of
    them when the pod is gone (`pod` None), else those of another incarnation (uid)."""
    stale = []
    for name, body in sorted(owned.items()):
        if pod is not None and owned_by(body, pod):
            continue
        uid = str((body.get("metadata") or {}).get("uid", ""))
        if uid and not (body.get("metadata") or {}).get("deletionTimestamp"):
            stale.append(Stale(name, uid))
    return stale
