"""ElasticGPUClass: how claims of a class are provisioned (the StorageClass analog)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Literal

from pydantic import Field

from elasticgpu.api import cel, names, policing, validation
from elasticgpu.api.errors import InvalidClassParameters, InvalidSpec
from elasticgpu.api.meta import Condition, ObjectMeta
from elasticgpu.api.schema import SCHEMA_DEFAULT, KubeModel, crd_field, rule

BindingMode = Literal["Immediate", "WaitForFirstConsumer"]
ReclaimPolicy = Literal["Delete", "Retain"]
BindOrder = Literal["FIFO", "FairShare"]
Policy = Literal["binpack", "spread", "fragmentation"]
Sharing = Literal["exclusive", "timeslice", "mps"]
ResizePolicy = Literal["Off", "Recommend", "Auto"]
Partitioning = Literal["MIG"]
Isolation = Literal["None", "MPS", "HAMiCore"]
Topology = Literal["NVLink", "SameNUMA", "Any"]
PreemptionPolicy = Literal["Never", "PreemptLowerPriority"]
PREEMPTION_POLICIES: tuple[PreemptionPolicy, ...] = ("Never", "PreemptLowerPriority")
"""Whether a claim of the class may take room from claims of lower priority (docs/preemption.md): as a pod's
`preemptionPolicy`, PreemptLowerPriority (the default) or Never."""
PRIORITY_MAX = 1_000_000_000
PRIORITY_MIN = -2_147_483_648
# As a user-defined PriorityClass value (scheduling.k8s.io): at most one billion, above is kept for the system.
PRIORITY_RANGE = f"must be {PRIORITY_MIN}..{PRIORITY_MAX} (as a PriorityClass value)"
PRIORITY_ONE_SOURCE = (
    "set priority or priorityClassName, not both (the PriorityClass gives the value); leave one out"
)
TOPOLOGIES: tuple[Topology, ...] = ("NVLink", "SameNUMA", "Any")
"""What a multi-card claim requires of its cards (docs/topology.md): NVLink (every card linked to every other,
one NVLink domain), SameNUMA (one NUMA node) or Any (nothing required; such sets are still preferred)."""
ISOLATIONS: tuple[Isolation, ...] = ("None", "MPS", "HAMiCore")
"""What enforces a slice's size in its containers (docs/isolation.md): None (advisory: the limits reach the
container as environment and the limits file, nothing stops it using more), MPS (NVIDIA's MPS with per-client
limits), HAMiCore (HAMi-core's libvgpu.so, preloaded)."""
ENFORCED_ISOLATIONS: tuple[Isolation, ...] = ("MPS", "HAMiCore")
"""The modes a node must provide (a card publishes them in `status.isolation`); None needs nothing."""
POLICIES: tuple[Policy, ...] = ("binpack", "spread", "fragmentation")
SHARINGS: tuple[Sharing, ...] = ("exclusive", "timeslice", "mps")
PARAMETER_KEYS = ("policy", "gpuModel", "nodeSelector", "sharing")
PROVISIONER = validation.NameRule("provisioner", validation.QUALIFIED_NAME_RULE, qualified=True)
# bindingMode has no schema default: with one, the server filled it in before the rules ran, and a
# class that said only the upstream egpuBindingMode: WaitForFirstConsumer reached them as Immediate +
# WaitForFirstConsumer, indistinguishable from a real disagreement (issue 15). Both fields are now
# optional; the rule compares them only when both are set, and `effective_binding_mode` is the one
# place that picks the mode (bindingMode, else egpuBindingMode, else Immediate).
BINDING_MODES_AGREE = (
    "must equal egpuBindingMode when both are set (two spellings of one field); set only one of them"
)
DEFAULT_BINDING_MODE: BindingMode = "Immediate"


def _in_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{value}'" for value in values) + "]"


class ClassParameters(KubeModel):
    """The parsed `parameters` of a class."""

    policy: Policy = "fragmentation"
    gpu_model: tuple[str, ...] = ()
    node_selector: dict[str, str] = Field(default_factory=dict)
    sharing: Sharing = "timeslice"


def parse_class_parameters(parameters: Mapping[str, str], *, class_name: str = "") -> ClassParameters:
    """Read a class's string parameters; unknown keys and bad values raise `InvalidClassParameters`."""
    where = f"ElasticGPUClass {class_name}: " if class_name else ""
    unknown = sorted(set(parameters) - set(PARAMETER_KEYS))
    if unknown:
        raise InvalidClassParameters(
            field=f"{where}parameters.{unknown[0]}",
            rule="is not a parameter elasticgpu knows",
            fix="use " + ", ".join(PARAMETER_KEYS),
        )
    policy = parameters.get("policy", "fragmentation")
    if policy not in POLICIES:
        raise InvalidClassParameters(
            field=f"{where}parameters.policy", rule="must be one of " + ", ".join(POLICIES), value=policy
        )
    sharing = parameters.get("sharing", "timeslice")
    if sharing not in SHARINGS:
        raise InvalidClassParameters(
            field=f"{where}parameters.sharing", rule="must be one of " + ", ".join(SHARINGS), value=sharing
        )
    models = tuple(glob.strip() for glob in parameters.get("gpuModel", "").split("|") if glob.strip())
    selector: dict[str, str] = {}
    for pair in (item.strip() for item in parameters.get("nodeSelector", "").split(",")):
        if not pair:
            continue
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidClassParameters(
                field=f"{where}parameters.nodeSelector",
                rule="must be k=v pairs separated by commas",
                value=parameters["nodeSelector"],
                fix="write it as zone=a,pool=gpu",
            )
        selector[key.strip()] = value.strip()
    return ClassParameters(policy=policy, gpu_model=models, node_selector=selector, sharing=sharing)


class SizeBound(KubeModel):
    """A size on one card that `resizePolicy: Auto` keeps a claim within (`minSize`, `maxSize`);
    a dimension left out is not bounded (beyond the card itself)."""

    cores: int | None = Field(default=None, description="Percent of one card's compute, 1..100.")
    memory: int | None = Field(default=None, description="MiB of the card's memory, at least 1.")


def _size_rules(field: str) -> list[dict[str, str]]:
    return [
        rule("!has(self.cores) || (self.cores >= 1 && self.cores <= 100)",
             f"{field}.cores: must be 1..100 (percent of one card)", reason="FieldValueInvalid"),
        rule("!has(self.memory) || self.memory >= 1", f"{field}.memory: must be at least 1 (MiB)",
             reason="FieldValueInvalid"),
    ]


SIZES_ORDERED = "must not be above maxSize in any dimension (cores, memory)"
AUTO_NEEDS_RESIZE = "Auto needs allowClaimResize: true (Auto resizes claims in place); set it, or use Recommend"
MARGIN_RANGE = "must be 0..100 (percent over the measured peak)"
# MIG (issue 26): a claim becomes a hardware partition of one card, so the class must provision
# slices, and its claims cannot grow or shrink in place (an instance has a fixed profile).
MIG_NEEDS_GPUSHARE = (
    f"MIG carves slices of one card: it needs provisioner {names.PROVISIONER_GPUSHARE}; for whole cards use a class"
    " without partitioning"
)
MIG_OR_ISOLATION = (
    "MIG instances are isolated by the hardware: partitioning and an isolation mode are one or the other; leave"
    " isolation out (or None), or leave partitioning out"
)
MIG_NO_RESIZE = (
    "MIG instances cannot resize in place (a profile is fixed when the instance is created); set allowClaimResize:"
    " false, or leave partitioning out"
)


class ElasticGPUClassStatus(KubeModel):
    """What the controller found wrong with the class, if anything."""

    conditions: list[Condition] = Field(default_factory=list, description="Valid, or not with the reason.")


class ElasticGPUClass(KubeModel):
    """A class of GPU capacity (cluster scoped); fields are top-level, as in a StorageClass."""

    crd_rules: ClassVar[list[dict[str, str]]] = [
        rule(
            "self.provisioner == oldSelf.provisioner",
            "provisioner: is immutable; create a new class instead",
            reason="FieldValueForbidden",
        ),
        cel.immutable("parameters", "", "create a new class instead"),
        rule(
            "!has(self.egpuBindingMode) || !has(self.bindingMode) || self.bindingMode == self.egpuBindingMode",
            f"bindingMode: {BINDING_MODES_AGREE}",
            reason="FieldValueInvalid",
        ),
        rule(
            "!has(self.resizePolicy) || self.resizePolicy != 'Auto'"
            " || (has(self.allowClaimResize) && self.allowClaimResize)",
            f"resizePolicy: {AUTO_NEEDS_RESIZE}",
            reason="FieldValueInvalid",
            field_path=".resizePolicy",
        ),
        cel.immutable("partitioning", "", "create a new class instead (claims already carved keep their instances)"),
        rule(
            f"!has(self.partitioning) || self.provisioner == '{names.PROVISIONER_GPUSHARE}'",
            f"partitioning: {MIG_NEEDS_GPUSHARE}",
            reason="FieldValueInvalid",
            field_path=".partitioning",
        ),
        rule(
            "!has(self.partitioning) || !has(self.isolation) || self.isolation == 'None'",
            f"isolation: {MIG_OR_ISOLATION}",
            reason="FieldValueInvalid",
            field_path=".isolation",
        ),
        rule(
            "!has(self.partitioning) || !has(self.allowClaimResize) || !self.allowClaimResize",
            f"allowClaimResize: {MIG_NO_RESIZE}",
            reason="FieldValueInvalid",
            field_path=".allowClaimResize",
        ),
        rule(
            "!has(self.priority) || !has(self.priorityClassName)",
            f"priorityClassName: {PRIORITY_ONE_SOURCE}",
            reason="FieldValueInvalid",
            field_path=".priorityClassName",
        ),
        rule(
            "!has(self.minSize) || !has(self.maxSize)"
            " || ((!has(self.minSize.cores) || !has(self.maxSize.cores) || self.minSize.cores <= self.maxSize.cores)"
            " && (!has(self.minSize.memory) || !has(self.maxSize.memory)"
            " || self.minSize.memory <= self.maxSize.memory))",
            f"minSize: {SIZES_ORDERED}",
            reason="FieldValueInvalid",
            field_path=".minSize",
        ),
    ]

    api_version: str = Field(default=names.API_VERSION, description="elasticgpu.io/v1alpha1")
    kind: str = Field(default=names.KIND_CLASS, description="ElasticGPUClass")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    provisioner: str = Field(
        min_length=1,
        json_schema_extra=PROVISIONER.crd(),
        description="Who provisions claims of this class: elasticgpu.io/gpushare (slices of a card),"
        " elasticgpu.io/physical (whole cards), or another name (then elasticgpu leaves the claims alone).",
    )
    parameters: dict[str, str] = Field(
        default_factory=dict,
        max_length=len(PARAMETER_KEYS),
        description="policy (binpack | spread | fragmentation), gpuModel (globs such as A100*|H100*),"
        " nodeSelector (k=v,k2=v2), sharing (exclusive | timeslice | mps).",
        json_schema_extra=crd_field(
            **{
                "x-kubernetes-validations": [
                    rule(
                        f"self.all(k, k in {_in_list(PARAMETER_KEYS)})",
                        "parameters: only " + ", ".join(PARAMETER_KEYS) + " are known",
                        reason="FieldValueInvalid",
                    ),
                    rule(
                        f"!('policy' in self) || self['policy'] in {_in_list(POLICIES)}",
                        "parameters.policy: must be one of " + ", ".join(POLICIES),
                        reason="FieldValueInvalid",
                    ),
                    rule(
                        f"!('sharing' in self) || self['sharing'] in {_in_list(SHARINGS)}",
                        "parameters.sharing: must be one of " + ", ".join(SHARINGS),
                        reason="FieldValueInvalid",
                    ),
                    rule(
                        "!('nodeSelector' in self) || self['nodeSelector'].matches("
                        "'^\\\\s*([^=,\\\\s]+\\\\s*=[^,]*)(,\\\\s*[^=,\\\\s]+\\\\s*=[^,]*)*$')",
                        "parameters.nodeSelector: must be k=v pairs separated by commas, e.g. zone=a,pool=gpu",
                        reason="FieldValueInvalid",
                    ),
                ]
            }
        ),
    )
    reclaim_policy: ReclaimPolicy = Field(
        default="Delete",
        description="Reclaim policy of provisioned ElasticGPUs: Delete (default) or Retain.",
        json_schema_extra=crd_field(**{SCHEMA_DEFAULT: True}),
    )
    binding_mode: BindingMode | None = Field(
        default=None,
        description="Immediate binds at once; WaitForFirstConsumer waits for a pod and its node."
        " Unset: egpuBindingMode, else Immediate.",
    )
    egpu_binding_mode: BindingMode | None = Field(
        default=None,
        alias="egpuBindingMode",
        description="Upstream elastic-gpu spelling of bindingMode; used when bindingMode is unset, must agree when both"
        " are set.",
    )
    allow_claim_resize: bool = Field(
        default=False,
        description="True: the requests of a Bound slice claim of this class may change (resized in place on its"
        " card, like StorageClass allowVolumeExpansion).",
    )
    allow_privileged: bool = Field(
        default=False,
        description="True: privileged containers may use the class's claims. A privileged container gets every"
        " device of its node, so it sees every card there, the cards of other claims included, not only its"
        " claim's: allow it only for classes whose claims serve trusted node-level workloads. False (default): the"
        " node agent refuses a privileged container that uses a claim of the class. Copied to the claim's"
        " status.allowPrivileged on bind, where the agent reads it (docs/isolation.md).",
    )
    bind_order: BindOrder = Field(
        default="FIFO",
        description="Order in which Pending claims of this class are bound when capacity frees: FIFO (oldest first,"
        " default) or FairShare (the namespace holding the least of the class first).",
    )
    resize_policy: ResizePolicy = Field(
        default="Recommend",
        description="What the controller does with the claims' measured use: Off (nothing), Recommend (default:"
        " write status.recommendation and an Event when a claim is over- or under-sized), Auto (also resize the"
        " claim's requests to the recommendation, within minSize..maxSize; needs allowClaimResize).",
    )
    recommendation_margin: int = Field(
        default=20,
        description="Percent over the measured peak that counts as right-sized (0..100): the recommendation is"
        " peak x (1 + margin), a request above recommendation x (1 + margin) is over-sized.",
        json_schema_extra=crd_field(**{"x-kubernetes-validations": [
            rule("self >= 0 && self <= 100", f"recommendationMargin: {MARGIN_RANGE}", reason="FieldValueInvalid"),
        ]}),
    )
    min_size: SizeBound | None = Field(
        default=None,
        description="The smallest size a recommendation (and an Auto resize) goes to: cores (percent), memory (MiB).",
        json_schema_extra=crd_field(**{"x-kubernetes-validations": _size_rules("minSize")}),
    )
    max_size: SizeBound | None = Field(
        default=None,
        description="The largest size a recommendation (and an Auto resize) goes to: cores (percent), memory (MiB).",
        json_schema_extra=crd_field(**{"x-kubernetes-validations": _size_rules("maxSize")}),
    )
    partitioning: Partitioning | None = Field(
        default=None,
        description="MIG: each claim gets a MIG instance of its own (hard isolation: its own compute, memory and"
        " cache slices), of the smallest profile of the card's model that covers its cores and memory (on an"
        " A100-80GB: 1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb); needs provisioner"
        " elasticgpu.io/gpushare and cards whose MIG mode the admin enabled. Unset: soft slices (sharing).",
    )
    # Issue 25: what the node agent does with a claim over its memory (policing.py); the controller
    # copies both into each Bound claim's status.policing, where the agent reads them.
    over_limit_action: policing.OverLimitAction = Field(
        default=policing.DEFAULT_OVER_LIMIT_ACTION, description=policing.ACTION_DESCRIPTION,
        json_schema_extra=crd_field(**{SCHEMA_DEFAULT: True}),
    )
    over_limit_grace_seconds: int = Field(
        default=policing.DEFAULT_OVER_LIMIT_GRACE_S, description=policing.GRACE_DESCRIPTION,
        json_schema_extra=crd_field(**{SCHEMA_DEFAULT: True,
                                       "x-kubernetes-validations": policing.grace_rules("overLimitGraceSeconds")}),
    )
    isolation: Isolation = Field(
        default="None",
        description="What enforces a slice's size in its containers: None (default; advisory, the container is told"
        " its size), MPS (an MPS daemon per card, per-client compute and memory limits) or HAMiCore (HAMi-core's"
        " libvgpu.so, installed by the admin on the node, preloaded). A slice binds only to a card whose agent"
        " publishes the mode in status.isolation; whole cards need none. Copied to the claim's status.isolation on"
        " bind (docs/isolation.md).",
        json_schema_extra=crd_field(**{SCHEMA_DEFAULT: True}),
    )
    topology: Topology = Field(
        default="Any",
        description="What a claim of several whole cards requires of them: NVLink (every card linked to every other"
        " by NVLink, one NVLink domain), SameNUMA (all on one NUMA node) or Any (default: nothing required, but"
        " NVLinked cards on one NUMA node are still preferred). A claim waits (Pending) until a node has such a"
        " set free (docs/topology.md).",
        json_schema_extra=crd_field(**{SCHEMA_DEFAULT: True}),
    )
    # Issue 27: priority and preemption (docs/preemption.md). A claim's priority is its class's: `priority`,
    # or the value of the PriorityClass named by `priorityClassName` (read by the controller), else 0.
    priority: int | None = Field(
        default=None,
        description="Priority of the class's claims (higher wins; default 0). When a claim cannot fit, the"
        " controller may preempt claims of lower priority to make room (preemptionPolicy). At most one billion,"
        " as a PriorityClass value; set this or priorityClassName, not both.",
        json_schema_extra=crd_field(**{"x-kubernetes-validations": [
            rule(f"self >= {PRIORITY_MIN} && self <= {PRIORITY_MAX}", f"priority: {PRIORITY_RANGE}",
                 reason="FieldValueInvalid"),
        ]}),
    )
    priority_class_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="A PriorityClass (scheduling.k8s.io/v1) whose value is the priority of the class's claims, as"
        " pods name one; its preemptionPolicy applies when this class sets none. Set this or priority, not both.",
    )
    preemption_policy: PreemptionPolicy | None = Field(
        default=None,
        description="PreemptLowerPriority: a claim of this class that cannot fit may preempt claims of lower"
        " priority on one card or node (their pods are evicted, they become Lost). Never: it waits instead."
        " Unset: the PriorityClass's policy, else PreemptLowerPriority.",
    )
    status: ElasticGPUClassStatus = Field(default_factory=ElasticGPUClassStatus)

    @property
    def over_limit_policy(self) -> policing.Policing:
        """The over-limit policy the controller copies into the status of the class's Bound claims."""
        return policing.Policing(over_limit_action=self.over_limit_action,
                                 over_limit_grace_seconds=self.over_limit_grace_seconds)

    @property
    def effective_binding_mode(self) -> BindingMode:
        """The binding mode: bindingMode, else the upstream egpuBindingMode, else Immediate. Every reader of
        the mode (binder, pod gate, plan) goes through here; where both are set they agree (see `check`)."""
        return self.binding_mode or self.egpu_binding_mode or DEFAULT_BINDING_MODE

    @property
    def is_mig(self) -> bool:
        """True when the class carves its claims as MIG instances (`partitioning: MIG`)."""
        return self.partitioning == "MIG"

    @property
    def preempts(self) -> bool | None:
        """Whether the class's claims may preempt: from its own preemptionPolicy; None when it sets none
        (then a PriorityClass's policy decides, else PreemptLowerPriority: `decisions.preemption`)."""
        return None if self.preemption_policy is None else self.preemption_policy == "PreemptLowerPriority"

    @property
    def effective_reclaim_policy(self) -> ReclaimPolicy:
        """Reclaim policy of ElasticGPUs provisioned for this class."""
        return self.reclaim_policy

    def check(self) -> None:
        """Refuse what the CRD refuses (the schema's types aside, which pydantic checks on load).
        Raises `InvalidSpec` naming the class, the field and the rule."""
        where = f"ElasticGPUClass {self.metadata.name}: " if self.metadata.name else ""
        try:
            PROVISIONER.check(self.provisioner)
            if None not in (self.binding_mode, self.egpu_binding_mode) and self.egpu_binding_mode != self.binding_mode:
                raise InvalidSpec(field="bindingMode", rule=BINDING_MODES_AGREE, value=self.binding_mode)
            if self.resize_policy == "Auto" and not self.allow_claim_resize:
                raise InvalidSpec(field="resizePolicy", rule=AUTO_NEEDS_RESIZE, value="Auto")
            if self.partitioning is not None and self.provisioner != names.PROVISIONER_GPUSHARE:
                raise InvalidSpec(field="partitioning", rule=MIG_NEEDS_GPUSHARE, value=self.partitioning)
            if self.partitioning is not None and self.isolation != "None":
                raise InvalidSpec(field="isolation", rule=MIG_OR_ISOLATION, value=self.isolation)
            if self.partitioning is not None and self.allow_claim_resize:
                raise InvalidSpec(field="allowClaimResize", rule=MIG_NO_RESIZE, value="true")
            if not 0 <= self.recommendation_margin <= 100:
                raise InvalidSpec(field="recommendationMargin", rule=MARGIN_RANGE,
                                  value=str(self.recommendation_margin))
            if self.priority is not None and not PRIORITY_MIN <= self.priority <= PRIORITY_MAX:
                raise InvalidSpec(field="priority", rule=PRIORITY_RANGE, value=str(self.priority))
            if self.priority is not None and self.priority_class_name is not None:
                raise InvalidSpec(field="priorityClassName", rule=PRIORITY_ONE_SOURCE, value=self.priority_class_name)
            if self.over_limit_grace_seconds < 0:
                raise InvalidSpec(field="overLimitGraceSeconds", rule=policing.GRACE_RANGE,
                                  value=str(self.over_limit_grace_seconds))
            self._check_sizes()
        except InvalidSpec as err:
            raise InvalidSpec(field=where + err.field, rule=err.rule, value=err.value, fix=err.fix) from None
        self.parsed_parameters()

    def _check_sizes(self) -> None:
        for field, bound in (("minSize", self.min_size), ("maxSize", self.max_size)):
            if bound is not None and bound.cores is not None and not 1 <= bound.cores <= 100:
                raise InvalidSpec(field=f"{field}.cores", rule="must be 1..100 (percent of one card)",
                                  value=str(bound.cores))
            if bound is not None and bound.memory is not None and bound.memory < 1:
                raise InvalidSpec(field=f"{field}.memory", rule="must be at least 1 (MiB)", value=str(bound.memory))
        low, high = self.min_size, self.max_size
        if low is not None and high is not None and (
                (None not in (low.cores, high.cores) and (low.cores or 0) > (high.cores or 0))
                or (None not in (low.memory, high.memory) and (low.memory or 0) > (high.memory or 0))):
            raise InvalidSpec(field="minSize", rule=SIZES_ORDERED)

    @property
    def is_default(self) -> bool:
        """True when annotated as the default class."""
        return self.metadata.annotations.get(names.ANNOTATION_DEFAULT_CLASS) == "true"

    def parsed_parameters(self) -> ClassParameters:
        """The parameters parsed; raises `InvalidClassParameters` naming the class and the key."""
        return parse_class_parameters(self.parameters, class_name=self.metadata.name or "")


def class_not_found_message(name: str, known: Mapping[str, object]) -> str:
    """The message of a claim whose class `name` does not exist (reason ClassNotFound), naming
    the classes that do (`known`: by name), so a typo shows next to what was meant. The
    controller writes it on the claim and `elasticgpu plan` prints it: the two say the same."""
    names_known = sorted(known)
    shown = ", ".join(names_known[:10]) + (f" and {len(names_known) - 10} more" if len(names_known) > 10 else "")
    there = f"the classes are {shown}" if names_known else "there is no ElasticGPUClass"
    return (f"spec.elasticGPUClassName: ElasticGPUClass {name} does not exist ({there});"
            " create it or name an existing class")
