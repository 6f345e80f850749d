"""Running holders: the claims a node's agent reports running on a card (pure, no I/O).

The agent publishes in each GPU object's `status.runningClaims` the claims whose containers run
on the card (its ledger's open rows). A reservation freed while its claim is listed there lets
the next claim be bound to a card that still serves the first: two claims, one card (issue 15).
So every path that frees a reservation because its claim is gone, its ElasticGPU Failed (a fatal
XID) or it has no ElasticGPU asks `holders_of` first and, while a holder runs, keeps the
reservation and says so on the ElasticGPU (condition `ReleasePending`, reason
`ClaimStillRunning`). The GPU object's next change (the agent's write when the containers stop)
wakes the ElasticGPUs on the card, and a delayed recheck covers an agent that went silent.

The entries are believed only while the agent can still report: a GPU whose Node is gone, or
whose heartbeat is older than `GPUHealthSettings.running_claims_expire_s`, has its entries
returned as `expired` (with why), and they keep nothing (`expired_reason`). A GPU that never had a
heartbeat (written by hand or another tool) is believed as it is, while its Node exists. An admin
who knows better sets the annotation `elasticgpu.io/force-release: "true"` on the ElasticGPU
(`kubectl egpu release --force`): its holders then keep nothing either.

A claim matches an entry by uid when both carry one (a new claim of the same name is another
claim), else by namespace and name; a reservation with no claim reference (an orphan) matches an
entry whose uid names it (`egpu-<claim uid>`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from elasticgpu.api import GPU, ElasticGPU, GPURunningClaim, ObjectReference, names
from elasticgpu.controller.decisions import gpu_health

CONDITION_RELEASE_PENDING = "ReleasePending"
REASON_CLAIM_STILL_RUNNING = "ClaimStillRunning"
REASON_NO_RUNNING_HOLDER = "NoRunningHolder"
REASON_REPORT_EXPIRED = "RunningClaimsExpired"
RECHECK_S = 30.0
"""Seconds after which an ElasticGPU kept for a running holder is looked at again even if no GPU event came
(the agent's write when the containers stop normally wakes it at once)."""


@dataclass(frozen=True)
class RunningHolder:
    """A claim the agent of `node` reports running on GPU `gpu`, with its pods."""

    gpu: str
    node: str
    claim: str
    """namespace/name."""
    pods: tuple[str, ...]
    expired: str = ""
    """Why the agent's report is no longer believed ("" while it is): its Node is gone, its heartbeat
    is too old, or an admin forced the release."""


def expired_reason(gpu: GPU, *, now: float, expire_after_s: float, node_gone_for_s: float | None) -> str:
    """Why the `status.runningClaims` of `gpu` are no longer believed at `now`, or "" while they are.

    `node_gone_for_s`: seconds its Node has been missing (None: it exists, or nobody can tell)."""
    node = gpu.spec.node_name
    if node_gone_for_s is not None:
        # OBSERVATION: the Node object is gone: nothing runs there any more, and nobody will report it.
        return f"node {node} no longer exists"
    beat = gpu_health.heartbeat_at(gpu)
    if beat is not None and now - beat > expire_after_s:
        # OBSERVATION: the agent has not written for longer than the expiry: its report is stale.
        return (f"the agent of node {node} has not reported for {int(now - beat)}s (its reports expire after"
                f" {expire_after_s:g}s)")
    return ""


def forced(egpu: ElasticGPU) -> bool:
    """True when an admin asked to free `egpu`'s reservation whatever its agent reports."""
    return (egpu.metadata.annotations or {}).get(names.ANNOTATION_FORCE_RELEASE, "").lower() == "true"


def running(holders: Iterable[RunningHolder]) -> list[RunningHolder]:
    """The holders still believed (their reports not expired)."""
    return [holder for holder in holders if not holder.expired]


def matches(entry: GPURunningClaim, *, claim_ref: ObjectReference | None, key: str) -> bool:
    """True when `entry` is the claim of `claim_ref` (by uid when both have one, else namespace/name),
    or, with no claim reference, the claim whose dynamic ElasticGPU is named `key`."""
    if claim_ref is not None and claim_ref.name:
        if entry.uid and claim_ref.uid:
            return entry.uid == claim_ref.uid
        return entry.namespace == (claim_ref.namespace or "") and entry.name == claim_ref.name
    return bool(entry.uid) and names.elastic_gpu_name_for_claim(entry.uid or "") == key


def holders_of(
    key: str, *, claim_ref: ObjectReference | None, gpu_names: Iterable[str], gpus: Callable[[str], GPU | None],
    expired: Callable[[GPU], str] = lambda _gpu: "",
) -> list[RunningHolder]:
    """The running holders of reservation `key` (made for `claim_ref`) on the cards `gpu_names`; those of a
    GPU for which `expired` gives a reason carry it (and keep nothing: `running`)."""
    found: list[RunningHolder] = []
    for gpu_name in sorted(set(gpu_names)):
        gpu = gpus(gpu_name)
        if gpu is None:
            continue
        why: str | None = None  # asked once per GPU, and only when an entry matches
        for entry in gpu.status.running_claims:
            if matches(entry, claim_ref=claim_ref, key=key):
                if why is None:
                    why = expired(gpu)
                found.append(RunningHolder(gpu=gpu_name, node=gpu.spec.node_name,
                                           claim=f"{entry.namespace}/{entry.name}", pods=tuple(sorted(entry.pods)),
                                           expired=why))
    return found


def describe(holders: Iterable[RunningHolder]) -> str:
    """`claim ns/c still runs on node n (GPU g: pods ns/p1, ns/p2)`, for conditions, Events and logs."""
    parts = []
    for holder in holders:
        pods = ", ".join(holder.pods) if holder.pods else "no pod named"
        parts.append(f"claim {holder.claim} still runs on node {holder.node} (GPU {holder.gpu}: pods {pods})")
    return "; ".join(parts)


def release_pending_condition(egpu: ElasticGPU, holders: list[RunningHolder], *, now: str,
                              expire_after_s: float) -> dict[str, str]:
    """The `ReleasePending` condition for `egpu` while `holders` run (lastTransitionTime kept while unchanged);
    `expire_after_s`: the heartbeat age after which the agent's report is no longer believed."""
    name = egpu.metadata.name or ""
    message = (f"{describe(holders)}, as its agent reports in the GPU's status.runningClaims: the reservation is"
               " kept until those containers stop, so no other claim gets the card meanwhile (or until the"
               f" agent's report expires: its node deleted, or no heartbeat for {expire_after_s:g}s). If those pods"
               f" are gone and the agent cannot say so, an admin frees it now: kubectl egpu release --force {name}")
    previous = next((c for c in egpu.status.conditions if c.type == CONDITION_RELEASE_PENDING), None)
    since = previous.last_transition_time if previous is not None and previous.status == "True" else None
    return {"type": CONDITION_RELEASE_PENDING, "status": "True", "reason": REASON_CLAIM_STILL_RUNNING,
            "message": message, "lastTransitionTime": since or now}
