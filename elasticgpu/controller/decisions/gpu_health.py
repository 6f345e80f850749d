"""Pure decisions about a GPU's health as the controller reads it: is the card ready for new
reservations, must its Ready condition be written, has it failed for good.

The node agent owns the conditions `Heartbeat` (its `lastTransitionTime` is the beat, renewed
every 30 s), `Healthy` (True: `NoFatalXid`, `Recovered`; False: `Xid<code>`, `Vanished`) and
`ApplicationXid`, and mirrors `Healthy` into `status.health`. The controller owns one
condition, `Ready`:

- a GPU whose last heartbeat is older than the grace period has lost its agent: it is not
  ready (`Ready=False`, reason `HeartbeatExpired`). The allocator places nothing new on it;
  reservations it holds are kept (the card may well still run them; only its agent is silent);
- a GPU that never had a heartbeat (written by hand or by another tool) is taken as it is;
- a GPU with the condition `DuplicateUUID` (True) set by an admin is not ready either (`Ready=False`,
  reason `DuplicateUUID`): two nodes have the card's uuid, and which really has it only an admin
  can tell; nothing new is placed there until the condition is gone (the reservations it holds are
  kept, as for an expired heartbeat). When it goes, `Ready=True` (`DuplicateUUIDResolved`). A
  condition another node's agent wrote (reason `SeenOnAnotherNode`, or a message `node <other>: ...`
  naming a node that is not the GPU's), as the node-scope policy allowed before issue 44, sets
  nothing aside: one node's token could write it on every node's cards. The agent now reports a
  duplicate on its own Node (a Warning Event) and writes nothing on another node's object;
- a GPU whose heartbeat is fresh again gets `Ready=True` (`HeartbeatRenewed`) only when it
  had been marked not ready: a GPU never marked carries no `Ready` condition, so a healthy
  cluster costs no writes.

An Unhealthy card (`status.health`) is kept from new reservations by the allocator itself
(`CardRecord.from_gpu`). A *fatal* failure, `Healthy=False` with reason `Vanished` or
`Xid<code>` for an XID that needs a reset (`elasticgpu.api.xids`: 48, 79, 95, 119, unknown
ones, ...), also fails the card's ElasticGPUs (`fatal_failure`, read by `binder`). A transient
XID (94) only keeps new reservations away until the card recovers on its own: the work already
on the card goes on.

The heartbeat carries the agent's clock and is compared with the controller's, as a Lease's
renewTime is: node clocks must agree (NTP) within a small part of the grace; a node whose
clock runs behind by more than the grace has its cards set aside (and says so in `Ready`).

Nothing here does I/O or reads the clock: `now` is a parameter.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from elasticgpu.api import GPU, timestamps, xids

HEARTBEAT = "Heartbeat"
HEALTHY = "Healthy"
READY = "Ready"
"""The controller's own condition on a GPU (the agent keeps it as it is)."""
REASON_HEARTBEAT_EXPIRED = "HeartbeatExpired"
REASON_HEARTBEAT_RENEWED = "HeartbeatRenewed"
DUPLICATE_UUID = "DuplicateUUID"
"""The condition (an admin's mark) and the `Ready` reason of a card two nodes report."""
REASON_DUPLICATE_RESOLVED = "DuplicateUUIDResolved"
REASON_SEEN_ON_ANOTHER_NODE = "SeenOnAnotherNode"
"""The reason another node's agent gave its `DuplicateUUID` report (before issue 44): ignored."""
REASON_VANISHED = "Vanished"
XID_PREFIX = "Xid"

Body = dict[str, Any]


@dataclass(frozen=True)
class Readiness:
    """Whether a GPU takes new reservations now and, when that depends on time, in how many
    seconds the answer may change (`recheck_in_s`; None: only an event can change it)."""

    ready: bool
    reason: str = ""
    message: str = ""
    recheck_in_s: float | None = None


@dataclass(frozen=True)
class Failure:
    """A fatal failure of a card: `reason` names it (`Xid79`, `Vanished`)."""

    gpu: str
    reason: str
    message: str


def heartbeat_at(gpu: GPU) -> float | None:
    """The time of the GPU's last heartbeat (seconds since the epoch), or None when it has none
    (or an unreadable one: taken as none, so a GPU written by another tool is never refused)."""
    for condition in gpu.status.conditions:
        if condition.type == HEARTBEAT:
            return timestamps.epoch_seconds(condition.last_transition_time)
    return None


def another_nodes_report(reason: str, message: str, node: str) -> bool:
    """True for a `DuplicateUUID` condition another node's agent wrote about a GPU of `node` (its reason, or its
    message naming another node): what one node says of another's cards is acted on nowhere."""
    if reason == REASON_SEEN_ON_ANOTHER_NODE:
        return True
    named = re.match(r"node ([^:\s]+):", message)
    return named is not None and named.group(1) != node


def readiness(gpu: GPU, *, now: float, grace_s: float) -> Readiness:
    """Whether `gpu` takes new reservations at `now` with a heartbeat grace of `grace_s`."""
    duplicate = next((c for c in gpu.status.conditions if c.type == DUPLICATE_UUID and c.status == "True"
                      and not another_nodes_report(c.reason or "", c.message or "", gpu.spec.node_name)), None)
    if duplicate is not None:
        # OBSERVATION: another node's agent reports this card too: which node has it is the admin's call.
        name, node = gpu.metadata.name or "", gpu.spec.node_name
        return Readiness(
            ready=False,
            reason=DUPLICATE_UUID,
            message=f"two nodes report this card: this object says node {node}, and {duplicate.message}; no new"
            f" reservations until an admin finds the node that really has it (nvidia-smi -L on both): if it is"
            f" not {node}, kubectl delete pgpu {name}; else remove the condition DuplicateUUID from its status",
        )
    beat = heartbeat_at(gpu)
    if beat is None:
        # OBSERVATION: no heartbeat ever: written by hand or by another tool, taken as it is.
        return Readiness(ready=True)
    age = now - beat
    if age > grace_s:
        # OBSERVATION: the agent has not renewed the heartbeat within the grace period.
        node = gpu.spec.node_name
        return Readiness(
            ready=False,
            reason=REASON_HEARTBEAT_EXPIRED,
            message=f"no heartbeat from the agent of node {node} for {int(age)}s (grace {grace_s:g}s): no new"
            f" reservations on this card, the ones it holds are kept; check the elasticgpu agent on {node}",
        )
    # OBSERVATION: fresh heartbeat; the answer changes when the grace runs out without a new one.
    return Readiness(ready=True, recheck_in_s=grace_s - age + 1.0)


def ready_condition(gpu: GPU) -> tuple[str, str] | None:
    """The GPU's `Ready` condition as `(status, reason)`, or None when it has none."""
    for condition in gpu.status.conditions:
        if condition.type == READY:
            return condition.status, condition.reason
    return None


def condition_to_write(gpu: GPU, state: Readiness, *, now_rfc3339: str) -> Body | None:
    """The `Ready` condition to write so the object says what `state` says, or None when it
    says so already (or never needs to: a ready GPU that was never marked)."""
    current = ready_condition(gpu)
    if not state.ready:
        if current == ("False", state.reason):
            return None
        return {"type": READY, "status": "False", "reason": state.reason, "message": state.message,
                "lastTransitionTime": now_rfc3339}
    if current is None or current[0] == "True":
        return None
    if current[1] == DUPLICATE_UUID:
        return {"type": READY, "status": "True", "reason": REASON_DUPLICATE_RESOLVED,
                "message": "no other node reports this card any more: it takes new reservations",
                "lastTransitionTime": now_rfc3339}
    return {"type": READY, "status": "True", "reason": REASON_HEARTBEAT_RENEWED,
            "message": "the agent's heartbeat is fresh again: the card takes new reservations",
            "lastTransitionTime": now_rfc3339}


def with_condition(conditions: Iterable[Body], condition: Body) -> list[Body]:
    """`conditions` with the one of `condition`'s type replaced (or added); every other kept as
    it is (the agent's Heartbeat, Healthy and ApplicationXid are not the controller's)."""
    kept = [c for c in conditions if c.get("type") != condition["type"]]
    return sorted([*kept, condition], key=lambda c: str(c.get("type")))


def fatal_failure(gpu: GPU) -> Failure | None:
    """The card's fatal failure (`Healthy=False` with reason `Vanished`, or `Xid<code>` for an XID
    that needs a reset), or None. A card that is only Unhealthy otherwise (a transient XID, by
    hand, no such condition) takes no new reservations but fails nothing."""
    for condition in gpu.status.conditions:
        if condition.type != HEALTHY or condition.status != "False":
            continue
        reason = condition.reason
        code = reason[len(XID_PREFIX):]
        if reason == REASON_VANISHED or (reason.startswith(XID_PREFIX) and code.isdigit()
                                         and xids.classify(int(code)).kind is xids.XidKind.RESET):
            name = gpu.metadata.name or ""
            what = f"fatal XID {reason[len(XID_PREFIX):]}" if reason != REASON_VANISHED else "vanished"
            detail = f": {condition.message}" if condition.message else ""
            return Failure(gpu=name, reason=reason,
                           message=f"GPU {name} on node {gpu.spec.node_name} {what}{detail}")
    return None


def failed_card(cards: Iterable[str], gpus: Callable[[str], GPU | None]) -> Failure | None:
    """The first of `cards` (GPU object names) with a fatal failure, or None."""
    for name in cards:
        model = gpus(name)
        if model is not None:
            failure = fatal_failure(model)
            if failure is not None:
                return failure
    return None


