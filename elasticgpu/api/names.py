"""Every well-known name of elasticgpu, defined once.

Group, versions, kinds, resource names, annotations, labels, finalizers, the scheduling gate
and the provisioners. Other modules import these constants instead of spelling strings.
"""

from __future__ import annotations

import uuid
from typing import Final

GROUP: Final = "elasticgpu.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
CATEGORY: Final = "elasticgpu-all"

# Kinds and their REST plurals.
KIND_GPU: Final = "GPU"
KIND_ELASTIC_GPU: Final = "ElasticGPU"
KIND_CLAIM: Final = "ElasticGPUClaim"
KIND_CLASS: Final = "ElasticGPUClass"
PLURAL_GPU: Final = "gpus"
PLURAL_ELASTIC_GPU: Final = "elasticgpus"
PLURAL_CLAIM: Final = "elasticgpuclaims"
PLURAL_CLASS: Final = "elasticgpuclasses"
KIND_QUOTA: Final = "ElasticGPUQuota"
PLURAL_QUOTA: Final = "elasticgpuquotas"

# Resources a claim can request.
RESOURCE_CORE: Final = "elasticgpu.io/gpu-core"
RESOURCE_MEMORY: Final = "elasticgpu.io/gpu-memory"
RESOURCE_NVIDIA_GPU: Final = "nvidia.com/gpu"
RESOURCE_RDMA: Final = "elasticgpu.io/rdma"
"""RDMA NICs on the PCIe roots of a claim's whole cards (docs/topology.md)."""
KNOWN_RESOURCES: Final = (RESOURCE_CORE, RESOURCE_MEMORY, RESOURCE_NVIDIA_GPU, RESOURCE_RDMA)
CORES_PER_CARD: Final = 100

# Provisioners this project implements; any other name belongs to someone else.
PROVISIONER_GPUSHARE: Final = "elasticgpu.io/gpushare"
PROVISIONER_PHYSICAL: Final = "elasticgpu.io/physical"
OWN_PROVISIONERS: Final = (PROVISIONER_GPUSHARE, PROVISIONER_PHYSICAL)

# Annotations and labels.
ANNOTATION_DEFAULT_CLASS: Final = "elasticgpu.io/is-default-class"
ANNOTATION_CLAIM_PREFIX: Final = "egpuc.elasticgpu.io/"
ANNOTATION_INLINE_REQUEST_PREFIX: Final = "elasticgpu.io/request."
ANNOTATION_SELECTED_NODE: Final = "elasticgpu.io/selected-node"
ANNOTATION_FORCE_RELEASE: Final = "elasticgpu.io/force-release"
"""On an ElasticGPU, "true": free its reservation even while its node's agent reports its claim running
(an admin's way out for a node whose agent cannot report any more; `kubectl egpu release --force`)."""
LABEL_NODE: Final = "elasticgpu.io/node"
LABEL_CLAIM_NAMESPACE: Final = "elasticgpu.io/claim-namespace"
LABEL_CLAIM_NAME: Final = "elasticgpu.io/claim-name"
LABEL_CLASS: Final = "elasticgpu.io/class"
# On pods that use claims (set by the admission webhook): the controller watches only these pods.
LABEL_USES_CLAIMS: Final = "elasticgpu.io/uses-claims"
# On claims: the claim group (gang) a claim belongs to, bound all or none (docs/gangs.md).
LABEL_GROUP: Final = "elasticgpu.io/group"
ANNOTATION_GROUP_MIN_MEMBERS: Final = "elasticgpu.io/group-min-members"
"""How many members the group needs before any is bound; an annotation or a label (the annotation wins)."""

# Finalizers and the pod scheduling gate.
FINALIZER_CLAIM_PROTECTION: Final = "elasticgpu.io/claim-protection"
FINALIZER_EGPU_PROTECTION: Final = "elasticgpu.io/egpu-protection"
SCHEDULING_GATE: Final = "elasticgpu.io/claims"

# CDI kind under which the agent publishes devices (`elasticgpu.io/gpu=<uuid>`).
CDI_KIND: Final = "elasticgpu.io/gpu"


def elastic_gpu_name_for_claim(claim_uid: str) -> str:
    """Name of the ElasticGPU dynamically provisioned for a claim; derived from its UID so that
    a retried provisioning after a crash finds the object instead of creating a duplicate."""
    return f"egpu-{claim_uid.lower()}"


# uuid5 namespace of inline claims' ElasticGPU names (any fixed uuid; never change it: names derive from it).
_INLINE_NAMES = uuid.UUID("6f1c1a64-2b1e-5b8e-9d1a-5f0c2e3a7b41")


def elastic_gpu_name_for_inline_claim(namespace: str, claim_name: str, pod_uid: str) -> str:
    """Name of the ElasticGPU provisioned for an inline claim, known before the claim exists: from
    its namespace, its name and its owner pod's uid (one claim per pod and container, and a pod
    recreated under the same name has another uid). The controller creates the claim with this
    name in `spec.elasticGPUName`, so its bind needs no spec write (issue 37). The namespace is in
    it so that a claim in another namespace cannot name it as its own."""
    return f"egpu-{uuid.uuid5(_INLINE_NAMES, f'{namespace}/{claim_name}/{pod_uid.lower()}')}"


def gpu_object_name(uuid: str) -> str:
    """Name of the GPU object of a card: its uuid, lowercased (`GPU-8F6B...` -> `gpu-8f6b...`)."""
    return uuid.lower()


def claim_annotation(container: str) -> str:
    """Pod annotation that names the claim used by one container."""
    return f"{ANNOTATION_CLAIM_PREFIX}{container}"


def inline_request_annotation(container: str) -> str:
    """Pod annotation carrying an inline request for one container."""
    return f"{ANNOTATION_INLINE_REQUEST_PREFIX}{container}"

# Translation of device-plugin resources (`nvidia.com/gpu`, HAMi's names) into inline claims at
# admission (issue 45, docs/translation.md).
LABEL_TRANSLATE_RESOURCES: Final = "elasticgpu.io/translate-resources"
"""On a Namespace, "true": its pods' GPU extended resources become their inline claims (with the chart's
`translation.enabled`)."""
ANNOTATION_TRANSLATE_CLASS: Final = "elasticgpu.io/translate-class"
"""On a Namespace: the ElasticGPUClass its translated requests use (absent: the default class)."""
ANNOTATION_TRANSLATED: Final = "elasticgpu.io/translated"
"""On a pod (written by the webhook): JSON, per container, the resources removed and the request written."""
