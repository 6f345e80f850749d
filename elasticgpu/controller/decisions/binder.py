"""Binding decisions: pure functions from (object, picture) to the one step to take next.

# The state machine

Like a PVC and a PV, a claim and an ElasticGPU point at each other: `claim.spec.elasticGPUName`
<-> `egpu.spec.claimRef` (with the claim's uid, which tells a recreated claim from the old one).
A claim is Bound only when both pointers agree and `claim.status.phase` says so.

Binding always writes in this order, and every write is idempotent:

    1. reserve   GPU.status.allocations += {elasticGPU: <name>, claimRef, cores, memory}
                 (PUT with the GPU's resourceVersion: the commit point; a 409 means re-read
                 that GPU, back off a few jittered ms, re-plan). Dynamic ElasticGPUs are named
                 `egpu-<claim-uid>`, so a retry finds its own reservation instead of making a
                 second one. Claims that provision a slice of one card are planned in a batch
                 and each card gets one PUT with all of its new reservations: a 409 commits
                 none of that card's claims, which are re-planned. A static ElasticGPU was
                 reserved while Available (no claim); binding it rewrites its allocations with
                 the claim's claimRef (uid included).
    2. egpu      dynamic: create `egpu-<claim-uid>` with claimRef (pre-bound); its status Bound
                 is written after step 3 (the claim is what the user waits for);
                 static: set claimRef (with the ElasticGPU's resourceVersion), then status Bound.
    3. claim     set spec.elasticGPUName and the protection finalizer, then status Bound with
                 capacity, nodeName, gpus and the Bound condition; one Event.

Steps 2 and 3 run on a worker pool (`BindingSettings.workers`) while the binder thread plans the
next claims; until a worker is done, syncs of that claim and its ElasticGPU wait. Events are
written by a background thread (dropped, never blocking, when the server lags).

# Crash cases (what the next sync finds, and does)

- after 1, before 2: a reservation with no ElasticGPU. The claim is still unbound, so its sync
  provisions again: the allocator's picture already holds `egpu-<uid>` and the same placement is
  reused (no second reservation). If the claim is gone, resync frees the orphan after a grace.
- during 2 (created, status not written): the ElasticGPU has claimRef but no phase; its sync
  sees the reservation in place and marks it Bound; the claim's sync finds the ElasticGPU through
  its claimRef (`prebound`) and completes the bind.
- after 2, before 3: ElasticGPU Bound to the claim, claim unbound: `CompleteBind`.
- during 3 (spec written, status not): claim names the ElasticGPU which points back: `CompleteBind`.
- dynamic, after 3, before the ElasticGPU's status: claim Bound, ElasticGPU with no phase: the
  claim's sync `CompleteBind`s (marks it Bound); so does the ElasticGPU's own sync (`Reserve`
  finds the reservation held and writes Bound).
- a static ElasticGPU whose claimRef was set for a claim that then vanished: its sync confirms
  the claim is gone with a live read and releases it (never on the cache alone: with two
  controllers, one may see the ElasticGPU before the claim).

# Bound claims

- ElasticGPU missing, Failed, or pointing to another claim: the claim becomes Lost (it never goes
  back to Pending by itself: the workload using it must learn that its GPU is gone).
- otherwise: nothing to do (status already says Bound) or rewrite the status (`CompleteBind`).

# HA

Two controllers may decide the same claim at once. The reservation's resourceVersion
precondition (and the GPU CRD's CEL rules) make oversubscription impossible; names derived from
uids make duplicate ElasticGPUs impossible; a static bind is a PATCH with the ElasticGPU's
resourceVersion, so one claim wins and the other re-plans.

- Both reserved the same `egpu-<uid>` on different cards: the create decides; the loser's
  reservation is on a card the ElasticGPU's spec does not name and is freed (by the loser's
  AlreadyExists path, or by whichever controller syncs the ElasticGPU first), never taken as a
  reason to fail the ElasticGPU.
- Every claim write carries the claim's resourceVersion; a 409 re-reads the claim before the
  (jittered) retry, so a claim the other controller bound meanwhile is seen Bound and left
  alone (`InSync`) instead of being retried against a stale picture forever.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from elasticgpu.allocator import CardShare, Placement
from elasticgpu.api import (
    GPU,
    ClassParameters,
    ElasticGPU,
    ElasticGPUClaim,
    ElasticGPUClass,
    GpuRequest,
    InvalidClassParameters,
    InvalidRequest,
    LabelSelector,
    gpu_class,
    names,
    parse_count,
    parse_memory_mib,
)
from elasticgpu.api.claim import WHOLE_CARD
from elasticgpu.api.errors import InvalidSpec
from elasticgpu.controller.decisions import gpu_health, provisioned_names

# Reasons of claim conditions and Events (one CamelCase word a program can match).
REASON_BOUND = "Bound"
REASON_NO_CAPACITY = "NoCapacity"
REASON_CLASS_NOT_FOUND = "ClassNotFound"
REASON_INVALID_REQUEST = "InvalidRequest"
REASON_INVALID_CLASS = "InvalidClassParameters"
REASON_EGPU_NOT_FOUND = "ElasticGPUNotFound"
REASON_EGPU_NOT_AVAILABLE = "ElasticGPUNotAvailable"
REASON_EGPU_TOO_SMALL = "ElasticGPUTooSmall"
REASON_EGPU_BOUND_ELSEWHERE = "ElasticGPUBoundElsewhere"
REASON_EGPU_FAILED = "ElasticGPUFailed"
REASON_CLASS_MISMATCH = "ClassMismatch"
REASON_NO_MATCH = "NoMatchingElasticGPU"
REASON_WAIT_FOR_CONSUMER = "WaitingForFirstConsumer"


# -- decisions --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ignore:
    """Not ours (another provisioner's class): write nothing."""

    why: str


@dataclass(frozen=True)
class Wait:
    """Stay Pending with this reason and message; nothing else changes. Retried on changes."""

    reason: str
    message: str


@dataclass(frozen=True)
class BindToExisting:
    """Static bind: point the Available ElasticGPU at the claim, then bind the claim."""

    elastic_gpu: str


@dataclass(frozen=True)
class CompleteBind:
    """The ElasticGPU already points at the claim: finish steps 2 and 3."""

    elastic_gpu: str


@dataclass(frozen=True)
class Provision:
    """Dynamic provisioning with a class of ours."""

    class_name: str
    provisioner: str
    request: GpuRequest
    parameters: ClassParameters
    reclaim_policy: str
    isolation: str = "None"
    """The class's isolation mode (MPS, HAMiCore, None)."""
    topology: str = "Any"
    """The class's topology requirement for several whole cards (NVLink, SameNUMA, Any)."""

    @property
    def required_isolation(self) -> str:
        """The mode the card must provide: the class's for a slice, none for whole cards (nobody shares them)."""
        return "" if self.request.is_whole or self.isolation == "None" else self.isolation


def resize_note(isolation: str | None) -> str:
    """What a resize means for the running processes of a claim under `isolation` ("" when nothing to say):
    MPS and HAMi-core read a process's limits when it starts (docs/resize-node.md)."""
    if isolation not in ("MPS", "HAMiCore"):
        return ""
    return (f"under {isolation} a new size applies to processes started after the resize (with the environment"
            " of /run/elasticgpu/limits.env); processes already running keep the limits they started with")


def claim_isolation(klass: ElasticGPUClass | None, *, whole: bool) -> str:
    """The claim's `status.isolation` on bind: WholeCard for whole cards (nobody shares them), else its
    class's mode (None without a class of ours)."""
    if whole:
        return WHOLE_CARD
    return klass.isolation if klass is not None else "None"


@dataclass(frozen=True)
class InSync:
    """Bound, and everything agrees: nothing to write."""

    elastic_gpu: str


@dataclass(frozen=True)
class MarkLost:
    """A Bound claim lost its ElasticGPU."""

    reason: str
    message: str


@dataclass(frozen=True)
class Deleting:
    """The claim is being deleted: the release path decides (`release.py`)."""


ClaimDecision = Ignore | Wait | BindToExisting | CompleteBind | Provision | InSync | MarkLost | Deleting


# -- the picture the decisions read -------------------------------------------------------------


@dataclass(frozen=True)
class Picture:
    """What the binder reads: ElasticGPUs, classes, and each card's memory (MiB) by GPU name."""

    elastic_gpus: Mapping[str, ElasticGPU]
    classes: Mapping[str, ElasticGPUClass]
    card_memory: Callable[[str], int | None]
    by_claim_uid: Mapping[str, str]
    """ElasticGPU name by the uid in its claimRef."""
    unclaimed_available: Mapping[str, ElasticGPU] | None = None
    """The Available ElasticGPUs with no claimRef: the only candidates of a static bind. None:
    scan `elastic_gpus` (every decision does its own filtering either way; the index only
    keeps an unnamed claim's decision from costing a pass over every bound ElasticGPU)."""

    def default_class(self) -> ElasticGPUClass | None:
        """The class annotated default; the newest one when several are (as kube-apiserver does)."""
        defaults = [c for c in self.classes.values() if c.is_default]
        if not defaults:
            return None
        return max(defaults, key=lambda c: (c.metadata.creation_timestamp or "", c.metadata.name or ""))


def index_by_claim_uid(elastic_gpus: Iterable[ElasticGPU]) -> dict[str, str]:
    """ElasticGPU names keyed by the uid of the claim each points to."""
    return {
        e.spec.claim_ref.uid: e.metadata.name or ""
        for e in elastic_gpus
        if e.spec.claim_ref is not None and e.spec.claim_ref.uid
    }


# -- what an ElasticGPU offers ------------------------------------------------------------------


@dataclass(frozen=True)
class Offer:
    """What an ElasticGPU gives: `cards` whole cards (their memories), or a share of one card."""

    cards: int
    cores: int
    memory_mib: int
    card_memories: tuple[int, ...] = ()


def offer_of(egpu: ElasticGPU, card_memory: Callable[[str], int | None]) -> Offer:
    """What `egpu` offers, from its source and capacity. Raises `InvalidSpec` naming the field."""
    where = f"ElasticGPU {egpu.metadata.name}: "
    if egpu.spec.physical_gpu is not None:
        memories = tuple(card_memory(n) or 0 for n in egpu.spec.physical_gpu.gpu_names)
        return Offer(cards=len(memories), cores=names.CORES_PER_CARD * len(memories), memory_mib=sum(memories),
                     card_memories=memories)
    if egpu.spec.gpu_share is None:
        raise InvalidSpec(field=f"{where}spec", rule="needs spec.physicalGPU or spec.gpuShare")
    capacity = egpu.spec.capacity
    cores = 0
    if names.RESOURCE_CORE in capacity:
        cores = parse_count(capacity[names.RESOURCE_CORE], field=f"{where}spec.capacity[{names.RESOURCE_CORE}]")
    if cores > names.CORES_PER_CARD:
        raise InvalidSpec(
            field=f"{where}spec.capacity[{names.RESOURCE_CORE}]",
            rule="a share of one card (spec.gpuShare) has at most 100 cores",
            value=cores,
            fix="use spec.physicalGPU for whole cards",
        )
    total = card_memory(egpu.spec.gpu_share.gpu_name) or 0
    if names.RESOURCE_MEMORY in capacity:
        memory = parse_memory_mib(
            capacity[names.RESOURCE_MEMORY], field=f"{where}spec.capacity[{names.RESOURCE_MEMORY}]"
        )
    else:
        memory = total * cores // names.CORES_PER_CARD
    return Offer(cards=0, cores=cores, memory_mib=memory, card_memories=(total,))


def shortfall(request: GpuRequest, offer: Offer) -> str:
    """Why `offer` cannot serve `request`, or "" when it can."""
    if request.is_whole:
        if offer.cards < request.cards:
            return f"it offers {offer.cards or 'no'} whole card(s), the claim asks for {request.cards}"
        if request.memory_mib and min(offer.card_memories, default=0) < request.memory_mib:
            return f"its cards have less than the {request.memory_mib} MiB each the claim asks for"
        return ""
    if offer.cards:
        return ""  # a whole card serves any share of one card
    if offer.cores < request.cores:
        return f"it offers {offer.cores}% cores, the claim asks for {request.cores}%"
    card = offer.card_memories[0] if offer.card_memories else 0
    wanted = request.memory_on(card) if card else (request.memory_mib or 0)
    if offer.memory_mib < wanted:
        return f"it offers {offer.memory_mib} MiB, the claim needs {wanted} MiB"
    return ""


def selector_matches(selector: LabelSelector | None, labels: Mapping[str, str]) -> bool:
    """True when `labels` satisfy the label selector (an absent selector matches everything)."""
    if selector is None:
        return True
    if any(labels.get(k) != v for k, v in selector.match_labels.items()):
        return False
    for expression in selector.match_expressions:
        present = expression.key in labels
        value = labels.get(expression.key)
        if expression.operator == "In" and value not in expression.values:
            return False
        if expression.operator == "NotIn" and present and value in expression.values:
            return False
        if expression.operator == "Exists" and not present:
            return False
        if expression.operator == "DoesNotExist" and present:
            return False
    return True


def points_to(egpu: ElasticGPU, claim: ElasticGPUClaim) -> bool:
    """True when the ElasticGPU's claimRef names this claim (and this incarnation, by uid)."""
    ref = egpu.spec.claim_ref
    if ref is None or not ref.name:
        return False
    if ref.name != claim.metadata.name or ref.namespace != claim.metadata.namespace:
        return False
    return not ref.uid or ref.uid == claim.metadata.uid


def is_bound(claim: ElasticGPUClaim) -> bool:
    """True when the claim's status says Bound."""
    return claim.status.phase == "Bound"


# -- the decision -----------------------------------------------------------------------------


def decide_claim(claim: ElasticGPUClaim, picture: Picture) -> ClaimDecision:
    """The next step for a claim. Pure: reads the claim and the picture, changes nothing."""
    if claim.metadata.deletion_timestamp:
        return Deleting()
    name = claim.spec.elastic_gpu_name
    if name and name not in picture.elastic_gpus and not is_bound(claim) and claim.status.phase != "Lost" \
            and provisioned_names.prenamed(claim) == name:
        # OBSERVATION: an inline claim, made with the name of the ElasticGPU to provision for it:
        # provisioned like an unnamed claim, under that name, never bound to an admin's.
        return _decide_unnamed(claim, picture, static=False)
    if name:
        return _decide_named(claim, name, picture)
    return _decide_unnamed(claim, picture)


def _decide_named(claim: ElasticGPUClaim, name: str, picture: Picture) -> ClaimDecision:
    egpu = picture.elastic_gpus.get(name)
    if egpu is None:
        if is_bound(claim) or claim.status.phase == "Lost":
            # OBSERVATION: claim is Bound, its ElasticGPU is gone.
            return MarkLost(REASON_EGPU_NOT_FOUND, f"ElasticGPU {name} bound to this claim no longer exists;"
                            " delete the claim and create a new one")
        # OBSERVATION: claim names an ElasticGPU that does not exist (yet).
        return Wait(REASON_EGPU_NOT_FOUND, f"spec.elasticGPUName: ElasticGPU {name} does not exist;"
                    " create it, or delete the claim and create one without spec.elasticGPUName")
    if points_to(egpu, claim):
        if egpu.status.phase == "Failed":
            # OBSERVATION: the claim's ElasticGPU failed (its card disappeared or broke).
            message = f"ElasticGPU {name} failed: {egpu.status.message or egpu.status.reason or 'no reason given'}"
            if is_bound(claim) or claim.status.phase == "Lost":
                return MarkLost(REASON_EGPU_FAILED, message)
            return Wait(REASON_EGPU_FAILED, message)
        if egpu.status.phase in (None, "Pending") and not is_bound(claim):
            # OBSERVATION: pre-bound ElasticGPU whose capacity is not reserved yet.
            return Wait(REASON_EGPU_NOT_AVAILABLE, f"ElasticGPU {name} is {egpu.status.phase or 'new'}:"
                        " its capacity is not reserved yet")
        if is_bound(claim) and egpu.status.phase == "Bound" and claim.status.conditions:
            # OBSERVATION: claim Bound, ElasticGPU Bound to it: nothing to do.
            return InSync(name)
        # OBSERVATION: both pointers agree, a status is missing (crash between steps).
        return CompleteBind(name)
    if egpu.spec.claim_ref is not None and egpu.spec.claim_ref.name:
        ref = egpu.spec.claim_ref
        message = f"ElasticGPU {name} is bound to claim {ref.namespace}/{ref.name}"
        if is_bound(claim) or claim.status.phase == "Lost":
            return MarkLost(REASON_EGPU_BOUND_ELSEWHERE, f"{message}; delete this claim and create a new one")
        return Wait(REASON_EGPU_BOUND_ELSEWHERE, f"spec.elasticGPUName: {message}; name another ElasticGPU")
    # OBSERVATION: the named ElasticGPU is unbound.
    if egpu.status.phase != "Available":
        return Wait(REASON_EGPU_NOT_AVAILABLE, f"spec.elasticGPUName: ElasticGPU {name} is"
                    f" {egpu.status.phase or 'new'}, not Available"
                    + (f" ({egpu.status.message})" if egpu.status.message else ""))
    try:
        request, _limit = claim.spec.gpu_request()
    except InvalidRequest as err:
        return Wait(REASON_INVALID_REQUEST, str(err))
    try:
        why = shortfall(request, offer_of(egpu, picture.card_memory))
    except InvalidSpec as err:
        return Wait(REASON_EGPU_NOT_AVAILABLE, str(err))
    if why:
        return Wait(REASON_EGPU_TOO_SMALL, f"spec.elasticGPUName: ElasticGPU {name} is too small: {why}")
    wanted_class = claim.spec.class_name
    if wanted_class and egpu.spec.elastic_gpu_class_name != wanted_class:
        return Wait(REASON_CLASS_MISMATCH, f"spec.elasticGPUClassName: ElasticGPU {name} has class"
                    f" {egpu.spec.elastic_gpu_class_name or '(none)'}, the claim asks for {wanted_class}")
    return BindToExisting(name)


def _decide_unnamed(claim: ElasticGPUClaim, picture: Picture, *, static: bool = True) -> ClaimDecision:
    """`static`: whether an Available ElasticGPU an admin made may serve it (not for a claim that
    names the ElasticGPU to provision: its name is set once)."""
    uid = claim.metadata.uid or ""
    prebound = picture.by_claim_uid.get(uid)
    if prebound is not None and prebound in picture.elastic_gpus:
        # OBSERVATION: an ElasticGPU points to the claim (provisioned before a crash, or an
        # admin pre-bound it): finish that bind rather than choose another.
        return _decide_named(claim, prebound, picture)
    try:
        request, _limit = claim.spec.gpu_request()
    except InvalidRequest as err:
        return Wait(REASON_INVALID_REQUEST, str(err))
    class_name = claim.spec.class_name
    klass: ElasticGPUClass | None
    if class_name:
        klass = picture.classes.get(class_name)
        if klass is None:
            return Wait(REASON_CLASS_NOT_FOUND, gpu_class.class_not_found_message(class_name, picture.classes))
    else:
        klass = picture.default_class()
    if klass is not None and klass.provisioner not in names.OWN_PROVISIONERS:
        return Ignore(f"class {klass.metadata.name} belongs to provisioner {klass.provisioner}")
    if klass is not None and klass.effective_binding_mode == "WaitForFirstConsumer":
        # OBSERVATION: the class delays binding (static and dynamic, as for a PVC) until a pod
        # uses the claim, so the pod's node can be chosen first.
        return Wait(REASON_WAIT_FOR_CONSUMER, f"waiting for a pod that uses this claim: class {klass.metadata.name}"
                    " has bindingMode WaitForFirstConsumer, so the claim binds once a pod names it in an"
                    f" {names.ANNOTATION_CLAIM_PREFIX}<container> annotation")
    effective = klass.metadata.name if klass is not None else None
    match = _best_static(claim, request, effective, picture) if static else None
    if match is not None:
        return BindToExisting(match)
    if claim.spec.selector is not None:
        # As for PVCs: a claim with a selector binds only to existing ElasticGPUs.
        return Wait(REASON_NO_MATCH, "spec.selector: no Available ElasticGPU with these labels is large enough;"
                    " create one, or remove the selector to have one provisioned")
    if klass is None:
        return Wait(REASON_CLASS_NOT_FOUND, "spec.elasticGPUClassName is empty and no ElasticGPUClass is annotated"
                    f" {names.ANNOTATION_DEFAULT_CLASS}=true; name a class or mark one default")
    try:
        parameters = klass.parsed_parameters()
    except InvalidClassParameters as err:
        return Wait(REASON_INVALID_CLASS, f"{err}; fix the class (an admin's job) or use another")
    if klass.provisioner == names.PROVISIONER_PHYSICAL and not request.is_whole:
        return Wait(REASON_INVALID_REQUEST, f"spec.resources: class {klass.metadata.name} provisions whole cards"
                    f" ({names.PROVISIONER_PHYSICAL}); ask for {names.RESOURCE_NVIDIA_GPU} or a multiple of 100"
                    f" {names.RESOURCE_CORE}, or use a {names.PROVISIONER_GPUSHARE} class")
    if klass.provisioner == names.PROVISIONER_GPUSHARE and request.cards > 1:
        return Wait(REASON_INVALID_REQUEST, f"spec.resources: class {klass.metadata.name} provisions slices of one"
                    f" card ({names.PROVISIONER_GPUSHARE}); use a {names.PROVISIONER_PHYSICAL} class for"
                    f" {request.cards} whole cards")
    return Provision(
        class_name=klass.metadata.name or "",
        provisioner=klass.provisioner,
        request=request,
        parameters=parameters,
        reclaim_policy=klass.effective_reclaim_policy,
        isolation=klass.isolation,
        topology=klass.topology,
    )


def is_free_static(egpu: ElasticGPU, class_name: str | None) -> bool:
    """True when `egpu` is Available, not being deleted, bound to no claim and of class `class_name`:
    one a claim of that class may bind before one is provisioned."""
    return (egpu.status.phase == "Available" and not egpu.metadata.deletion_timestamp
            and not (egpu.spec.claim_ref is not None and egpu.spec.claim_ref.name)
            and (egpu.spec.elastic_gpu_class_name or None) == class_name)


def _best_static(claim: ElasticGPUClaim, request: GpuRequest, class_name: str | None, picture: Picture) -> str | None:
    """The smallest Available, unbound ElasticGPU of the claim's class that matches and fits."""
    best: tuple[tuple[int, int, int, str], str] | None = None
    candidates = picture.elastic_gpus if picture.unclaimed_available is None else picture.unclaimed_available
    for name, egpu in candidates.items():
        if not is_free_static(egpu, class_name):
            continue
        if not selector_matches(claim.spec.selector, egpu.metadata.labels):
            continue
        try:
            offer = offer_of(egpu, picture.card_memory)
        except InvalidSpec:
            continue
        if shortfall(request, offer):
            continue
        key = (offer.cards, offer.cores, offer.memory_mib, name)
        if best is None or key < best[0]:
            best = (key, name)
    return best[1] if best else None


# -- the ElasticGPU side ------------------------------------------------------------------------

REASON_AVAILABLE = "Available"
REASON_DOES_NOT_FIT = "DoesNotFit"
REASON_GPU_NOT_FOUND = "GPUNotFound"
REASON_INVALID_SPEC = "InvalidSpec"
REASON_RELEASED = "Released"
REASON_IN_USE = "ElasticGPUInUse"


@dataclass(frozen=True)
class Reserve:
    """Reserve the ElasticGPU's capacity on its card(s) (idempotent), then set its phase:
    Bound when its claim already points back, else Available."""

    placement: Placement


@dataclass(frozen=True)
class Fail:
    """The ElasticGPU cannot be served: phase Failed with the reason; its claim becomes Lost."""

    reason: str
    message: str


@dataclass(frozen=True)
class MarkBound:
    """The ElasticGPU's claim points back: phase Bound."""


@dataclass(frozen=True)
class ReleaseIfClaimGone:
    """The claimRef names a claim the picture does not hold: confirm with a live read, then Released."""


@dataclass(frozen=True)
class Reclaim:
    """Released with reclaim policy Delete, or being deleted and not in use: free the capacity,
    drop the finalizer; `delete` when the object must also be deleted."""

    delete: bool


@dataclass(frozen=True)
class StayPending:
    """Not served yet, and not for good: phase Pending with this reason (a static ElasticGPU whose
    GPU has not been published yet waits for it, as a PV waits for its disk)."""

    reason: str
    message: str


@dataclass(frozen=True)
class Keep:
    """Nothing to do (or only to wait: `why` says for what)."""

    why: str = ""


ElasticGPUDecision = Reserve | Fail | StayPending | MarkBound | ReleaseIfClaimGone | Reclaim | Keep


def cards_of(egpu: ElasticGPU) -> list[str]:
    """The GPU object names an ElasticGPU's spec names, in its order: `physicalGPU.gpuNames`
    (whole cards) or `gpuShare.gpuName` (a slice; the CRD allows exactly one of the two);
    empty when it names none."""
    if egpu.spec.physical_gpu is not None:
        return list(egpu.spec.physical_gpu.gpu_names)
    if egpu.spec.gpu_share is not None:
        return [egpu.spec.gpu_share.gpu_name]
    return []


def placement_of(egpu: ElasticGPU, gpus: Callable[[str], GPU | None]) -> Placement | Fail:
    """The placement an ElasticGPU's spec describes, or why it cannot have one."""
    name = egpu.metadata.name
    if egpu.spec.physical_gpu is None and egpu.spec.gpu_share is None:
        # the CRD's rule forbids this; kept for objects from an older schema
        return Fail(REASON_INVALID_SPEC, f"ElasticGPU {name}: spec needs spec.physicalGPU or spec.gpuShare")
    gpu_names = cards_of(egpu)
    models: list[GPU] = []
    for gpu_name in gpu_names:
        model = gpus(gpu_name)
        if model is None:
            return Fail(REASON_GPU_NOT_FOUND, f"ElasticGPU {name}: GPU {gpu_name} does not exist (or was removed);"
                        " name an existing GPU (kubectl get pgpu)")
        models.append(model)
    nodes = sorted({m.spec.node_name for m in models})
    if len(nodes) > 1:
        return Fail(REASON_INVALID_SPEC, f"ElasticGPU {name}: spec.physicalGPU.gpuNames are on several nodes"
                    f" ({', '.join(nodes)}); all cards of one ElasticGPU must be on one node")
    if egpu.spec.physical_gpu is not None:
        shares = tuple(
            CardShare(uuid=m.spec.uuid, cores=names.CORES_PER_CARD, memory_mib=m.spec.memory, whole=True)
            for m in models
        )
        return Placement(node=nodes[0], cards=shares)
    try:
        offer = offer_of(egpu, lambda n: models[0].spec.memory if n == gpu_names[0] else None)
    except InvalidSpec as err:
        return Fail(REASON_INVALID_SPEC, str(err))
    if offer.memory_mib > models[0].spec.memory:
        return Fail(REASON_DOES_NOT_FIT, f"ElasticGPU {name}: spec.capacity[{names.RESOURCE_MEMORY}] is"
                    f" {offer.memory_mib} MiB, GPU {gpu_names[0]} has {models[0].spec.memory} MiB")
    return Placement(node=nodes[0], cards=(CardShare(uuid=models[0].spec.uuid, cores=offer.cores,
                                                     memory_mib=offer.memory_mib),))


def decide_elastic_gpu(
    egpu: ElasticGPU,
    *,
    claim: ElasticGPUClaim | None,
    gpus: Callable[[str], GPU | None],
    held: Placement | None,
    conflict: Callable[[Placement], str],
) -> ElasticGPUDecision:
    """The next step for an ElasticGPU. `claim` is the claim its claimRef names, as the picture
    holds it (None when absent or unbound); `held` is what the GPUs hold for it."""
    phase = egpu.status.phase
    ref = egpu.spec.claim_ref
    claim_here = claim is not None and points_to(egpu, claim) and not claim.metadata.deletion_timestamp
    if egpu.metadata.deletion_timestamp:
        if claim_here and claim is not None and claim.spec.elastic_gpu_name == egpu.metadata.name:
            # OBSERVATION: deleting an ElasticGPU its claim still uses: keep it until the claim goes.
            return Keep(f"{REASON_IN_USE}: bound to claim {ref.namespace}/{ref.name}" if ref else REASON_IN_USE)
        return Reclaim(delete=False)
    if phase == "Failed":
        if ref is not None and ref.name and ref.uid and not claim_here:
            # OBSERVATION: failed, and the claim it was made for is not in the picture (deleted
            # while Lost, or before the ElasticGPU's create landed): once a live read confirms it
            # is gone, it is Released and its reclaim policy applies, as for a Bound one; kept
            # Failed for ever, it outlived its claim (and its reservation, when it still held one).
            return ReleaseIfClaimGone()
        return Keep("Failed")
    if phase == "Released":
        if (egpu.spec.reclaim_policy or "Retain") == "Delete":
            return Reclaim(delete=True)
        return Keep("Retain")
    failure = gpu_health.failed_card(cards_of(egpu), gpus)
    if failure is not None:
        # OBSERVATION: a card of this ElasticGPU failed for good (a fatal XID, or it vanished):
        # the ElasticGPU fails with the card's reason, and its claim becomes Lost with it.
        return Fail(failure.reason, f"ElasticGPU {egpu.metadata.name}: {failure.message}; its work cannot"
                    " continue on this card: delete the claim and create a new one")
    placement = placement_of(egpu, gpus)
    if isinstance(placement, Fail):
        if placement.reason == REASON_GPU_NOT_FOUND and phase in (None, "Pending") and held is None:
            # OBSERVATION: never reserved, and its GPU is not published (yet): `kubectl apply -f`
            # of a directory creates it before the GPU, or the node's agent has not started. Wait
            # for the GPU (its watch event wakes this ElasticGPU); once served, a vanished GPU fails it.
            missing = [n for n in cards_of(egpu) if gpus(n) is None]
            return StayPending(REASON_GPU_NOT_FOUND, f"ElasticGPU {egpu.metadata.name}: waiting for GPU"
                               f" {', '.join(missing)} to appear (kubectl get pgpu); it becomes Available when"
                               " the node's agent publishes it, or fix spec to name an existing GPU")
        return placement
    if phase in (None, "Pending"):
        if held is None:
            why = conflict(placement)
            if why:
                return Fail(REASON_DOES_NOT_FIT, f"ElasticGPU {egpu.metadata.name} does not fit: {why};"
                            " free capacity on that card or name another GPU")
        elif held != placement:
            return Fail(REASON_DOES_NOT_FIT, f"ElasticGPU {egpu.metadata.name}: the GPUs hold {held.describe()}"
                        f" for it, its spec says {placement.describe()}")
        return Reserve(placement)
    if held is None:
        # OBSERVATION: Available or Bound, but its reservation is gone (freed by hand or lost):
        # take it again, or fail when something else took the room meanwhile.
        why = conflict(placement)
        if why:
            return Fail(REASON_DOES_NOT_FIT, f"ElasticGPU {egpu.metadata.name} lost its reservation and no"
                        f" longer fits: {why}")
        return Reserve(placement)
    if ref is not None and ref.name:
        if claim_here and claim is not None and claim.spec.elastic_gpu_name == egpu.metadata.name:
            return Keep() if phase == "Bound" else MarkBound()
        # OBSERVATION: the claimRef names a claim the picture does not hold (or another
        # incarnation, or one being deleted). A claimRef with a uid was written by a bind, so its
        # claim existed: if a live read confirms it is gone, release. An admin's pre-bind (no
        # uid) waits for its claim to be created, as a pre-bound PV does.
        if phase == "Bound" or ref.uid:
            return ReleaseIfClaimGone()
        return Keep("waiting for the claim to point back")
    return Keep() if phase == "Available" else Reserve(placement)
