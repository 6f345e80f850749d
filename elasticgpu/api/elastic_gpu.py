"""ElasticGPU: a piece of GPU capacity a claim binds to (the PersistentVolume analog)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from elasticgpu.api import cel, names
from elasticgpu.api.meta import Condition, GPUNodeAffinity, ObjectMeta, ObjectReference
from elasticgpu.api.schema import KubeModel, ResourceValue, crd_field, rule

ElasticGPUPhase = Literal["Pending", "Available", "Bound", "Released", "Failed"]
ReclaimPolicy = Literal["Delete", "Retain"]


class PhysicalGPUSource(KubeModel):
    """Whole cards."""

    gpu_names: list[str] = Field(
        alias="gpuNames", min_length=1, max_length=16, description="GPU objects (lowercased uuids) used whole."
    )


class GPUShareSource(KubeModel):
    """A slice of one card."""

    gpu_name: str = Field(
        alias="gpuName", min_length=1, description="GPU object (lowercased uuid) the slice is cut from."
    )


class ElasticGPUSpec(KubeModel):
    """What the ElasticGPU is and who it is bound to."""

    crd_rules: ClassVar[list[dict[str, str]]] = [
        rule(
            "has(self.physicalGPU) != has(self.gpuShare)",
            "spec: exactly one of spec.physicalGPU (whole cards) and spec.gpuShare (a slice of one card) must be set",
            reason="FieldValueRequired",
        ),
        cel.immutable("physicalGPU", "spec.", "create a new ElasticGPU instead"),
        cel.immutable("gpuShare", "spec.", "create a new ElasticGPU instead"),
        cel.immutable("capacity", "spec.", "create a new ElasticGPU instead"),
    ]

    capacity: dict[str, ResourceValue] = Field(
        description="Resources it offers: elasticgpu.io/gpu-core, elasticgpu.io/gpu-memory or nvidia.com/gpu.",
        max_length=3,
        json_schema_extra=crd_field(
            **{
                "x-kubernetes-validations": [
                    cel.non_empty_map("spec.capacity"),
                    *cel.resource_map_rules("spec.capacity"),
                ]
            }
        ),
    )
    physical_gpu: PhysicalGPUSource | None = Field(default=None, alias="physicalGPU", description="Whole cards.")
    gpu_share: GPUShareSource | None = Field(default=None, alias="gpuShare", description="A slice of one card.")
    claim_ref: ObjectReference | None = Field(
        default=None, description="The claim bound to this ElasticGPU (set on bind, or by an admin to pre-bind)."
    )
    node_affinity: GPUNodeAffinity | None = Field(default=None, description="Nodes the ElasticGPU can be used from.")
    node_name: str | None = Field(
        default=None, description="Node of the card(s); filled in by the controller if empty."
    )
    elastic_gpu_class_name: str | None = Field(
        default=None,
        alias="elasticGPUClassName",
        description="Class of this ElasticGPU; only claims of that class bind to it.",
    )
    reclaim_policy: ReclaimPolicy | None = Field(
        default=None,
        alias="reclaimPolicy",
        description="What happens when the claim is deleted: Delete frees the capacity, Retain keeps it for an admin."
        " Default: the class's policy for provisioned ones, Retain for ones an admin created.",
    )


class ElasticGPUStatus(KubeModel):
    """Where the ElasticGPU is in its life."""

    phase: ElasticGPUPhase | None = Field(default=None, description="Pending, Available, Bound, Released or Failed.")
    reason: str | None = Field(default=None, description="One CamelCase word for the phase, e.g. DoesNotFit.")
    message: str | None = Field(default=None, description="Why it is in this phase, for people.")
    capacity: dict[str, ResourceValue] = Field(
        default_factory=dict, description="Capacity as the controller normalised it (cores integer, memory quantity)."
    )
    node_name: str | None = Field(default=None, description="Node of the card(s).")
    gpus: list[str] = Field(default_factory=list, description="Uuids of the card(s).")
    conditions: list[Condition] = Field(default_factory=list, description="Conditions of the ElasticGPU.")


class ElasticGPU(KubeModel):
    """A piece of GPU capacity (cluster scoped)."""

    crd_rules: ClassVar[list[dict[str, str]]] = []

    api_version: str = Field(default=names.API_VERSION, description="elasticgpu.io/v1alpha1")
    kind: str = Field(default=names.KIND_ELASTIC_GPU, description="ElasticGPU")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ElasticGPUSpec
    status: ElasticGPUStatus = Field(default_factory=ElasticGPUStatus)
