"""ElasticGPU: a piece of GPU capacity a claim binds to (the PersistentVolume analog)."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from elasticgpu.api import cel, names, validation
from elasticgpu.api.errors import InvalidSpec
from elasticgpu.api.meta import Condition, GPUNodeAffinity, ObjectMeta, ObjectReference
from elasticgpu.api.quantities import parse_count
from elasticgpu.api.resources import parse_resource_map
from elasticgpu.api.schema import KubeModel, ResourceValue, crd_field, rule

ElasticGPUPhase = Literal["Pending", "Available", "Bound", "Released", "Failed"]
ReclaimPolicy = Literal["Delete", "Retain"]
GPU_NAME_RULE = (
    "must name a GPU object: its card's uuid in lower case, such as gpu-8f6b2c1e-... (kubectl get pgpu);"
    f" {validation.DNS_SUBDOMAIN_RULE}"
)
GPU_NAMES = validation.NameRule("spec.physicalGPU.gpuNames", GPU_NAME_RULE)
SHARE_GPU_NAME = validation.NameRule("spec.gpuShare.gpuName", GPU_NAME_RULE)
CLASS_NAME = validation.NameRule("spec.elasticGPUClassName")
UNIQUE_CARDS = "must not name a card twice"
ONE_SOURCE = "exactly one of spec.physicalGPU (whole cards) and spec.gpuShare (a slice of one card) must be set"
SHARE_CORES = "a share of one card (spec.gpuShare) has at most 100 cores; use spec.physicalGPU for whole cards"
SHARE_NO_CARDS = "a share of one card (spec.gpuShare) has no whole cards; use spec.physicalGPU for whole cards"
CORES_PER_CARDS = "must be 100 x the number of spec.physicalGPU.gpuNames (whole cards)"
CARDS_PER_CARDS = "must be the number of spec.physicalGPU.gpuNames"
CLAIM_REF_SET_ONCE = (
    "cannot be changed or removed once set (only its fields not set yet, such as uid, may be filled in);"
    " to reuse the capacity, delete this ElasticGPU and create a new one"
)
_REF_FIELDS = ("apiVersion", "kind", "namespace", "name", "uid", "resourceVersion")
_CORE = names.RESOURCE_CORE
_NVIDIA = names.RESOURCE_NVIDIA_GPU


def _count(key: str) -> str:
    # The value as an integer, when the resource map rules let it be one (they refuse the rest).
    return f"string(self.capacity['{key}'])"


def _has_count(key: str) -> str:
    return f"'{key}' in self.capacity && {_count(key)}.matches('^[0-9]+$')"


def _claim_ref_set_once() -> dict[str, str]:
    # Field by field: the static bind sets claimRef on an ElasticGPU that has none, and a
    # pre-bound claimRef (namespace and name only, written by an admin) may gain its uid.
    kept = " && ".join(
        f"(!has(oldSelf.claimRef.{f}) || (has(self.claimRef.{f}) && self.claimRef.{f} == oldSelf.claimRef.{f}))"
        for f in map(cel.identifier, _REF_FIELDS)
    )
    return rule(
        f"!has(oldSelf.claimRef) || (has(self.claimRef) && {kept})",
        f"spec.claimRef: {CLAIM_REF_SET_ONCE}",
        reason="FieldValueForbidden",
    )


GpuObjectName = Annotated[str, Field(json_schema_extra=GPU_NAMES.crd())]


class PhysicalGPUSource(KubeModel):
    """Whole cards."""

    gpu_names: list[GpuObjectName] = Field(
        alias="gpuNames",
        min_length=1,
        max_length=16,
        description="GPU objects (lowercased uuids) used whole.",
        json_schema_extra=crd_field(
            **{
                "x-kubernetes-validations": [
                    rule(
                        "self.all(n, self.exists_one(m, m == n))",
                        f"spec.physicalGPU.gpuNames: {UNIQUE_CARDS}",
                        reason="FieldValueInvalid",
                    )
                ]
            }
        ),
    )
    rdma_nics: list[str] = Field(
        default_factory=list,
        alias="rdmaNics",
        max_length=16,
        description="RDMA NICs (ibverbs names, e.g. mlx5_0) on the cards' PCIe roots, chosen for a claim that asks"
        " for elasticgpu.io/rdma; the node's agent hands their device nodes (/dev/infiniband/uverbsN, rdma_cm) to"
        " the claim's containers. A NIC is not exclusive: claims on cards of one root may share it.",
        json_schema_extra=crd_field(**{"x-kubernetes-list-type": "set"}),
    )


class GPUShareSource(KubeModel):
    """A slice of one card."""

    gpu_name: str = Field(
        alias="gpuName",
        min_length=1,
        description="GPU object (lowercased uuid) the slice is cut from.",
        json_schema_extra=SHARE_GPU_NAME.crd(),
    )


class ElasticGPUSpec(KubeModel):
    """What the ElasticGPU is and who it is bound to."""

    crd_rules: ClassVar[list[dict[str, str]]] = [
        rule(
            "has(self.physicalGPU) != has(self.gpuShare)",
            f"spec: {ONE_SOURCE}",
            reason="FieldValueRequired",
        ),
        cel.immutable("physicalGPU", "spec.", "create a new ElasticGPU instead"),
        cel.immutable("gpuShare", "spec.", "create a new ElasticGPU instead"),
        cel.immutable("capacity", "spec.", "create a new ElasticGPU instead"),
        rule(
            f"!has(self.gpuShare) || !({_has_count(_CORE)}) || int({_count(_CORE)}) <= 100",
            f"spec.capacity[{_CORE}]: {SHARE_CORES}",
            reason="FieldValueInvalid",
        ),
        rule(
            f"!has(self.gpuShare) || !('{_NVIDIA}' in self.capacity)",
            f"spec.capacity[{_NVIDIA}]: {SHARE_NO_CARDS}",
            reason="FieldValueForbidden",
        ),
        rule(
            f"!has(self.physicalGPU) || !({_has_count(_CORE)})"
            f" || int({_count(_CORE)}) == 100 * size(self.physicalGPU.gpuNames)",
            f"spec.capacity[{_CORE}]: {CORES_PER_CARDS}",
            reason="FieldValueInvalid",
        ),
        rule(
            f"!has(self.physicalGPU) || !({_has_count(_NVIDIA)})"
            f" || int({_count(_NVIDIA)}) == size(self.physicalGPU.gpuNames)",
            f"spec.capacity[{_NVIDIA}]: {CARDS_PER_CARDS}",
            reason="FieldValueInvalid",
        ),
        _claim_ref_set_once(),
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
        json_schema_extra=CLASS_NAME.crd(),
    )
    reclaim_policy: ReclaimPolicy | None = Field(
        default=None,
        alias="reclaimPolicy",
        description="What happens when the claim is deleted: Delete frees the capacity, Retain keeps it for an admin."
        " Default: the class's policy for provisioned ones, Retain for ones an admin created.",
    )


class ElasticGPUAccounting(KubeModel):
    """What the ElasticGPU has reserved over time (`elasticgpu.api.accounting`): the sums of the
    periods that ended and the start of the open one. Written only by the controller, in the same
    status patch as the phase or size change that closes a period."""

    since: str | None = Field(
        default=None, description="When the open period began (RFC 3339); absent while none is open (not Bound).")
    core_seconds: int = Field(
        default=0, ge=0, description="Card-core seconds of the periods that ended (100 = one card for one second).")
    memory_mib_seconds: int = Field(default=0, ge=0, description="MiB-seconds of memory of the periods that ended.")
    card_seconds: int = Field(default=0, ge=0, description="Whole-card seconds of the periods that ended.")


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
    gpu_list: str | None = Field(
        default=None,
        description="status.gpus joined by commas, for kubectl get (a printer column cannot join a list);"
        " written with status.gpus.",
    )
    claim: str | None = Field(
        default=None,
        description="The claim of spec.claimRef as namespace/name, for kubectl get (a printer column cannot"
        " join two fields); written once spec.claimRef is set.",
    )
    conditions: list[Condition] = Field(default_factory=list, description="Conditions of the ElasticGPU.")
    accounting: ElasticGPUAccounting | None = Field(
        default=None, description="What it has reserved over time, for billing (docs/accounting.md).")


class ElasticGPU(KubeModel):
    """A piece of GPU capacity (cluster scoped)."""

    crd_rules: ClassVar[list[dict[str, str]]] = []

    api_version: str = Field(default=names.API_VERSION, description="elasticgpu.io/v1alpha1")
    kind: str = Field(default=names.KIND_ELASTIC_GPU, description="ElasticGPU")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ElasticGPUSpec
    status: ElasticGPUStatus = Field(default_factory=ElasticGPUStatus)

    def check(self) -> None:
        """Refuse what the CRD refuses on create (the schema's types aside, which pydantic checks
        on load; the rules on updates are the server's). Raises `InvalidSpec` naming the field."""
        spec = self.spec
        if (spec.physical_gpu is None) == (spec.gpu_share is None):
            raise InvalidSpec(field="spec", rule=ONE_SOURCE)
        if not spec.capacity:
            raise InvalidSpec(field="spec.capacity", rule=cel.NON_EMPTY_MAP)
        parse_resource_map(spec.capacity, field="spec.capacity")
        CLASS_NAME.check(spec.elastic_gpu_class_name)
        core = parse_count(spec.capacity[_CORE], field=f"spec.capacity[{_CORE}]") if _CORE in spec.capacity else None
        if spec.physical_gpu is not None:
            cards = spec.physical_gpu.gpu_names
            for name in cards:
                GPU_NAMES.check(name)
            if len(set(cards)) != len(cards):
                raise InvalidSpec(field="spec.physicalGPU.gpuNames", rule=UNIQUE_CARDS, value=cards)
            if core is not None and core != names.CORES_PER_CARD * len(cards):
                raise InvalidSpec(field=f"spec.capacity[{_CORE}]", rule=CORES_PER_CARDS, value=core)
            if _NVIDIA in spec.capacity:
                whole = parse_count(spec.capacity[_NVIDIA], field=f"spec.capacity[{_NVIDIA}]")
                if whole != len(cards):
                    raise InvalidSpec(field=f"spec.capacity[{_NVIDIA}]", rule=CARDS_PER_CARDS, value=whole)
        if spec.gpu_share is not None:
            SHARE_GPU_NAME.check(spec.gpu_share.gpu_name)
            if core is not None and core > names.CORES_PER_CARD:
                raise InvalidSpec(field=f"spec.capacity[{_CORE}]", rule=SHARE_CORES, value=core)
            if _NVIDIA in spec.capacity:
                raise InvalidSpec(field=f"spec.capacity[{_NVIDIA}]", rule=SHARE_NO_CARDS)
        if spec.node_affinity is not None and spec.node_affinity.required is not None:
            spec.node_affinity.required.check(field="spec.nodeAffinity.required")
