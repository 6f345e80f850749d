"""The gate of a pod that uses claims: pure decisions, no I/O.

The admission webhook gives every pod that uses claims the scheduling gate
`elasticgpu.io/claims`; the scheduler leaves such a pod alone until the gate is gone. The pod
sync (`pod_sync`) asks `decide_gate` what to do next, from the pod and the state of each of its
claims, and carries the step out:

    claims missing / being deleted / Lost / Pending   -> Wait (condition ClaimsReady=False)
    a claim serves another live pod                    -> Wait ClaimInUse
    a claim does not list the pod in status.users      -> ReserveUsers (claim status, with the
                                                          claim's resourceVersion: one pod wins)
    claims Bound on different nodes                    -> Wait FailedClaimPlacement (Warning)
    an Immediate claim not Bound yet                   -> Wait (its own sync binds it; its node counts)
    claims waiting for their first consumer            -> Place (pod_placement picks one node)
    every claim Bound, all on one node                 -> Lift

`lift_patch` is the one update that lifts the gate: a required node affinity for that node,
ANDed into each of the pod's own node selector terms (kube-apiserver lets a gated pod's
affinity only be added to: each term may gain requirements, no term may be added), and the
gate removed, guarded by the pod's resourceVersion. Every step is idempotent: after a crash or
a lost race the next sync decides again from what it finds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from elasticgpu.api import ElasticGPUClaim, names

Body = dict[str, Any]

CONDITION_CLAIMS_READY = "elasticgpu.io/ClaimsReady"
"""The pod condition that tells `kubectl describe pod` why the pod is still gated."""
REASON_READY = "ClaimsBound"
REASON_FAILED_PLACEMENT = "FailedClaimPlacement"
REASON_CLAIM_IN_USE = "ClaimInUse"
REASON_CLAIM_NOT_FOUND = "ClaimNotFound"
REASON_CLAIM_PENDING = "ClaimPending"
REASON_CLAIM_LOST = "ClaimLost"
REASON_CLAIM_DELETING = "ClaimDeleting"
REASON_INVALID_ANNOTATIONS = "InvalidClaimAnnotations"
REASON_INLINE_CLAIM_TAKEN = "InlineClaimNameTaken"
NODE_FIELD = "metadata.name"
"""The node field a required term names the chosen node with (as the DaemonSet controller does)."""
_AFFINITY = "requiredDuringSchedulingIgnoredDuringExecution"


@dataclass(frozen=True)
class ClaimView:
    """One claim of the pod, as the pod sync sees it."""

    name: str
    claim: ElasticGPUClaim | None
    """None: the picture holds no such claim."""
    inline: bool = False
    """Made by the controller for this pod (an inline request); its bind lists the pod as user."""
    waits_for_consumer: bool = False
    """Unbound, and its class binds WaitForFirstConsumer: this pod is its first consumer."""
    other_user: str = ""
    """Another pod, not terminated, that `status.users` lists."""


@dataclass(frozen=True)
class Wait:
    """Stay gated. `quiet`: a passing state (an inline claim being made or bound) that is not
    written as a condition; else ClaimsReady=False with `reason`, and an Event when `warning`."""

    reason: str
    message: str
    warning: bool = False
    quiet: bool = False


@dataclass(frozen=True)
class ReserveUsers:
    """Write the pod into `status.users` of these claims (each with its resourceVersion)."""

    claims: tuple[str, ...]


@dataclass(frozen=True)
class Place:
    """Bind these WaitForFirstConsumer claims on one node, all or none; `node` when claims
    already Bound fix it."""

    claims: tuple[str, ...]
    node: str | None


@dataclass(frozen=True)
class Lift:
    """Every claim is Bound on `node`: add the node affinity and remove the gate."""

    node: str


@dataclass(frozen=True)
class NotGated:
    """The pod has no gate of ours (already lifted, or it never had one): nothing to do."""


GateDecision = Wait | ReserveUsers | Place | Lift | NotGated


def is_gated(pod: Mapping[str, Any]) -> bool:
    """True while the pod carries our scheduling gate."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(g.get("name") == names.SCHEDULING_GATE for g in gates)


def is_terminated(pod: Mapping[str, Any]) -> bool:
    """True when the pod will never run again (phase Succeeded or Failed)."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def lists_user(claim: ElasticGPUClaim, pod_name: str, pod_uid: str) -> bool:
    """True when the claim's `status.users` is exactly this pod."""
    users = claim.status.users
    return len(users) == 1 and users[0].name == pod_name and (not users[0].uid or users[0].uid == pod_uid)


def decide_gate(pod: Mapping[str, Any], views: Sequence[ClaimView]) -> GateDecision:
    """The next step for a pod and its claims (`views`, one per claim name). Pure."""
    if not is_gated(pod) or is_terminated(pod) or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return NotGated()
    meta = pod.get("metadata") or {}
    pod_name, pod_uid = str(meta.get("name", "")), str(meta.get("uid", ""))
    for view in views:
        claim = view.claim
        if claim is None:
            if view.inline:
                # OBSERVATION: the inline claim was just made (or is being made); its watch event wakes us.
                return Wait(REASON_CLAIM_PENDING, f"claim {view.name} is being created", quiet=True)
            return Wait(REASON_CLAIM_NOT_FOUND, f"claim {view.name} does not exist in namespace"
                        f" {meta.get('namespace', '')}; create it or fix the pod's annotation", warning=True)
        if claim.metadata.deletion_timestamp:
            return Wait(REASON_CLAIM_DELETING, f"claim {view.name} is being deleted; name another claim",
                        warning=True)
        if view.other_user:
            return Wait(REASON_CLAIM_IN_USE, f"claim {view.name} is in use by pod {view.other_user}; a claim"
                        " serves one pod at a time: wait for that pod to end, or use another claim", warning=True)
        if claim.status.phase == "Lost":
            return Wait(REASON_CLAIM_LOST, f"claim {view.name} is Lost: {_claim_message(claim)}", warning=True)
    unlisted = tuple(v.name for v in views if v.claim is not None and not lists_user(v.claim, pod_name, pod_uid)
                     and not (v.inline and v.claim.status.phase != "Bound"))
    if unlisted:
        # OBSERVATION: claims not yet reserved for this pod: take them before binding or lifting.
        return ReserveUsers(unlisted)
    bound = {v.name: v.claim.status.node_name or "" for v in views
             if v.claim is not None and v.claim.status.phase == "Bound"}
    nodes = sorted(set(bound.values()))
    if len(nodes) > 1:
        where = ", ".join(f"{name} on {node}" for name, node in sorted(bound.items()))
        return Wait(REASON_FAILED_PLACEMENT, f"the pod's claims are bound to different nodes ({where}); a pod runs"
                    " on one node: use claims of one node, or WaitForFirstConsumer classes", warning=True)
    for view in views:
        claim = view.claim
        assert claim is not None
        if claim.status.phase != "Bound" and not view.waits_for_consumer:
            # OBSERVATION: an Immediate claim not bound yet: its own sync binds it (quiet while it has no say).
            said = _claim_message(claim)
            return Wait(REASON_CLAIM_PENDING, f"claim {view.name} is not bound yet: {said}",
                        quiet=claim.status.phase is None or not claim.status.conditions)
    # Only now: an Immediate claim still binding would fix the node the waiting ones must share.
    waiting = tuple(v.name for v in views if v.waits_for_consumer and v.claim is not None
                    and v.claim.status.phase != "Bound")
    if waiting:
        return Place(waiting, nodes[0] if nodes else None)
    if not nodes or not nodes[0]:
        return Wait(REASON_CLAIM_PENDING, "the pod's claims are Bound but name no node yet", quiet=True)
    return Lift(nodes[0])


def _claim_message(claim: ElasticGPUClaim) -> str:
    for condition in claim.status.conditions:
        if condition.message:
            return f"{condition.reason}: {condition.message}" if condition.reason else condition.message
    return claim.status.phase or "no status yet"


# -- the gate lift ------------------------------------------------------------------------------


def node_requirement(node: str) -> Body:
    """The requirement that pins a pod to `node`."""
    return {"key": NODE_FIELD, "operator": "In", "values": [node]}


def required_terms(pod: Mapping[str, Any]) -> list[Body]:
    """The pod's required node selector terms (empty when it has none)."""
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    return list((affinity.get(_AFFINITY) or {}).get("nodeSelectorTerms") or [])


def lift_patch(pod: Mapping[str, Any], node: str) -> Body:
    """The merge patch that lifts our gate: `node`'s requirement ANDed into each required term
    (one term of it alone when the pod has none), the gate removed (others kept), guarded by the
    pod's resourceVersion. A term that already pins the node is left as it is."""
    requirement = node_requirement(node)
    terms = required_terms(pod)
    if not terms:
        terms = [{"matchFields": [requirement]}]
    else:
        # Appended after the term's own requirements: a gated pod's terms may only grow.
        terms = [term if requirement in (term.get("matchFields") or [])
                 else {**term, "matchFields": [*(term.get("matchFields") or []), requirement]} for term in terms]
    gates = [g for g in (pod.get("spec") or {}).get("schedulingGates") or [] if g.get("name") != names.SCHEDULING_GATE]
    return {
        "metadata": {"resourceVersion": (pod.get("metadata") or {}).get("resourceVersion")},
        "spec": {
            "schedulingGates": gates or None,
            "affinity": {"nodeAffinity": {_AFFINITY: {"nodeSelectorTerms": terms}}},
        },
    }


def pinned_node(pod: Mapping[str, Any]) -> str | None:
    """The node a pod runs on or was pinned to by a gate lift (our requirement in its first
    required term), else the node chosen for its claims (annotation); None when neither."""
    node = (pod.get("spec") or {}).get("nodeName")
    if node:
        return str(node)
    for term in required_terms(pod)[:1]:
        for requirement in term.get("matchFields") or []:
            if requirement.get("key") == NODE_FIELD and requirement.get("operator") == "In" \
                    and len(requirement.get("values") or []) == 1:
                return str(requirement["values"][0])
    selected = ((pod.get("metadata") or {}).get("annotations") or {}).get(names.ANNOTATION_SELECTED_NODE)
    return str(selected) if selected else None


def condition_of(pod: Mapping[str, Any]) -> Body | None:
    """The pod's ClaimsReady condition, or None."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == CONDITION_CLAIMS_READY:
            return dict(condition)
    return None
