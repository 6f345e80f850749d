"""Dynamic provisioning: the ElasticGPU `egpu-<claim-uid>` made for a claim and its placement."""

from __future__ import annotations

import hashlib
from typing import Any

from elasticgpu.allocator import Placement
from elasticgpu.api import ElasticGPU, ElasticGPUClaim, ObjectReference, format_memory, names
from elasticgpu.controller.decisions import provisioned_names
from elasticgpu.controller.decisions.binder import Provision
from elasticgpu.controller.picture.reservations import Ledger

LABEL_VALUE_MAX = 63
"""Label values stop at 63 characters (names of claims, classes and nodes may have 253)."""


def label_value(value: str) -> str:
    """`value` as a label value: itself when it fits in 63 characters; else its first 52
    characters (trailing `-` `.` `_` dropped: a value must end alphanumeric), `-` and 10 hex
    digits of its SHA-256, so distinct long names stay distinct. Select by the same function:
    `-l elasticgpu.io/claim-name=<label_value(name)>`; the full names are in `spec.claimRef`,
    `spec.nodeName` and `spec.elasticGPUClassName`."""
    if len(value) <= LABEL_VALUE_MAX:
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:10]
    return f"{value[:LABEL_VALUE_MAX - 11].rstrip('-._')}-{digest}"


def provisioned_for_its_claim(egpu: ElasticGPU) -> bool:
    """True when the controller provisioned `egpu` for the claim its claimRef names: named from that
    claim's uid, or (an inline claim's, named before the claim existed: `provisioned_names`) labelled
    with that claim as `build_elastic_gpu` labels it. Only the controller writes ElasticGPUs it
    provisions; an admin's carries neither."""
    ref = egpu.spec.claim_ref
    if ref is None or not ref.uid:
        return False
    name = egpu.metadata.name or ""
    if name == names.elastic_gpu_name_for_claim(ref.uid):
        return True
    labels = egpu.metadata.labels
    return (name.startswith("egpu-") and labels.get(names.LABEL_CLAIM_NAMESPACE) == (ref.namespace or "")
            and labels.get(names.LABEL_CLAIM_NAME) == label_value(ref.name or ""))


def claim_ref_of(claim: ElasticGPUClaim) -> ObjectReference:
    """The claimRef that points at this claim (with its uid)."""
    return ObjectReference.model_validate(
        {
            "apiVersion": names.API_VERSION,
            "kind": names.KIND_CLAIM,
            "namespace": claim.metadata.namespace,
            "name": claim.metadata.name,
            "uid": claim.metadata.uid,
        }
    )


def capacity_of(placement: Placement) -> dict[str, int | str]:
    """Capacity of a placement as written into specs and statuses (cores integer, memory quantity)."""
    memory = sum(share.memory_mib for share in placement.cards)
    if placement.cards and all(share.whole for share in placement.cards):
        count = len(placement.cards)
        return {
            names.RESOURCE_CORE: names.CORES_PER_CARD * count,
            names.RESOURCE_NVIDIA_GPU: count,
            names.RESOURCE_MEMORY: format_memory(memory),
        }
    cores = sum(share.cores for share in placement.cards)
    capacity: dict[str, int | str] = {names.RESOURCE_MEMORY: format_memory(memory)}
    if cores:
        capacity[names.RESOURCE_CORE] = cores
    return capacity


def spec_capacity_of(placement: Placement) -> dict[str, int | str]:
    """`spec.capacity` of a provisioned ElasticGPU: what was reserved. For whole cards the
    memory is left out (each card gives all of its own)."""
    capacity = capacity_of(placement)
    if names.RESOURCE_NVIDIA_GPU in capacity:
        capacity.pop(names.RESOURCE_MEMORY, None)
    return capacity


def build_elastic_gpu(
    claim: ElasticGPUClaim, decision: Provision, placement: Placement, ledger: Ledger
) -> dict[str, Any]:
    """The ElasticGPU to create for `claim`: pre-bound (claimRef with uid), protected by the
    finalizer, labelled with its node, claim and class (`label_value`: valid even for names
    longer than a label value may be)."""
    gpu_names = [ledger.name_of_uuid(share.uuid) for share in placement.cards]
    spec: dict[str, Any] = {
        "capacity": spec_capacity_of(placement),
        "claimRef": claim_ref_of(claim).to_dict(),
        "nodeName": placement.node,
        "elasticGPUClassName": decision.class_name,
        "reclaimPolicy": decision.reclaim_policy,
        "nodeAffinity": {
            "required": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [placement.node]}]}
                ]
            }
        },
    }
    if placement.cards and all(share.whole for share in placement.cards):
        spec["physicalGPU"] = {"gpuNames": gpu_names}
        if placement.nics:
            spec["physicalGPU"]["rdmaNics"] = list(placement.nics)
    else:
        spec["gpuShare"] = {"gpuName": gpu_names[0]}
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND_ELASTIC_GPU,
        "metadata": {
            "name": provisioned_names.provisioned_name(claim),
            "labels": {
                names.LABEL_NODE: label_value(placement.node),
                names.LABEL_CLAIM_NAMESPACE: claim.metadata.namespace or "",
                names.LABEL_CLAIM_NAME: label_value(claim.metadata.name or ""),
                names.LABEL_CLASS: label_value(decision.class_name),
            },
            "finalizers": [names.FINALIZER_EGPU_PROTECTION],
        },
        "spec": spec,
    }
