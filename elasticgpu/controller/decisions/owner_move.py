"""Pure decision of a card's effective owner: when `status.owner` may follow `spec.owner` (docs/dra.md).

Every card has one owner at a time, our controller (`ElasticGPU`) or DRA (`DRA`, through the
elasticgpu DRA driver): our reservation and a ResourceClaim's allocation are different objects,
so two live owners would be a race by construction. The platform team sets the desired owner
(`spec.owner`); the controller alone writes the effective one (`status.owner`) and the
`OwnerMove` condition. A move stops new allocations on the old side at once (our allocator
places only where both say ElasticGPU; the driver publishes only where both say DRA), then:

- ElasticGPU -> DRA: flips once the card holds no reservation of ours (`status.allocations`
  empty) and no container of ours runs on it (`status.runningClaims` empty, the agent's view).
  The write carries the resourceVersion it was decided on, so a reservation that lands in
  between makes it a 409 and the next sync sees the reservation; the CRD refuses a status with
  owner DRA and a reservation as well.
- DRA -> ElasticGPU: flips once no ResourceClaim's allocation names the card (driver
  `gpu.elasticgpu.io`, pool = node, device `gpu-<index>`), read from a complete list of the
  claims, and the move has waited `grace_s` (from its Waiting condition's lastTransitionTime):
  the driver drops the card from its ResourceSlice when spec.owner changes, and a scheduler
  that read the slice just before may still write an allocation from it; the grace covers that
  lag. It also waits while the card's agent lists DRA claims it holds on it (`status.preparedClaims`:
  prepared and not unprepared, or with a container that can still run): a force-deleted pod's claim
  can be deallocated while kubelet still stops its container. While the claims are not known
  (never read, or the last read failed), it waits: not knowing is not "nothing holds it".

Otherwise the condition says Waiting and names what it waits for. No I/O: the caller gives the
GPU, its body as read, what DRA holds, and the time to stamp.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from elasticgpu.api import GPU, Condition, names, timestamps
from elasticgpu.api.gpu import effective_owner
from elasticgpu.controller.decisions import gpu_health

Body = dict[str, Any]
_NAMED = 3
"""How many holders a Waiting message names before it counts the rest."""


@dataclass(frozen=True)
class DraHolders:
    """What the controller knows of the ResourceClaims that hold one card."""

    known: bool
    """True when the claims were read completely (a list, then its watch) and are current."""
    claims: Sequence[str] = ()
    """`namespace/name` of every ResourceClaim whose allocation names the card."""
    why_unknown: str = ""
    """Why `known` is False, for the Waiting message."""


@dataclass(frozen=True)
class OwnerStep:
    """The write one sync makes for a card's owner, or nothing to write."""

    owner: str
    """The effective owner after this step."""
    condition: Body
    """The OwnerMove condition as it should be."""
    body: Body | None
    """The GPU body to PUT (the one read, with the new status.owner and condition), or None: unchanged."""
    moved: bool
    """True when this step flips status.owner (the decision the controller logs and records as an Event)."""
    recheck_in_s: float | None = None
    """Seconds until the answer may change with no event (the grace running out), or None."""


def _names(items: Sequence[str]) -> str:
    shown = ", ".join(items[:_NAMED])
    return shown if len(items) <= _NAMED else f"{shown} and {len(items) - _NAMED} more"


def _ours_holding(gpu: GPU) -> str:
    """What of ours holds the card, as words for the message; "" when nothing does."""
    parts: list[str] = []
    reservations = [a.elastic_gpu + (f" ({a.claim_ref.namespace}/{a.claim_ref.name})"
                                     if a.claim_ref is not None and a.claim_ref.name else "")
                    for a in gpu.status.allocations]
    if reservations:
        parts.append(f"{len(reservations)} reservation(s) of ours to be released: {_names(reservations)}")
    running = [f"{r.namespace}/{r.name}" for r in gpu.status.running_claims]
    if running:
        parts.append(f"the containers of {len(running)} claim(s) of ours to stop: {_names(running)}")
    return "; ".join(parts)


def _dra_holding(gpu: GPU, dra: DraHolders) -> str:
    """What of DRA holds the card, as words for the message; "" when nothing does."""
    parts: list[str] = []
    if not dra.known:
        parts.append(f"the ResourceClaims to be read ({dra.why_unknown or 'not listed yet'})")
    elif dra.claims:
        allocated = _names(list(dra.claims))
        parts.append(f"{len(dra.claims)} ResourceClaim(s) allocated on it to be deallocated: {allocated}")
    prepared = [f"{c.namespace}/{c.name}" for c in gpu.status.prepared_claims]
    if prepared:
        # The agent's view: kubelet has not unprepared them, or their containers still run (a force-deleted pod).
        parts.append(f"{len(prepared)} ResourceClaim(s) its node's agent holds prepared or running on it to be"
                     f" let go: {_names(prepared)}")
    return "; ".join(parts)


def decide(gpu: GPU, body: Body, *, dra: DraHolders, now: float, now_rfc3339: str, grace_s: float) -> OwnerStep:
    """The owner step of `gpu` (whose body as read is `body`), with `dra` what DRA holds of it, at `now`
    (seconds since the epoch; `now_rfc3339` the same instant as written); `grace_s` see the module docstring."""
    desired, current = gpu.spec.owner, effective_owner(gpu)
    moved = False
    recheck: float | None = None
    if desired == current:
        # OBSERVATION: no move asked (or it is done): say so, once; a card never moved (no status.owner,
        # no condition) costs no write at all.
        message = f"the card belongs to {current}"
        status, reason = "True", names.REASON_OWNER_DONE
    else:
        waiting = _ours_holding(gpu) if current == names.OWNER_ELASTIC_GPU else _dra_holding(gpu, dra)
        if not waiting and current == names.OWNER_DRA:
            left = _grace_left(gpu, now=now, grace_s=grace_s)
            if left > 0:
                # OBSERVATION: no claim holds it, but a scheduler may still act on the slice it read.
                waiting = f"the DRA driver's ResourceSlice to drop the card (a grace of {grace_s:g}s)"
                recheck = left + 0.5
        if waiting:
            # OBSERVATION: a move is asked and the old side still holds the card: new allocations
            # there stopped already (spec.owner changed); wait and say for what.
            message = f"moving from {current} to {desired}: waiting for {waiting}"
            status, reason = "False", names.REASON_OWNER_WAITING
        else:
            # OBSERVATION: nothing holds the card on the old side: flip.
            message = f"the card belongs to {desired} (moved from {current})"
            status, reason, current, moved = "True", names.REASON_OWNER_DONE, desired, True
    condition = _condition(gpu, status=status, reason=reason, message=message, now_rfc3339=now_rfc3339)
    never_moved = (gpu.status.owner is None and desired == current == names.OWNER_ELASTIC_GPU
                   and _previous(gpu) is None)
    unchanged = never_moved or (gpu.status.owner == current and _same(gpu, condition))
    if unchanged:
        return OwnerStep(owner=current, condition=condition, body=None, moved=False, recheck_in_s=recheck)
    new_status = dict(body.get("status") or {})
    new_status["owner"] = current
    new_status["conditions"] = gpu_health.with_condition(new_status.get("conditions") or [], condition)
    return OwnerStep(owner=current, condition=condition, body={**body, "status": new_status}, moved=moved,
                     recheck_in_s=recheck)


def _grace_left(gpu: GPU, *, now: float, grace_s: float) -> float:
    """Seconds of the grace still to wait: from when the move started waiting (its Waiting condition);
    all of it when it has not said Waiting yet (this write says so and starts it)."""
    previous = _previous(gpu)
    if previous is None or previous.status != "False":
        return grace_s
    since = timestamps.epoch_seconds(previous.last_transition_time)
    return grace_s if since is None else max(0.0, since + grace_s - now)


def _previous(gpu: GPU) -> Condition | None:
    return next((c for c in gpu.status.conditions if c.type == names.CONDITION_OWNER_MOVE), None)


def _condition(gpu: GPU, *, status: str, reason: str, message: str, now_rfc3339: str) -> Body:
    previous = _previous(gpu)
    since = previous.last_transition_time if previous is not None and previous.status == status else None
    return {"type": names.CONDITION_OWNER_MOVE, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": since or now_rfc3339}


def _same(gpu: GPU, condition: Body) -> bool:
    previous = _previous(gpu)
    return (previous is not None and previous.status == condition["status"]
            and previous.reason == condition["reason"] and previous.message == condition["message"])
