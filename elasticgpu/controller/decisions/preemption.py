"""Preemption decisions (issue 27 item 2): a claim's priority, which Bound claims may be victims, the
plan a preemptor records, and what the victims are told. Pure: objects in, values out.

The protocol (carried out by `flow/preemption/preempting.py`; docs/preemption.md):

    1. plan      the preemptor (a claim that fits nowhere, of a class that may preempt) gets
                 `status.preemption`: where (node, card) and its victims (ElasticGPU, claim, uid), chosen
                 by `allocator.preemption` on one card or node. Written with the claim's
                 resourceVersion: with two controllers one plan wins, the other follows it. The plan
                 lives in status because only the controller writes there: a tenant may write its
                 claim's annotations, and a plan read from one would let it preempt anybody (issue 33).
                 A plan is checked again every time it is followed (`stale_reason`).
    2. mark      each victim claim gets `status.preemptedBy: <ns>/<preemptor>` (its
                 resourceVersion guarding it: a victim another preemptor marked first is not
                 taken twice: this plan is dropped and made again) and a Warning Event
                 PreemptedBy; the condition Preempted (reason PreemptedBy) comes with its Lost
                 status (`lost_condition`), or at once while a PodDisruptionBudget holds its pods.
    3. evict     the pods that use a victim are evicted through the Eviction API (a
                 PodDisruptionBudget that allows no disruption answers 429: retried later,
                 never bypassed).
    4. fail      once none of its pods is left running (evicted or gone), the victim's ElasticGPU
                 becomes Failed with reason Preempted: the claim becomes Lost, and the ElasticGPU
                 sync frees the reservation once the node's agent no longer reports the claim
                 running on the card (`running_holders`), as for any failed ElasticGPU.
    5. bind      the preemptor's ordinary sync places it once the room is free, charging its quota
                 as any bind (a quota that would refuse it stops step 1 from happening at all);
                 `status.preemption` goes once it is Bound.

Crash cases: after 1, the next sync (this controller or another) reads the plan and goes on from
step 2; every step is idempotent (a marked victim is not marked again, an evicted pod is gone or
terminating, a Failed ElasticGPU stays Failed). A plan whose victims are all gone while the claim
still fits nowhere (the room was taken by another claim meanwhile) is dropped and made again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from elasticgpu.allocator.preemption import Candidate
from elasticgpu.api import ElasticGPU, ElasticGPUClaim, ElasticGPUClass, timestamps
from elasticgpu.controller.decisions import provisioned_names

FORMER_ANNOTATIONS = ("elasticgpu.io/preempting", "elasticgpu.io/preempted-by")
"""Where plans and marks lived before issue 33. A tenant may write a claim's annotations, so these are never
read: docs/security.md lists them as having no effect."""
CONDITION_PREEMPTED = "Preempted"
REASON_PREEMPTED_BY = "PreemptedBy"
"""The victim's condition reason and Warning Event."""
REASON_PREEMPTING = "Preempting"
"""The preemptor's Pending reason while its victims go."""
REASON_PREEMPTED = "Preempted"
"""The reason of a victim ElasticGPU's Failed phase (its claim's Lost message says it)."""
REASON_EVICTION_BLOCKED = "EvictionBlocked"
"""A Warning Event on the preemptor: a PodDisruptionBudget refuses a victim's eviction for now."""
DEFAULT_PREEMPTS = True
"""A class and PriorityClass that say nothing: PreemptLowerPriority, as a pod's default."""


@dataclass(frozen=True)
class PriorityClassValue:
    """What a PriorityClass gives: its value and whether its preemptionPolicy is PreemptLowerPriority."""

    value: int
    preempts: bool


@dataclass(frozen=True)
class ClaimPriority:
    """A claim's priority and whether it may preempt; `note` says why not when a PriorityClass is missing."""

    value: int
    preempts: bool
    note: str = ""


def priority_of(klass: ElasticGPUClass | None,
                lookup: Callable[[str], PriorityClassValue | None]) -> ClaimPriority:
    """The priority of the claims of `klass` (None: no class of ours, priority 0): its `priority`, or the value
    of the PriorityClass its `priorityClassName` names (`lookup`), else 0. They may preempt unless the class
    (or, when the class says nothing, the PriorityClass) says Never. A PriorityClass that does not exist gives
    priority 0 and no preemption, with a note for the claim's message."""
    if klass is None:
        return ClaimPriority(0, DEFAULT_PREEMPTS)
    own = klass.preempts
    if klass.priority_class_name:
        found = lookup(klass.priority_class_name)
        if found is None:
            return ClaimPriority(0, False, f"class {klass.metadata.name} names PriorityClass"
                                 f" {klass.priority_class_name}, which does not exist: priority 0, no preemption;"
                                 " create it (kubectl get priorityclass) or fix priorityClassName")
        return ClaimPriority(found.value, found.preempts if own is None else own)
    return ClaimPriority(klass.priority or 0, DEFAULT_PREEMPTS if own is None else own)


@dataclass(frozen=True)
class Victim:
    """One victim of a plan: its reservation (ElasticGPU name) and its claim (with uid)."""

    elastic_gpu: str
    namespace: str
    name: str
    uid: str

    @property
    def claim(self) -> str:
        """`namespace/name`."""
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Plan:
    """A preemptor's plan as `status.preemption` holds it: the node (and card, for a slice) and the victims."""

    node: str
    card: str
    where: str
    victims: list[Victim]


def plan_status(victims: list[Victim], *, node: str, card: str, where: str) -> dict[str, Any]:
    """The preemptor's `status.preemption` for `victims` on `node` (and `card`, for a slice)."""
    return {"node": node, "card": card, "on": where,
            "victims": [{"elasticGPU": v.elastic_gpu, "claim": v.claim, "uid": v.uid} for v in victims]}


def plan_of(claim: ElasticGPUClaim) -> Plan | None:
    """The plan the claim's status holds, or None. Only the controller writes status, so what is read here is a
    plan the controller made; it is still checked again before it is followed (`stale_reason`)."""
    written = claim.status.preemption
    if written is None:
        return None
    victims = []
    for entry in written.victims:
        namespace, _, name = entry.claim.partition("/")
        victims.append(Victim(elastic_gpu=entry.elastic_gpu, namespace=namespace, name=name, uid=entry.uid))
    return Plan(node=written.node, card=written.card, where=written.on or f"node {written.node}", victims=victims)


def preempted_by(claim: ElasticGPUClaim) -> str:
    """`namespace/name` of the claim preempting `claim` (its `status.preemptedBy`, the controller's mark), or ""."""
    return claim.status.preempted_by or ""


def candidate_of(egpu: ElasticGPU, claim: ElasticGPUClaim | None, priority: int, *,
                 marked: bool | None = None) -> Candidate | None:
    """`egpu`'s reservation as a candidate victim of `priority`, or None when it may not be one: its claim
    must be Bound to it, not being deleted, and not already preempted by another claim; and it must have been
    provisioned for that claim (an admin's static ElasticGPU is never failed to make room: it is a PV's analog,
    which the admin made for a purpose). `marked`: whether its `preempted-by` mark still stands (its preemptor
    exists and plans it); None: any mark stands."""
    ref = egpu.spec.claim_ref
    # The ElasticGPU's own Bound status is written after its claim's (binder step 3 first): a claim the user
    # sees Bound may still have an ElasticGPU with no phase, and it is a victim like any other.
    if claim is None or ref is None or not ref.name or egpu.status.phase in ("Failed", "Released"):
        return None
    if egpu.metadata.deletion_timestamp or claim.spec.elastic_gpu_name != egpu.metadata.name:
        return None
    if not provisioned_names.is_provisioned_for(egpu.metadata.name or "", claim):
        return None
    if ref.uid and ref.uid != claim.metadata.uid:
        return None
    if claim.status.phase != "Bound" or claim.metadata.deletion_timestamp:
        return None
    if preempted_by(claim) and marked is not False:
        return None
    created = timestamps.parse(claim.metadata.creation_timestamp)
    return Candidate(key=egpu.metadata.name or "", priority=priority,
                     created=created.timestamp() if created is not None else 0.0)


def stale_reason(mine: ClaimPriority, class_name: str, victims: Iterable[tuple[Victim, int]]) -> str:
    """Why a plan may no longer be followed ("" when it may): the preemptor's class no longer may preempt, or a
    victim still to go is no longer of lower priority (its class changed since the plan was made).
    `victims`: each victim not failed yet, with its priority now."""
    if not mine.preempts:
        return mine.note or f"class {class_name} may not preempt (preemptionPolicy Never)"
    for victim, value in victims:
        if value >= mine.value:
            return f"claim {victim.claim} is no longer of lower priority ({value}; this claim {mine.value})"
    return ""


def preemptor_name(claim: ElasticGPUClaim) -> str:
    """`namespace/name` of a claim."""
    return f"{claim.metadata.namespace}/{claim.metadata.name}"


def victim_message(preemptor: str, priority: int, victim_priority: int, where: str) -> str:
    """What a victim is told (its Preempted condition and PreemptedBy Event)."""
    return (f"preempted by claim {preemptor} (priority {priority} > {victim_priority}) to make room on {where}:"
            " the pods that use this claim are evicted, then its ElasticGPU fails (reason Preempted) and the claim"
            " becomes Lost; delete it and create it again to wait for room (docs/preemption.md)")


def preempted_condition(message: str, *, now: str) -> dict[str, Any]:
    """The victim's `Preempted` condition."""
    return {"type": CONDITION_PREEMPTED, "status": "True", "reason": REASON_PREEMPTED_BY, "message": message,
            "lastTransitionTime": now}


def lost_condition(claim: ElasticGPUClaim, *, now: str) -> dict[str, Any] | None:
    """The `Preempted` condition a preempted claim gets with its Lost status (one write, where the claim's
    status is written anyway, not one more in the preemption's path), or None: not preempted, or said already."""
    by = preempted_by(claim)
    if not by or any(c.type == CONDITION_PREEMPTED for c in claim.status.conditions):
        return None
    return preempted_condition(f"preempted by claim {by}: the pods that used this claim were evicted and its"
                               " ElasticGPU failed (reason Preempted); delete it and create it again to wait for"
                               " room (docs/preemption.md)", now=now)


def lost_conditions(claim: ElasticGPUClaim, *, now: str) -> list[dict[str, Any]]:
    """The `Preempted` condition to write with a claim's Lost status: the one it has, or, for a claim marked
    preempted, a new one (the claim's Lost write asks this, so binding need not know preemption's flow)."""
    kept = [c.to_dict() for c in claim.status.conditions if c.type == CONDITION_PREEMPTED]
    new = lost_condition(claim, now=now)
    return kept + ([new] if new is not None else [])


def waiting_message(victims: list[Victim], where: str, *, blocked: str = "") -> str:
    """The preemptor's Pending message while its victims go."""
    names = ", ".join(v.claim for v in victims)
    message = (f"preempting claim(s) {names} on {where}: waiting for their pods to be evicted and the node's agent to"
               " report them gone, then this claim binds there")
    if blocked:
        message += f"; {blocked}"
    return message
