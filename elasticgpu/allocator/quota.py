"""Quota decisions: pure functions over ElasticGPUQuota objects (no I/O).

What a claim is charged (`amount_of`), whether a charge fits every quota of its namespace
(`check`), the quota status with a charge added or taken back (`status_with` / `status_without`),
and the status recomputed from the reservations (`recompute`, the resync's repair). The bind
path (`flow/quota_guard.py`) and, later, the resize path call these; `elasticgpu plan` too.

A charge is keyed by the claim's uid, so a retried bind, or two controllers binding the same
claim, charge it once. `used` is always the sum of `charges`: a status is never written with one
out of step with the other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from elasticgpu.allocator import Placement
from elasticgpu.api import ElasticGPUQuota, QuotaCharge, format_memory, names, timestamps
from elasticgpu.api.errors import InvalidQuantity
from elasticgpu.api.quota import QUOTA_RESOURCES, parse_hard, quota_key

REASON_QUOTA_EXCEEDED = "QuotaExceeded"
"""Reason of a Pending claim's condition and Event when a quota keeps it from binding."""
REASON_INVALID_QUOTA = "InvalidQuota"
"""Reason when a quota of the namespace cannot be read (the claim waits: no limit is guessed)."""


@dataclass(frozen=True)
class Amount:
    """What one claim holds: cores (percent, 100 per whole card), memory (MiB), whole cards."""

    cores: int = 0
    memory_mib: int = 0
    cards: int = 0

    def of(self, resource: str) -> int:
        """The amount of one quota resource."""
        if resource == names.RESOURCE_CORE:
            return self.cores
        if resource == names.RESOURCE_MEMORY:
            return self.memory_mib
        return self.cards


def amount_of(placement: Placement) -> Amount:
    """What a placement takes: the sum over its cards (a whole card counts 100 cores and its memory)."""
    whole = sum(1 for share in placement.cards if share.whole)
    return Amount(cores=sum(share.cores for share in placement.cards),
                  memory_mib=sum(share.memory_mib for share in placement.cards), cards=whole)


def amount_of_charge(charge: QuotaCharge) -> Amount:
    """The amount a charge entry records."""
    return Amount(cores=charge.cores, memory_mib=charge.memory, cards=charge.cards)


def _show(resource: str, amount: int) -> str:
    return format_memory(amount) if resource == names.RESOURCE_MEMORY and amount else str(amount)


def _unit(resource: str) -> str:
    return {names.RESOURCE_CORE: "cores", names.RESOURCE_MEMORY: "memory"}.get(resource, "whole cards")


def used_by(charges: Iterable[QuotaCharge], class_name: str | None, resource: str) -> int:
    """What the charges hold of `resource`, for one class or (None) in all."""
    return sum(amount_of_charge(c).of(resource) for c in charges if class_name is None or c.class_name == class_name)


@dataclass(frozen=True)
class Fits:
    """Every quota of the namespace has room (or the claim is charged already)."""


@dataclass(frozen=True)
class Exceeded:
    """A quota has no room: the claim stays Pending with `REASON_QUOTA_EXCEEDED` and `message`."""

    quota: str
    key: str
    used: int
    hard: int
    message: str


@dataclass(frozen=True)
class Unreadable:
    """A quota's spec cannot be read: the claim waits (a limit is never guessed)."""

    quota: str
    message: str


Verdict = Fits | Exceeded | Unreadable


def check(quotas: Iterable[ElasticGPUQuota], *, uid: str, class_name: str, amount: Amount) -> Verdict:
    """Whether charging `amount` to the claim `uid` of class `class_name` stays within every quota
    (namespace-wide keys, and the keys of its class). The claim's own charge, if any, is replaced,
    not added: a retried bind is never refused for what it holds already. Pure."""
    for quota in sorted(quotas, key=lambda q: q.metadata.name or ""):
        name = quota.metadata.name or ""
        try:
            limits = parse_hard(quota.spec.hard)
        except InvalidQuantity as err:
            return Unreadable(name, f"ElasticGPUQuota {name}: {err}; fix spec.hard")
        others = [c for c in quota.status.charges if c.uid != uid]
        for (limit_class, resource), hard in sorted(limits.items(), key=lambda i: (i[0][0] or "", i[0][1])):
            if limit_class is not None and limit_class != class_name:
                continue
            wanted = amount.of(resource)
            if wanted == 0:
                continue
            used = used_by(others, limit_class, resource)
            if used + wanted > hard:
                key = quota_key(limit_class, resource)
                scope = f"class {limit_class}" if limit_class else "the namespace"
                message = (f"ElasticGPUQuota {name}: {key} would be {_show(resource, used + wanted)}, over its limit"
                           f" {_show(resource, hard)} (used {_show(resource, used)}, this claim"
                           f" {_show(resource, wanted)} {_unit(resource)}, for {scope}); the claim binds once"
                           " the quota is raised or claims of the namespace are deleted")
                return Exceeded(name, key, used, hard, message)
    return Fits()


def charge_for(*, claim: str, uid: str, class_name: str, amount: Amount) -> QuotaCharge:
    """The charge entry of one claim, written now."""
    return QuotaCharge(claim=claim, uid=uid, class_name=class_name, cores=amount.cores, memory=amount.memory_mib,
                       cards=amount.cards, since=timestamps.now_rfc3339())


def _same(a: QuotaCharge, b: QuotaCharge) -> bool:
    return (a.uid, a.class_name, a.cores, a.memory, a.cards) == (b.uid, b.class_name, b.cores, b.memory, b.cards)


def holds(quota: ElasticGPUQuota, charge: QuotaCharge) -> bool:
    """True when the quota already holds this very charge (nothing to write)."""
    return any(_same(c, charge) for c in quota.status.charges)


def status_of(quota: ElasticGPUQuota, charges: list[QuotaCharge]) -> dict[str, object]:
    """The quota's whole status for `charges`: hard as enforced, used per key of spec.hard, the
    charges, and the used/hard text of the namespace-wide keys."""
    try:
        limits = parse_hard(quota.spec.hard)
    except InvalidQuantity:
        limits = {}
    used: dict[str, object] = {}
    for (class_name, resource) in sorted(limits, key=lambda k: (k[0] or "", k[1])):
        amount = used_by(charges, class_name, resource)
        used[quota_key(class_name, resource)] = format_memory(amount) if resource == names.RESOURCE_MEMORY else amount
    summary: dict[str, str] = {}
    for resource, column in zip(QUOTA_RESOURCES, ("cores", "memory", "cards"), strict=True):
        amount = used_by(charges, None, resource)
        hard = limits.get((None, resource))
        summary[column] = f"{_show(resource, amount)}/{_show(resource, hard) if hard is not None else '-'}"
    ordered = sorted(charges, key=lambda c: (c.claim, c.uid))
    return {"hard": dict(quota.spec.hard), "used": used, "charges": [c.to_dict() for c in ordered],
            "summary": summary}


def status_with(quota: ElasticGPUQuota, charge: QuotaCharge) -> dict[str, object]:
    """The status with `charge` in place of the claim's old one (if any)."""
    return status_of(quota, [*(c for c in quota.status.charges if c.uid != charge.uid), charge])


def status_without(quota: ElasticGPUQuota, uid: str) -> dict[str, object]:
    """The status without the charge of claim `uid`."""
    return status_of(quota, [c for c in quota.status.charges if c.uid != uid])


def _covering(previous: QuotaCharge, fresh: QuotaCharge) -> QuotaCharge:
    """`previous` raised, resource by resource, to at least what `fresh` holds (its time kept)."""
    if (previous.cores >= fresh.cores and previous.memory >= fresh.memory and previous.cards >= fresh.cards
            and previous.class_name == fresh.class_name):
        return previous
    return previous.model_copy(update={"class_name": fresh.class_name, "cores": max(previous.cores, fresh.cores),
                                       "memory": max(previous.memory, fresh.memory),
                                       "cards": max(previous.cards, fresh.cards)})


def recompute(quota: ElasticGPUQuota, *, holding: Mapping[str, QuotaCharge], now: datetime,
              grace_s: float) -> list[QuotaCharge]:
    """The charges the quota should hold, from what the cluster shows (the resync's repair).

    `holding`: by claim uid, the charge each reservation of the namespace that the namespace
    still holds should have (`decisions.quota_holding` says which). Such a reservation is
    charged at least what it holds, at once (also one bound before the quota existed). A charge
    is never lowered or dropped within `grace_s` of being written: a bind or an expand charges
    first and writes the GPU after, on this controller or another, and the reservations read
    here may be older than the charge (issue 23: a resync between an expand's charge and its
    GPU write lowered the charge, and the next claim took the quota over its limit). After the
    grace a charge follows the reservation (a shrink, a crash between charge and reservation,
    a claim gone: dropped).
    """
    old = {c.uid: c for c in quota.status.charges}
    kept: list[QuotaCharge] = []
    for uid in sorted(set(old) | set(holding)):
        previous = old.get(uid)
        written = timestamps.parse(previous.since) if previous is not None and previous.since else None
        young = written is not None and (now - written).total_seconds() < grace_s
        fresh = holding.get(uid)
        if fresh is None:
            if previous is not None and young:
                kept.append(previous)
            continue
        if previous is not None and _same(previous, fresh):
            kept.append(previous)
        elif previous is not None and young:
            kept.append(_covering(previous, fresh))
        else:
            kept.append(fresh)
    return sorted(kept, key=lambda c: (c.claim, c.uid))


def lowers(before: Iterable[QuotaCharge], after: Iterable[QuotaCharge]) -> bool:
    """True when `after` drops a charge of `before` or lowers one of its amounts (the resync then
    confirms what the cards reserve with a live read before it writes)."""
    now = {c.uid: c for c in after}
    for charge in before:
        new = now.get(charge.uid)
        if new is None or new.cores < charge.cores or new.memory < charge.memory or new.cards < charge.cards:
            return True
    return False
