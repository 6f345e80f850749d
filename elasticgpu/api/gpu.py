"""GPU: one physical card, written by the agent of its node (the Node / ResourceSlice analog)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from elasticgpu.api import names
from elasticgpu.api.errors import InvalidSpec
from elasticgpu.api.meta import Condition, ObjectMeta, ObjectReference
from elasticgpu.api.schema import SCHEMA_DEFAULT, KubeModel, ResourceValue, crd_field, rule

# Bounds the CEL cost of the sums over allocations; far above what 100 cores can hold.
MAX_ALLOCATIONS = 256
NAMED_BY_UUID = "must be spec.uuid in lower case (GPU objects are named by their card's uuid)"


CardIsolation = Literal["MPS", "HAMiCore"]
GPUOwner = Literal["ElasticGPU", "DRA"]
"""Who may allocate the card: our controller (ElasticGPU) or Kubernetes' DRA through our driver (docs/dra.md)."""


class GPUSpec(KubeModel):
    """Inventory of one card, as its node's agent discovered it."""

    index: int = Field(ge=0, description="Index of the card on its node (NVML index).")
    uuid: str = Field(min_length=1, description="Card uuid, e.g. GPU-8f6b...; the object is named by it, lowercased.")
    model: str = Field(default="", description="Product name, e.g. NVIDIA A100-SXM4-80GB.")
    memory: int = Field(ge=1, description="Total memory of the card in MiB.")
    node_name: str = Field(min_length=1, description="Node that holds the card.")
    numa: int | None = Field(default=None, ge=0, description="NUMA node of the card; absent when unknown.")
    links: list[str] = Field(default_factory=list, description="Uuids of the cards linked to this one by NVLink.")
    pcie_root: str | None = Field(
        default=None,
        description="PCI bus id of the root port (or root complex) above the card, e.g. 0000:00:01.0; absent when"
        " unknown. Cards and NICs under one root talk without crossing the CPU (GPUDirect RDMA).",
    )
    nics: list[str] = Field(
        default_factory=list,
        description="RDMA NICs (ibverbs device names, e.g. mlx5_0) under the card's PCIe root, as the node's agent"
        " found them in /sys/class/infiniband; a claim asking for elasticgpu.io/rdma gets NICs from this list.",
    )
    mig: bool = Field(default=False, description="True when MIG mode is enabled on the card.")
    owner: GPUOwner = Field(
        default=names.OWNER_ELASTIC_GPU,
        description="The DESIRED owner of the card, set by the platform team: ElasticGPU (our claims) or DRA"
        " (ResourceClaims through the elasticgpu DRA driver). The node's agent keeps it when it rewrites the spec;"
        " the controller moves status.owner here once nothing holds the card on the old side (docs/dra.md).",
        json_schema_extra=crd_field(**{SCHEMA_DEFAULT: True}),
    )


class GPULimit(KubeModel):
    """A claim's size on one card: percent of compute and MiB of memory."""

    cores: int = Field(ge=0, le=names.CORES_PER_CARD, description="Percent of the card's compute.")
    memory: int = Field(ge=0, description="MiB of the card's memory.")


class GPUPartition(KubeModel):
    """Where a reservation's MIG instance sits on the card (a class with partitioning: MIG)."""

    profile: str = Field(min_length=1, description="The MIG profile, e.g. 3g.40gb.")
    start: int = Field(ge=0, le=7, description="The first memory slice of the instance (of 8).")


GroupAttemptState = Literal["Committing", "Complete", "Aborted"]


class GPUAllocationGroup(KubeModel):
    """The claim group commit attempt a reservation belongs to (docs/gangs.md).

    One attempt reserves every member of a claim group; all of its reservations carry the same
    token. The anchor's reservation (its first, on `anchorGPU`) holds the state that decides
    the attempt: a controller writes Complete or Aborted there, once, with a resourceVersion
    precondition; the other reservations' `state` is the one they were written with."""

    token: str = Field(min_length=1, description="The commit attempt, one per try of one controller.")
    anchor: str = Field(min_length=1, description="Name of the member claim whose reservation decides the attempt.")
    anchor_gpu: str = Field(
        alias="anchorGPU", min_length=1, description="The GPU object holding the anchor's deciding reservation."
    )
    state: GroupAttemptState = Field(
        description="Committing: members being reserved; Complete: every member reserved, they bind; Aborted: rolled"
        " back (any controller frees what is left of it)."
    )


class GPUAllocation(KubeModel):
    """One reservation on the card. Writing it (with a resourceVersion precondition) is the commit point."""

    elastic_gpu: str = Field(alias="elasticGPU", min_length=1, description="ElasticGPU that holds the reservation.")
    claim_ref: ObjectReference | None = Field(default=None, description="Claim the reservation was made for.")
    cores: int = Field(default=0, ge=0, le=names.CORES_PER_CARD, description="Percent of the card's compute reserved.")
    memory: int = Field(default=0, ge=0, description="MiB of the card's memory reserved.")
    exclusive: bool = Field(
        default=False, description="True when the whole card is reserved; nobody else may share it."
    )
    reserved_at: str | None = Field(default=None, description="When the reservation was written (RFC 3339).")
    limit: GPULimit | None = Field(
        default=None,
        description="The size the node's agent enforces on the claim's containers while a resize is under way"
        " (a shrink: the smaller size, before the reservation shrinks); absent: cores and memory.",
    )
    partition: GPUPartition | None = Field(
        default=None,
        description="The MIG instance of the reservation (profile and start slice), committed with it; the node's"
        " agent creates the instance there. Absent: a soft share or a whole card.",
    )
    group: GPUAllocationGroup | None = Field(
        default=None,
        description="The claim group commit attempt that made the reservation (docs/gangs.md); absent for a claim"
        " bound alone.",
    )


class GPUUsage(KubeModel):
    """What the card's processes really use, reported by the agent."""

    memory_used: int = Field(default=0, ge=0, description="MiB of memory in use.")
    cores_used: int = Field(default=0, ge=0, description="Percent of SM time in use.")
    update_time: str | None = Field(default=None, description="When the agent measured it (RFC 3339).")


class GPURunningClaim(KubeModel):
    """A claim whose containers run on the card, as the node's agent sees them (its ledger's open rows).

    The controller never frees a reservation while its claim is listed here: the card would
    serve two claims at once."""

    namespace: str = Field(min_length=1, description="Namespace of the claim.")
    name: str = Field(min_length=1, description="Name of the claim.")
    uid: str | None = Field(default=None, description="Uid of the claim the containers were created for.")
    pods: list[str] = Field(default_factory=list, description="Pods (namespace/name) whose containers use the card.")
    since: str | None = Field(default=None, description="When the first of these containers was created (RFC 3339).")
    applied: GPULimit | None = Field(
        default=None,
        description="The limit in effect in these containers (what their limits file says); absent when the"
        " agent does not know it yet.",
    )


class GPUPreparedClaim(KubeModel):
    """A DRA ResourceClaim the node's agent holds on the card (issue 48): prepared (its DRA driver's
    checkpoint has the claim) or with a container that can still run (its ledger's open rows).

    A move of the card from DRA back to ElasticGPU waits until none is listed: a force-deleted pod's
    claim may be deallocated while kubelet still stops its container."""

    namespace: str = Field(min_length=1, description="Namespace of the ResourceClaim.")
    name: str = Field(min_length=1, description="Name of the ResourceClaim.")
    uid: str | None = Field(default=None, description="Uid of the ResourceClaim.")


class GPUStatus(KubeModel):
    """Capacity, reservations, health and usage of the card."""

    capacity: dict[str, ResourceValue] = Field(default_factory=dict, description="Total resources of the card.")
    allocatable: dict[str, ResourceValue] = Field(
        default_factory=dict, description="Resources left after the reservations."
    )
    allocatable_summary: str | None = Field(
        default=None,
        description="status.allocatable as one text for kubectl get: free cores and free memory, e.g. 70%/40Gi;"
        " written with status.allocatable.",
    )
    allocations: list[GPUAllocation] = Field(
        default_factory=list,
        max_length=MAX_ALLOCATIONS,
        description="Reservations on the card, one per ElasticGPU.",
        json_schema_extra=crd_field(
            **{
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["elasticGPU"],
                "x-kubernetes-validations": [
                    rule(
                        "self.map(a, a.cores).sum() <= 100",
                        "status.allocations: the cores of all reservations must not exceed 100",
                        reason="FieldValueInvalid",
                    ),
                    rule(
                        "!self.exists(a, has(a.exclusive) && a.exclusive) || size(self) == 1",
                        "status.allocations: a card reserved whole (exclusive) cannot hold other reservations",
                        reason="FieldValueInvalid",
                    ),
                ],
            }
        ),
    )
    health: Literal["Healthy", "Unhealthy", "Unknown"] | None = Field(
        default=None, description="Healthy, Unhealthy (XID errors) or Unknown (agent silent)."
    )
    conditions: list[Condition] = Field(default_factory=list, description="Conditions of the card.")
    usage: GPUUsage | None = Field(default=None, description="Measured usage of the card.")
    isolation: list[CardIsolation] = Field(
        default_factory=list,
        max_length=2,
        description="The isolation modes the node's agent can provide on the card (besides None, always there):"
        " MPS when the driver's nvidia-cuda-mps-control is installed, HAMiCore when the admin's libvgpu.so is."
        " A slice of a class that asks for a mode binds only to a card that lists it.",
        json_schema_extra=crd_field(**{"x-kubernetes-list-type": "set"}),
    )
    running_claims: list[GPURunningClaim] = Field(
        default_factory=list,
        description="Claims whose containers run on the card, written by the node's agent; the controller"
        " keeps their reservations until they are gone.",
    )
    prepared_claims: list[GPUPreparedClaim] = Field(
        default_factory=list,
        description="DRA ResourceClaims prepared on the card or whose containers still run, written by the"
        " node's agent; a move from DRA to ElasticGPU waits until none is listed.",
    )
    owner: GPUOwner | None = Field(
        default=None,
        description="The EFFECTIVE owner of the card, written only by the controller: ElasticGPU or DRA. It follows"
        " spec.owner once nothing holds the card on the old side (the OwnerMove condition says what the move"
        " waits for); absent: ElasticGPU.",
    )


class GPU(KubeModel):
    """A physical card (cluster scoped, named by its lowercased uuid)."""

    crd_rules: ClassVar[list[dict[str, str]]] = [
        rule(
            "self.metadata.name == self.spec.uuid.lowerAscii()",
            f"metadata.name: {NAMED_BY_UUID}",
            reason="FieldValueInvalid",
        ),
        rule(
            "!has(self.status) || !has(self.status.allocations)"
            " || self.status.allocations.map(a, a.memory).sum() <= self.spec.memory",
            "status.allocations: the memory of all reservations must not exceed spec.memory",
            reason="FieldValueInvalid",
        ),
        # One owner per card (docs/dra.md): a card DRA owns holds no reservation of ours, whoever writes.
        rule(
            "!has(self.status) || !has(self.status.owner) || self.status.owner != 'DRA'"
            " || !has(self.status.allocations) || size(self.status.allocations) == 0",
            "status.owner: a card DRA owns holds no ElasticGPU reservation in status.allocations; move it back"
            " (spec.owner: ElasticGPU) and wait for status.owner to follow",
            reason="FieldValueInvalid",
        ),
    ]

    api_version: str = Field(default=names.API_VERSION, description="elasticgpu.io/v1alpha1")
    kind: str = Field(default=names.KIND_GPU, description="GPU")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: GPUSpec
    status: GPUStatus = Field(default_factory=GPUStatus)

    def check(self) -> None:
        """Refuse what the CRD refuses on create (the schema's types aside, which pydantic checks
        on load). Raises `InvalidSpec` naming the field."""
        if self.metadata.name != names.gpu_object_name(self.spec.uuid):
            raise InvalidSpec(field="metadata.name", rule=NAMED_BY_UUID, value=self.metadata.name)


def effective_owner(gpu: GPU) -> GPUOwner:
    """Who owns the card now: status.owner, or ElasticGPU where the controller has not written it yet
    (cards from before owners existed; a driver never serves a card whose status.owner is not DRA)."""
    return gpu.status.owner or names.OWNER_ELASTIC_GPU


def open_to_elastic_gpu(gpu: GPU) -> bool:
    """True when our allocator may place on the card: desired and effective owner are both ElasticGPU,
    so new reservations stop the moment the platform team sets spec.owner to DRA."""
    return gpu.spec.owner == names.OWNER_ELASTIC_GPU and effective_owner(gpu) == names.OWNER_ELASTIC_GPU


def open_to_dra(gpu: GPU) -> bool:
    """True when the DRA driver may publish (and prepare) the card: desired and effective owner are both
    DRA, so publishing stops the moment spec.owner leaves DRA."""
    return gpu.spec.owner == names.OWNER_DRA and effective_owner(gpu) == names.OWNER_DRA
