"""The class a Bound claim answers to, and whether its requests may change. Pure: models in, answers out."""

from __future__ import annotations

from collections.abc import Mapping

from elasticgpu.api import ElasticGPU, ElasticGPUClaim, ElasticGPUClass
from elasticgpu.controller.decisions import provisioned_names


def class_of(claim: ElasticGPUClaim, egpu: ElasticGPU,
             classes: Mapping[str, ElasticGPUClass]) -> ElasticGPUClass | None:
    """The class the claim was bound under: its own, else its ElasticGPU's."""
    name = claim.spec.class_name or egpu.spec.elastic_gpu_class_name
    return classes.get(name) if name else None


def resizable(claim: ElasticGPUClaim, egpu: ElasticGPU, classes: Mapping[str, ElasticGPUClass]) -> bool:
    """True when the claim's requests may change: its class sets `allowClaimResize` and its
    ElasticGPU was provisioned for it (named from its uid). A static ElasticGPU an admin made is
    never resized by a claim, as a pre-provisioned PV is not expanded by its claim."""
    klass = class_of(claim, egpu, classes)
    dynamic = provisioned_names.is_provisioned_for(egpu.metadata.name or "", claim)
    return klass is not None and klass.allow_claim_resize and dynamic
