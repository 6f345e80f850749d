"""ElasticGPUClaim: a user's request for GPU capacity (the PersistentVolumeClaim analog)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from elasticgpu.api import cel, names, validation
from elasticgpu.api.errors import InvalidSpec
from elasticgpu.api.meta import Condition, LabelSelector, ObjectMeta
from elasticgpu.api.policing import Policing
from elasticgpu.api.resources import GpuRequest, parse_claim_resources
from elasticgpu.api.schema import KubeModel, ResourceValue, crd_field, rule

ClaimPhase = Literal["Pending", "Bound", "Lost"]
ClaimIsolation = Literal["None", "MPS", "HAMiCore", "WholeCard"]
WHOLE_CARD = "WholeCard"
"""status.isolation of a claim that holds its cards whole: nobody shares them, no mechanism is needed."""
ELASTIC_GPU_NAME = validation.NameRule("spec.elasticGPUName")
CLASS_NAME = validation.NameRule("spec.elasticGPUClassName")
EGPU_CLASS_NAME = validation.NameRule("spec.egpuClassName")
_REQUESTS = "spec.resources.requests"
# The requests unchanged, present or absent (a rule on the claim's root: it also reads the status).
_REQUESTS_SAME = (
    f"has(self.{_REQUESTS}) == has(oldSelf.{_REQUESTS})"
    f" && (!has(self.{_REQUESTS}) || self.{_REQUESTS} == oldSelf.{_REQUESTS})"
)


def _resource_map(field: str, description: str) -> Any:
    # Any, as pydantic's own `Field` returns: the value stands in for the field's default.
    return Field(
        default_factory=dict,
        max_length=3,
        description=description,
        json_schema_extra=crd_field(**{"x-kubernetes-validations": cel.resource_map_rules(field)}),
    )


class ResourceRequirements(KubeModel):
    """Requested resources, as in a container's resources."""

    crd_rules: ClassVar[list[dict[str, str]]] = [
        rule(
            "(has(self.requests) && size(self.requests) > 0) || (has(self.limits) && size(self.limits) > 0)",
            "spec.resources: must request at least one of " + ", ".join(names.KNOWN_RESOURCES),
            reason="FieldValueRequired",
        ),
        *cel.limits_not_below_requests("spec.resources"),
        cel.immutable("limits", "spec.resources.", "delete the claim and create a new one"),
    ]

    requests: dict[str, ResourceValue] = _resource_map(
        "spec.resources.requests",
        "What the claim needs: elasticgpu.io/gpu-core (1..100 percent of one card, or a multiple of 100 for whole"
        " cards), elasticgpu.io/gpu-memory (MiB or a quantity such as 10Gi), nvidia.com/gpu (whole cards).",
    )
    limits: dict[str, ResourceValue] = _resource_map(
        "spec.resources.limits",
        "Upper limits enforced in the container (HAMi-core, MPS); default: the requests.",
    )


class ElasticGPUClaimSpec(KubeModel):
    """What the user asks for."""

    crd_rules: ClassVar[list[dict[str, str]]] = [
        cel.set_once("elasticGPUName", "spec"),
        cel.set_once("elasticGPUClassName", "spec"),
        cel.set_once("egpuClassName", "spec"),
        cel.immutable("selector", "spec.", "delete the claim and create a new one"),
        cel.same_if_both("elasticGPUClassName", "egpuClassName", "spec."),
    ]

    resources: ResourceRequirements = Field(description="Resources requested from one card, or whole cards.")
    elastic_gpu_name: str | None = Field(
        default=None,
        alias="elasticGPUName",
        description="ElasticGPU to bind to (static binding); filled in by the controller on bind. Set once.",
        json_schema_extra=ELASTIC_GPU_NAME.crd(),
    )
    elastic_gpu_class_name: str | None = Field(
        default=None,
        alias="elasticGPUClassName",
        description="Class to bind or provision with; absent means the default class, which the controller"
        " then writes here on bind. Set once.",
        json_schema_extra=CLASS_NAME.crd(),
    )
    egpu_class_name: str | None = Field(
        default=None,
        alias="egpuClassName",
        description="Upstream elastic-gpu spelling of elasticGPUClassName; accepted for compatibility.",
        json_schema_extra=EGPU_CLASS_NAME.crd(),
    )
    selector: LabelSelector | None = Field(default=None, description="Bind only to ElasticGPUs with these labels.")

    @property
    def class_name(self) -> str | None:
        """The class the user named, whichever spelling they used."""
        return self.elastic_gpu_class_name or self.egpu_class_name

    def gpu_request(self) -> tuple[GpuRequest, GpuRequest]:
        """(request, limit) normalised; raises `InvalidRequest` naming the field."""
        return parse_claim_resources(self.resources.requests, self.resources.limits)

    def check(self) -> None:
        """Refuse what the CRD refuses (the schema's types aside, which pydantic checks on load).
        Raises `InvalidSpec` naming the field and the rule."""
        ELASTIC_GPU_NAME.check(self.elastic_gpu_name)
        CLASS_NAME.check(self.elastic_gpu_class_name)
        EGPU_CLASS_NAME.check(self.egpu_class_name)
        if self.elastic_gpu_class_name and self.egpu_class_name and self.elastic_gpu_class_name != self.egpu_class_name:
            raise InvalidSpec(field="spec.elasticGPUClassName and spec.egpuClassName", rule=cel.SAME_IF_BOTH)
        if self.selector is not None:
            self.selector.check(field="spec.selector")
        self.gpu_request()


class ClaimUsage(KubeModel):
    """What the claim's containers really use, reported by the agent."""

    memory_used: int = Field(default=0, ge=0, description="MiB of GPU memory in use.")
    cores_used: int = Field(default=0, ge=0, description="Percent of SM time in use.")
    update_time: str | None = Field(default=None, description="When the agent measured it (RFC 3339).")


class ClaimPartition(KubeModel):
    """The MIG instance a claim of a `partitioning: MIG` class received (issue 26)."""

    profile: str = Field(description="The MIG profile, e.g. 3g.40gb: the smallest of the card's model that covers"
                         " the request.")
    cores: int = Field(ge=0, description="Percent of the card's compute the instance has (its compute slices of 7);"
                       " more than asked is normal for MIG.")
    memory: int = Field(ge=0, description="MiB of the card's memory the instance has (its memory slices of 8).")
    start: int | None = Field(default=None, ge=0, description="The first memory slice of the instance on its card.")


class ClaimRecommendation(KubeModel):
    """The size the controller recommends from the claim's measured use (`docs/recommendations.md`)."""

    cores: int = Field(ge=0, description="Recommended percent of the card's compute: the peak use x (1 + margin).")
    memory: int = Field(ge=0, description="Recommended MiB of the card's memory: the peak use x (1 + margin).")
    state: Literal["RightSized", "OverSized", "UnderSized"] = Field(
        description="RightSized (the request is in [recommendation, recommendation x (1 + margin)]), OverSized"
        " (above), UnderSized (below, in cores or memory).",
    )
    reason: str = Field(default="", description="The measured peak and window the recommendation comes from.")
    since: str | None = Field(default=None, description="When the claim entered this state (RFC 3339).")


class PreemptionVictim(KubeModel):
    """One victim of a preemption plan: its reservation and its claim."""

    elastic_gpu: str = Field(alias="elasticGPU", description="The victim's ElasticGPU (its reservation).")
    claim: str = Field(description="The victim claim, as namespace/name.")
    uid: str = Field(default="", description="The victim claim's uid: another claim of the same name is not it.")


class ClaimPreemption(KubeModel):
    """The preemption a claim that fits nowhere carries out (docs/preemption.md). Written by the controller
    only: a plan is the controller's own state, never read from what a tenant may write."""

    node: str = Field(description="The node the victims make room on.")
    card: str = Field(default="", description="The card's uuid for a slice; empty for whole cards.")
    on: str = Field(default="", description="Where, for people (node and card).")
    victims: list[PreemptionVictim] = Field(
        default_factory=list, max_length=1000,
        description="The claims preempted to make room: all the members of a claim group together.",
    )


class ClaimUser(KubeModel):
    """A pod the claim serves (a claim serves one pod at a time, as a ReadWriteOnce volume)."""

    name: str = Field(description="Name of the pod (in the claim's namespace).")
    uid: str = Field(default="", description="Uid of the pod: a recreated pod of the same name is another user.")


class ElasticGPUClaimStatus(KubeModel):
    """Where the claim is in its life."""

    phase: ClaimPhase | None = Field(default=None, description="Pending, Bound or Lost.")
    reason: str | None = Field(
        default=None, description="One CamelCase word for the phase, e.g. WaitingForFirstConsumer, NoCapacity,"
        " ElasticGPUFailed; the reason of the phase's condition.",
    )
    message: str | None = Field(default=None, description="Why it is in this phase and what to do, for people.")
    capacity: dict[str, ResourceValue] = Field(
        default_factory=dict, description="What the bound ElasticGPU gives (cores integer, memory quantity)."
    )
    allocated_resources: dict[str, ResourceValue] = Field(
        default_factory=dict,
        description="What is reserved for the claim on its card(s); differs from capacity while a resize is under"
        " way (PVC's status.allocatedResources).",
    )
    resizable: bool | None = Field(
        default=None,
        description="True when spec.resources.requests may change (the class set allowClaimResize when the claim"
        " was bound); written by the controller, read by the CRD's rule on the requests.",
    )
    node_name: str | None = Field(default=None, description="Node of the bound card(s).")
    gpus: list[str] = Field(default_factory=list, description="Uuids of the bound card(s).")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Bound, or Pending with the reason; Resizing and ResizePending during a resize.",
    )
    usage: ClaimUsage | None = Field(default=None, description="Measured usage of the claim.")
    partition: ClaimPartition | None = Field(
        default=None, description="The MIG instance the claim received (a class with partitioning: MIG).",
    )
    recommendation: ClaimRecommendation | None = Field(
        default=None, description="The size recommended from the measured use (the class's resizePolicy).",
    )
    isolation: ClaimIsolation | None = Field(
        default=None,
        description="What enforces the claim's size in its containers, from its class on bind: None (advisory),"
        " MPS, HAMiCore, or WholeCard (the cards are the claim's alone). docs/isolation.md.",
    )
    users: list[ClaimUser] = Field(
        default_factory=list, max_length=1,
        description="The pod the claim serves, written by the controller before it lets the pod start.",
    )
    preemption: ClaimPreemption | None = Field(
        default=None,
        description="The preemption under way for this claim: where and its victims; written by the controller,"
        " removed once the claim is Bound (docs/preemption.md).",
    )
    preempted_by: str | None = Field(
        default=None,
        description="namespace/name of the claim preempting this one; written by the controller (docs/preemption.md).",
    )
    allow_privileged: bool | None = Field(
        default=None,
        description="True when privileged containers may use the claim (its class sets allowPrivileged: they see"
        " every card of their node); written by the controller from the class, read by the node agent. Absent:"
        " the agent refuses a privileged container that uses the claim.",
    )
    policing: Policing | None = Field(
        default=None,
        description="What the node agent does when the claim uses more GPU memory than it reserved: the class's"
        " overLimitAction and overLimitGraceSeconds, copied by the controller on bind and kept true to the class."
        " Absent: Warn.",
    )


class ElasticGPUClaim(KubeModel):
    """A claim for GPU capacity (namespaced)."""

    crd_rules: ClassVar[list[dict[str, str]]] = [
        # A claim's rules cannot read its class: the controller records on bind whether the
        # class allowed a resize (status.resizable), and only then may the requests change.
        rule(
            f"{_REQUESTS_SAME} || (has(oldSelf.status) && has(oldSelf.status.resizable)"
            " && oldSelf.status.resizable)",
            "spec.resources.requests: is immutable unless the claim's ElasticGPUClass sets allowClaimResize: true"
            " (and the claim is Bound, status.resizable); delete the claim and create a new one",
            reason="FieldValueForbidden",
            field_path=".spec.resources.requests",
        ),
    ]

    api_version: str = Field(default=names.API_VERSION, description="elasticgpu.io/v1alpha1")
    kind: str = Field(default=names.KIND_CLAIM, description="ElasticGPUClaim")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ElasticGPUClaimSpec
    status: ElasticGPUClaimStatus = Field(default_factory=ElasticGPUClaimStatus)

    def check(self) -> None:
        """Refuse what the CRD refuses; raises `InvalidSpec` naming the field and the rule."""
        self.spec.check()
