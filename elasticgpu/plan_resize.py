"""`elasticgpu plan --resize NAMESPACE/CLAIM=SIZE`: what resizing a claim would do, offline.

After `plan` has bound the claims of its input files, each `--resize` (in the order given) is
decided against the cards and quotas as the plan left them, with the controller's own pure
decisions: `allocator.resize.decide_resize` (expand on the same card, `NoRoomOnCard` with what
the card lacks, `ShrinkBlocked` by the claim's `status.usage` if the file has one, whole cards
refused) and, for an expand that fits its card, `allocator.quota.check` (`QuotaExceeded`
naming the quota), in the controller's order: card first, then quota. An expand that goes
through is applied to the plan (the card and the quotas hold the new size), so a later
`--resize` sees it. A shrink is shown as the controller starts it: the new limit goes to the
node, and the reservation shrinks once the node applied it (not applied here).

SIZE is `CORES,MEMORY` (`60,20Gi`; memory in MiB or a quantity), `CORES` alone (memory in
proportion, as for a claim), or `cards=N` for whole cards.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TextIO

from elasticgpu import user_errors
from elasticgpu.allocator import Inventory, Placement, quota, resize
from elasticgpu.api import GPU, ElasticGPUClaim, ElasticGPUError, ElasticGPUQuota, GPUAllocation, names

OUTCOME_EXPANDS = "Expands"
OUTCOME_SHRINKS = "ShrinkPending"
OUTCOME_UNCHANGED = "Unchanged"
OUTCOME_NOT_BOUND = "NotBound"


@dataclass(frozen=True)
class ResizeAsk:
    """One `--resize`: the claim and its new requests (a resource map, as in the claim's spec)."""

    namespace: str
    name: str
    requests: dict[str, int | str]
    text: str


@dataclass(frozen=True)
class ResizeResult:
    """What one resize would do: an outcome (a decision's reason, or one of the OUTCOME_*) and
    the controller's message."""

    ask: ResizeAsk
    outcome: str
    message: str


@dataclass(frozen=True)
class Bound:
    """A claim `plan` bound: its key in the inventory, class and placement."""

    claim: ElasticGPUClaim
    key: str
    class_name: str
    placement: Placement
    resizable: bool
    """The class sets `allowClaimResize: true` (else the API server refuses the new requests)."""


def parse(text: str) -> ResizeAsk:
    """`NAMESPACE/CLAIM=SIZE`; raises `user_errors.ResizeInvalid` naming the flag and the form."""
    form = "use --resize NAMESPACE/CLAIM=CORES,MEMORY (60,20Gi), NAMESPACE/CLAIM=CORES or NAMESPACE/CLAIM=cards=N"
    target, sep, size = text.partition("=")
    namespace, slash, name = target.partition("/")
    if not sep or not slash or not namespace or not name or not size:
        raise user_errors.ResizeInvalid(f"--resize {text}: not NAMESPACE/CLAIM=SIZE; {form}")
    requests: dict[str, int | str]
    if size.startswith("cards="):
        cards = size.removeprefix("cards=")
        if not cards.isdigit() or int(cards) < 1:
            raise user_errors.ResizeInvalid(f"--resize {text}: cards must be a whole number >= 1; {form}")
        requests = {names.RESOURCE_NVIDIA_GPU: int(cards)}
    else:
        parts = size.split(",")
        if len(parts) > 2 or not parts[0].isdigit():
            raise user_errors.ResizeInvalid(f"--resize {text}: cores must be a whole number (percent of a card);"
                                            f" {form}")
        requests = {names.RESOURCE_CORE: int(parts[0])}
        if len(parts) == 2:
            requests[names.RESOURCE_MEMORY] = parts[1]
    return ResizeAsk(namespace, name, requests, size)


def decide_all(asks: Iterable[ResizeAsk], bound: dict[tuple[str, str], Bound | None], inventory: Inventory,
               quotas: list[ElasticGPUQuota]) -> list[ResizeResult]:
    """Each resize in order, against the plan's cards and quotas (an expand that goes through is
    applied). `bound`: every claim of the input by (namespace, name); None when it stayed Pending.
    Raises `user_errors.ResizeInvalid` for a claim that is not in the input."""
    results = []
    for ask in asks:
        if (ask.namespace, ask.name) not in bound:
            known = ", ".join(f"{ns}/{n}" for ns, n in sorted(bound)) or "none"
            raise user_errors.ResizeInvalid(f"--resize {ask.namespace}/{ask.name}={ask.text}: no such claim in the"
                                            f" files given with -f (claims: {known})")
        held = bound[(ask.namespace, ask.name)]
        if held is None:
            results.append(ResizeResult(ask, OUTCOME_NOT_BOUND, f"claim {ask.namespace}/{ask.name} stays Pending in"
                                        " this plan: only a Bound claim can be resized"))
            continue
        if not held.resizable:
            results.append(ResizeResult(ask, resize.REASON_NOT_RESIZABLE, f"claim {ask.namespace}/{ask.name}:"
                                        f" ElasticGPUClass {held.class_name or '<none>'} does not set"
                                        " allowClaimResize: true, so the API server refuses a change of"
                                        " spec.resources.requests; set it on the class, or create a new claim"))
            continue
        results.append(_decide(ask, held, inventory, quotas))
    return results


def _decide(ask: ResizeAsk, held: Bound, inventory: Inventory, quotas: list[ElasticGPUQuota]) -> ResizeResult:
    claim = _with_requests(held.claim, ask.requests)
    gpus = [_gpu_of(inventory, share.uuid) for share in held.placement.cards]
    allocations = [next(a for a in g.status.allocations if a.elastic_gpu == held.key) for g in gpus]
    decision = resize.decide_resize(claim, gpus=gpus, allocations=allocations)
    if isinstance(decision, resize.Refuse):
        return ResizeResult(ask, decision.reason, decision.message)
    if isinstance(decision, resize.Settle):
        return ResizeResult(ask, OUTCOME_UNCHANGED, f"claim {ask.namespace}/{ask.name} holds"
                            f" {decision.size.describe()} already: nothing to do")
    if isinstance(decision, resize.SetLimit | resize.WaitForNode):
        return ResizeResult(ask, OUTCOME_SHRINKS, decision.message + "; the reservation shrinks once the node"
                            " applied it")
    # resize.Reserve: an expand that fits its card. The quotas next, as the controller charges
    # them before it writes the larger reservation.
    share = held.placement.cards[0]
    grown = dataclasses.replace(share, cores=decision.size.cores, memory_mib=decision.size.memory)
    placement = Placement(node=held.placement.node, cards=(grown,))
    amount = quota.amount_of(placement)
    mine = [q for q in quotas if (q.metadata.namespace or "default") == ask.namespace]
    verdict = quota.check(mine, uid=held.key, class_name=held.class_name, amount=amount)
    if isinstance(verdict, quota.Exceeded | quota.Unreadable):
        reason = quota.REASON_QUOTA_EXCEEDED if isinstance(verdict, quota.Exceeded) else quota.REASON_INVALID_QUOTA
        return ResizeResult(ask, reason, f"claim {ask.namespace}/{ask.name}: {verdict.message}")
    charge = quota.charge_for(claim=ask.name, uid=held.key, class_name=held.class_name, amount=amount)
    for model in mine:
        model.status.charges = [*(c for c in model.status.charges if c.uid != held.key), charge]
    inventory.release(held.key)
    inventory.reserve(held.key, placement)
    return ResizeResult(ask, OUTCOME_EXPANDS, decision.message)


def _with_requests(claim: ElasticGPUClaim, requests: dict[str, int | str]) -> ElasticGPUClaim:
    body: dict[str, Any] = claim.to_dict()
    spec = body.setdefault("spec", {})
    spec["resources"] = {**(spec.get("resources") or {}), "requests": dict(requests)}
    try:
        changed = ElasticGPUClaim.model_validate(body)
        changed.spec.gpu_request()  # the API server's schema refuses what this refuses: told here, not planned
        return changed
    except (ValueError, ElasticGPUError) as err:
        raise user_errors.ResizeInvalid(f"claim {claim.metadata.namespace}/{claim.metadata.name}: the new"
                                        f" requests {requests} are not valid: {err}") from None


def _gpu_of(inventory: Inventory, uuid: str) -> GPU:
    """The card as a GPU object with the plan's reservations in its status (what the decision reads)."""
    record = inventory.card(uuid).record
    allocations = [
        GPUAllocation.model_validate({"elasticGPU": key, "cores": share.cores, "memory": share.memory_mib,
                                      "exclusive": share.whole})
        for key, placement in inventory.reservations.items()
        for share in placement.cards if share.uuid == uuid
    ]
    gpu = GPU.model_validate({
        "apiVersion": names.API_VERSION, "kind": names.KIND_GPU, "metadata": {"name": names.gpu_object_name(uuid)},
        "spec": {"index": record.index, "uuid": uuid, "model": record.model, "memory": record.memory_mib,
                 "nodeName": record.node}})
    gpu.status.allocations = allocations
    return gpu


def print_table(results: list[ResizeResult], out: TextIO) -> None:
    """One row per resize: the claim, the size asked, the outcome and the controller's message."""
    rows = [("NAMESPACE", "NAME", "RESIZE TO", "OUTCOME", "MESSAGE")]
    rows += [(r.ask.namespace, r.ask.name, r.ask.text, r.outcome, r.message) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)]
        out.write(("   ".join(cells) + "   " + row[-1]).rstrip() + "\n")


def refused(results: list[ResizeResult]) -> int:
    """How many resizes would not be carried out (for `--strict`)."""
    return sum(1 for r in results if r.outcome not in (OUTCOME_EXPANDS, OUTCOME_SHRINKS, OUTCOME_UNCHANGED))


__all__ = ["Bound", "ResizeAsk", "ResizeResult", "decide_all", "parse", "print_table", "refused"]
