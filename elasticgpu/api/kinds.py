"""The four kinds: names, scope, printer columns and model of each, in one table."""

from __future__ import annotations

from dataclasses import dataclass

from elasticgpu.api import names
from elasticgpu.api.claim import ElasticGPUClaim
from elasticgpu.api.elastic_gpu import ElasticGPU
from elasticgpu.api.gpu import GPU
from elasticgpu.api.gpu_class import ElasticGPUClass
from elasticgpu.api.quota import ElasticGPUQuota
from elasticgpu.api.schema import KubeModel

_CORE_KEY = names.RESOURCE_CORE.replace(".", "\\.")
_MEMORY_KEY = names.RESOURCE_MEMORY.replace(".", "\\.")


@dataclass(frozen=True)
class PrinterColumn:
    """One column of `kubectl get`."""

    name: str
    type: str
    json_path: str
    description: str
    priority: int = 0  # 0: always shown; 1: only with `kubectl get -o wide`


@dataclass(frozen=True)
class KindInfo:
    """Everything the CRD of one kind needs besides the schema, which comes from `model`."""

    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]
    namespaced: bool
    model: type[KubeModel]
    columns: tuple[PrinterColumn, ...]
    crd_file: str
    selectable_fields: tuple[str, ...] = ()
    """JSON paths a list or watch may select on with a fieldSelector (the CRD's `selectableFields`,
    beta in Kubernetes 1.31, GA in 1.32; a server without them answers 400 "field label not supported")."""

    @property
    def crd_name(self) -> str:
        """`<plural>.<group>`, the CRD's own name."""
        return f"{self.plural}.{names.GROUP}"


def _age() -> PrinterColumn:
    return PrinterColumn("Age", "date", ".metadata.creationTimestamp", "Time since creation.")


def _core(path: str) -> PrinterColumn:
    return PrinterColumn("Core", "integer", f"{path}.{_CORE_KEY}", "Percent of one card's compute (100 per card).")


def _memory(path: str) -> PrinterColumn:
    return PrinterColumn("Memory", "string", f"{path}.{_MEMORY_KEY}", "GPU memory.")


CLAIM = KindInfo(
    kind=names.KIND_CLAIM,
    plural=names.PLURAL_CLAIM,
    singular="elasticgpuclaim",
    short_names=("egpuc",),
    namespaced=True,
    model=ElasticGPUClaim,
    columns=(
        PrinterColumn("Status", "string", ".status.phase", "Pending, Bound or Lost."),
        PrinterColumn("EGPU", "string", ".spec.elasticGPUName", "The bound ElasticGPU."),
        _core(".status.capacity"),
        _memory(".status.capacity"),
        PrinterColumn("Node", "string", ".status.nodeName", "Node of the bound card(s)."),
        # The controller writes the class it used (the default one included) here on bind.
        PrinterColumn("Class", "string", ".spec.elasticGPUClassName", "Class of the claim."),
        PrinterColumn("Reason", "string", ".status.reason", "Why it is in this phase."),
        _age(),
        # -o wide: what the measured use recommends (docs/recommendations.md).
        PrinterColumn("Sizing", "string", ".status.recommendation.state",
                      "RightSized, OverSized or UnderSized against the measured peak.", priority=1),
        PrinterColumn("Rec-Core", "integer", ".status.recommendation.cores",
                      "Recommended percent of one card's compute.", priority=1),
        PrinterColumn("Rec-Memory", "integer", ".status.recommendation.memory", "Recommended MiB of GPU memory.",
                      priority=1),
        PrinterColumn("Isolation", "string", ".status.isolation",
                      "What enforces the claim's size: None (advisory), MPS, HAMiCore or WholeCard.", priority=1),
        # -o wide: what the node agent does when the claim uses more memory than it reserved (docs/policing.md).
        PrinterColumn("Over-Limit", "string", ".status.policing.overLimitAction",
                      "Warn or StopContainer: the class's overLimitAction, copied on bind; blank: Warn.", priority=1),
        PrinterColumn("Profile", "string", ".status.partition.profile",
                      "The MIG profile of the claim's instance (partitioning: MIG).", priority=1),
    ),
    crd_file="elasticgpuclaim.yaml",
    # A fresh controller lists only the claims that wait (`status.phase!=Bound`) before it binds:
    # at 50,000 claims the full list is ~25 s of start -> first bind (flow/machinery/waiting_claims.py).
    selectable_fields=(".status.phase",),
)
ELASTIC_GPU = KindInfo(
    kind=names.KIND_ELASTIC_GPU,
    plural=names.PLURAL_ELASTIC_GPU,
    singular="elasticgpu",
    short_names=("egpu",),
    namespaced=False,
    model=ElasticGPU,
    columns=(
        PrinterColumn("Node", "string", ".status.nodeName", "Node of the card(s)."),
        PrinterColumn("GPUs", "string", ".status.gpuList", "Uuids of the card(s)."),
        _core(".status.capacity"),
        _memory(".status.capacity"),
        PrinterColumn("Status", "string", ".status.phase", "Pending, Available, Bound, Released or Failed."),
        PrinterColumn("Claim", "string", ".status.claim", "The claim of spec.claimRef, as namespace/name."),
        PrinterColumn("Class", "string", ".spec.elasticGPUClassName", "Class of the ElasticGPU."),
        PrinterColumn("Reason", "string", ".status.reason", "Why it is in this phase."),
        _age(),
    ),
    crd_file="elasticgpu.yaml",
)
CLASS = KindInfo(
    kind=names.KIND_CLASS,
    plural=names.PLURAL_CLASS,
    singular="elasticgpuclass",
    short_names=("egpuclass",),
    namespaced=False,
    model=ElasticGPUClass,
    columns=(
        PrinterColumn("Provisioner", "string", ".provisioner", "Who provisions claims of this class."),
        # Two columns: a JSONPath column cannot coalesce bindingMode and its upstream spelling, and
        # neither field has a schema default any more (issue 15). Both blank means Immediate.
        PrinterColumn(
            "BindingMode", "string", ".bindingMode",
            "Immediate or WaitForFirstConsumer; blank: EgpuBindingMode applies.",
        ),
        PrinterColumn(
            "EgpuBindingMode", "string", ".egpuBindingMode", "Upstream spelling, used when BindingMode is blank;"
            " both blank: Immediate."
        ),
        PrinterColumn("Reclaim", "string", ".reclaimPolicy", "Delete or Retain."),
        PrinterColumn("Isolation", "string", ".isolation", "What enforces a slice's size: None (advisory), MPS or"
                      " HAMiCore."),
        _age(),
        PrinterColumn("Over-Limit", "string", ".overLimitAction",
                      "Warn or StopContainer: what the node agent does with a claim over its memory.", priority=1),
        PrinterColumn("Grace", "integer", ".overLimitGraceSeconds",
                      "Seconds over the limit before StopContainer acts.", priority=1),
    ),
    crd_file="egpuclass.yaml",
)
GPU_KIND = KindInfo(
    kind=names.KIND_GPU,
    plural=names.PLURAL_GPU,
    singular="gpu",
    short_names=("pgpu",),
    namespaced=False,
    model=GPU,
    columns=(
        PrinterColumn("Node", "string", ".spec.nodeName", "Node that holds the card."),
        PrinterColumn("Model", "string", ".spec.model", "Product name."),
        PrinterColumn("Memory", "string", f".status.capacity.{_MEMORY_KEY}", "Total memory of the card."),
        PrinterColumn(
            "Allocatable", "string", ".status.allocatableSummary", "Free cores (percent) and memory, e.g. 70%/40Gi."
        ),
        PrinterColumn("Health", "string", ".status.health", "Healthy, Unhealthy or Unknown."),
        # Who allocates the card (docs/dra.md): the effective owner, and the desired one beside it, so a move
        # under way shows as two different words; the OwnerMove condition says what it waits for.
        PrinterColumn("Owner", "string", ".status.owner", "ElasticGPU or DRA: who allocates the card now."),
        PrinterColumn("Desired", "string", ".spec.owner", "The owner the platform team set; differs during a move."),
        _age(),
    ),
    crd_file="gpu.yaml",
)
QUOTA = KindInfo(
    kind=names.KIND_QUOTA,
    plural=names.PLURAL_QUOTA,
    singular="elasticgpuquota",
    short_names=("egpuquota",),
    namespaced=True,
    model=ElasticGPUQuota,
    columns=(
        # used/hard as text the controller writes: a JSONPath column cannot join two fields.
        PrinterColumn("Cores", "string", ".status.summary.cores", "Cores used/hard (percent, 100 per card)."),
        PrinterColumn("Memory", "string", ".status.summary.memory", "GPU memory used/hard."),
        PrinterColumn("Cards", "string", ".status.summary.cards", "Whole cards used/hard."),
        _age(),
    ),
    crd_file="egpuquota.yaml",
)
KINDS: tuple[KindInfo, ...] = (GPU_KIND, ELASTIC_GPU, CLAIM, CLASS, QUOTA)
