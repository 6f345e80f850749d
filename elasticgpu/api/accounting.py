"""GPU accounting: how much each ElasticGPU has reserved so far, from its own status (issue 38).

The figures a bill needs are integrals over time: card-core seconds (100 = one whole card for
one second), memory MiB-seconds and whole-card seconds, per namespace and class. A counter kept
in a process's memory would start again from zero after a restart or a leader change, and one
rebuilt from the live objects alone would drop a reservation's past once its size changed. So
the integral lives in the ElasticGPU itself, in `status.accounting`, as two parts:

    closed  coreSeconds, memoryMibSeconds, cardSeconds: what the periods that ended accrued
    open    since: when the current period began (absent when none is open)

and the value at any moment is `closed + size x (now - since)`, `size` being `status.capacity`.
A period is open while the ElasticGPU is Bound (what its tenant holds; a Released ElasticGPU
kept by `reclaimPolicy: Retain` is the platform's, not the tenant's). `fold` is the only
function that moves time from the open period into the closed sums, and the controller writes
its result in the same status patch as the phase or capacity change that caused it, with the
resourceVersion it read: the move and its cause are one write, a stale controller's copy is
refused with 409, and no other writer touches the field. Hence:

- a restart, or another replica taking the Lease, computes the same value from the same object
  (nothing was in the old process's memory that the object lacks), the time the controller
  was down included;
- nothing is counted twice: a period is folded at most once (the write that folds it also
  closes or restarts it), and a value never decreases, because `since` and the seconds are
  whole (`now_seconds` floors the clock the same way the API server writes timestamps);
- an ElasticGPU bound before this field existed counts from its creation (the moment a dynamic
  one was provisioned for its claim).

Pure: no clock of its own (callers pass `now`), no I/O.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from elasticgpu.api import names, timestamps
from elasticgpu.api.elastic_gpu import ElasticGPU
from elasticgpu.api.errors import ElasticGPUError
from elasticgpu.api.quantities import parse_count, parse_memory_mib

__all__ = [
    "Accrued", "Charge", "Period", "Size", "accrued", "charge_of", "fold", "now_seconds", "period_of",
    "size_of", "view",
]

MIB = 1024 * 1024
OPEN_PHASE = "Bound"
"""The phase during which an ElasticGPU's size is charged to its claim's namespace."""


@dataclass(frozen=True)
class Size:
    """What an ElasticGPU holds: cores (percent of one card, summed), memory MiB, whole cards."""

    cores: int = 0
    memory_mib: int = 0
    cards: int = 0


@dataclass(frozen=True)
class Accrued:
    """Integrals over time of a reservation: card-core seconds (100 = a card for a second),
    MiB-seconds of memory, whole-card seconds."""

    core_seconds: int = 0
    memory_mib_seconds: int = 0
    card_seconds: int = 0

    def __add__(self, other: Accrued) -> Accrued:
        return Accrued(self.core_seconds + other.core_seconds, self.memory_mib_seconds + other.memory_mib_seconds,
                       self.card_seconds + other.card_seconds)

    @property
    def memory_byte_seconds(self) -> int:
        """Memory in byte-seconds (the metric's base unit)."""
        return self.memory_mib_seconds * MIB

    def to_status(self, *, since: str | None) -> dict[str, Any]:
        """`status.accounting` as written: the closed sums and the open period's start (None: none)."""
        return {"coreSeconds": self.core_seconds, "memoryMibSeconds": self.memory_mib_seconds,
                "cardSeconds": self.card_seconds, "since": since}


def now_seconds(now: float) -> int:
    """`now` floored to whole seconds: the resolution of the timestamps written (`since`), so a
    value computed at a scrape is never above the value a fold writes a moment later."""
    return math.floor(now)


def size_of(capacity: Mapping[str, Any]) -> Size:
    """The size in `status.capacity` (cores integer, memory a quantity, whole cards a count);
    an unreadable entry counts as 0 rather than stopping a scrape (the CRD refuses such values)."""
    raw = (capacity.get(names.RESOURCE_CORE, 0), capacity.get(names.RESOURCE_MEMORY, 0),
           capacity.get(names.RESOURCE_NVIDIA_GPU, 0))
    try:
        return _size_of_raw(raw)
    except TypeError:  # an unhashable value (a list where a number belongs): not worth caching
        return _size_of_raw.__wrapped__(raw)


@functools.lru_cache(maxsize=1024)
def _size_of_raw(raw: tuple[Any, Any, Any]) -> Size:
    """`size_of` from the three raw values, cached: a fleet has a few sizes (a class's shares),
    and the first scrape after a start reads 50,000 ElasticGPUs' capacities (issue 49: parsing
    each quantity again was a fifth of that scrape)."""
    try:
        cores = parse_count(raw[0], field="status.capacity")
    except ElasticGPUError:
        cores = 0
    try:
        memory = parse_memory_mib(raw[1], field="status.capacity")
    except ElasticGPUError:
        memory = 0
    try:
        cards = parse_count(raw[2], field="status.capacity")
    except ElasticGPUError:
        cards = 0
    return Size(cores=cores, memory_mib=memory, cards=cards)


def _closed(accounting: Mapping[str, Any]) -> Accrued:
    return Accrued(int(accounting.get("coreSeconds") or 0), int(accounting.get("memoryMibSeconds") or 0),
                   int(accounting.get("cardSeconds") or 0))


def _since(status: Mapping[str, Any], metadata: Mapping[str, Any]) -> int | None:
    """When the open period began (whole seconds), None when none is open."""
    if status.get("phase") != OPEN_PHASE:
        return None
    accounting = status.get("accounting")
    # Bound before status.accounting existed: count from the ElasticGPU's creation.
    text = accounting.get("since") if isinstance(accounting, Mapping) else metadata.get("creationTimestamp")
    return _stamp_seconds(text) if isinstance(text, str) else None


@functools.lru_cache(maxsize=4096)
def _stamp_seconds(text: str) -> int | None:
    """A timestamp as whole epoch seconds, cached: the binds of a burst share their seconds, and
    a first scrape reads one per ElasticGPU (a fifth of its cost at 50,000)."""
    stamp = timestamps.epoch_seconds(text)
    return None if stamp is None else now_seconds(stamp)


def _over(size: Size, seconds: int) -> Accrued:
    seconds = max(0, seconds)
    return Accrued(size.cores * seconds, size.memory_mib * seconds, size.cards * seconds)


def accrued(body: Mapping[str, Any], *, now: float) -> Accrued:
    """What the ElasticGPU `body` (as the API serves it) has reserved from its first bind to
    `now` (seconds since the epoch): its closed sums plus its open period at its current size."""
    status = body.get("status") or {}
    metadata = body.get("metadata") or {}
    accounting = status.get("accounting")
    closed = _closed(accounting) if isinstance(accounting, Mapping) else Accrued()
    since = _since(status, metadata)
    if since is None:
        return closed
    return closed + _over(size_of(status.get("capacity") or {}), now_seconds(now) - since)


@dataclass(frozen=True)
class Period:
    """What `accrued` reads from one version of an ElasticGPU, parsed once: the closed sums, the
    open period's start (None: none open) and the size it accrues at. A scrape of 50,000
    ElasticGPUs computes `at(now)` for each, and parses a body again only when it changed."""

    closed: Accrued
    since: int | None
    size: Size

    def at(self, now: float) -> Accrued:
        """The value at `now`: `accrued(body, now=now)` of the body this was read from."""
        if self.since is None:
            return self.closed
        return self.closed + _over(self.size, now_seconds(now) - self.since)


def period_of(body: Mapping[str, Any]) -> Period:
    """The `Period` of the ElasticGPU `body` (as the API serves it, or `view` of a model)."""
    status = body.get("status") or {}
    accounting = status.get("accounting")
    closed = _closed(accounting) if isinstance(accounting, Mapping) else Accrued()
    since = _since(status, body.get("metadata") or {})
    size = size_of(status.get("capacity") or {}) if since is not None else Size()
    return Period(closed=closed, since=since, size=size)


Triple = tuple[int, int, int]
"""core seconds, memory MiB-seconds, card seconds (or cores, MiB, cards): plain ints, for the
per-ElasticGPU loop of a scrape of 50,000 (a dataclass built per ElasticGPU per scrape was most of
its cost)."""


class Charge(NamedTuple):
    """Whom one version of an ElasticGPU charges its reserved time to, and how it accrues: read
    once, when the picture takes that version in (`charge_of`), so that a scrape of 50,000
    reads none of their bodies, the first after a start or a leader change included (issue 49
    item 3). One flat tuple of strings and ints: the picture keeps one per ElasticGPU, and each
    object more per ElasticGPU (a class instance, nested tuples) cost the list of a fleet more
    garbage collections."""

    version: str | None
    """The resourceVersion it was read from."""
    charged: bool
    """False: it accrues nothing (no claim, never Bound); the fields below are empty."""
    namespace: str = ""
    """The labels of its series: its claim's namespace and name, its class, its own name."""
    claim: str = ""
    class_name: str = ""
    name: str = ""
    core_seconds: int = 0
    """What the periods that ended accrued (`Accrued`)."""
    memory_mib_seconds: int = 0
    card_seconds: int = 0
    since: int | None = None
    """When the open period began (whole seconds), None when none is open."""
    cores: int = 0
    """What the open period accrues per second (`Size`)."""
    memory_mib: int = 0
    cards: int = 0

    @property
    def labels(self) -> tuple[str, str, str, str]:
        """namespace, claim, class, ElasticGPU name."""
        return self.namespace, self.claim, self.class_name, self.name

    def at(self, now: float) -> Triple:
        """The value at `now`: `Period.at(now)` of the version it was read from, in plain ints."""
        return self.at_second(now_seconds(now))

    def at_second(self, second: int) -> Triple:
        """`at` a whole second (`now_seconds`): a scrape floors its clock once, not per ElasticGPU."""
        since = self.since
        if since is None:
            return self.core_seconds, self.memory_mib_seconds, self.card_seconds
        seconds = second - since if second > since else 0
        return (self.core_seconds + self.cores * seconds, self.memory_mib_seconds + self.memory_mib * seconds,
                self.card_seconds + self.cards * seconds)


def charge_of(egpu: ElasticGPU | Mapping[str, Any]) -> Charge:
    """The `Charge` of an ElasticGPU, from its model or its body as the API serves it: charged
    when its claimRef names a claim and it is Bound or has accrued before (`status.accounting`);
    its value at any time is `accrued` of the same body."""
    # A dict first: what the watch delivers, and a cheaper test than the model's metaclass'.
    if not isinstance(egpu, dict) and isinstance(egpu, ElasticGPU):
        version = egpu.metadata.resource_version
        ref = egpu.spec.claim_ref
        if ref is None or not ref.name:
            return Charge(version, False)
        if egpu.status.phase != OPEN_PHASE and egpu.status.accounting is None:
            return Charge(version, False)
        labels = (ref.namespace or "", ref.name, egpu.spec.elastic_gpu_class_name or "", egpu.metadata.name or "")
        body: Mapping[str, Any] = view(egpu)
        status, meta = body["status"], body["metadata"]
    else:
        body = egpu
        spec, status, meta = body.get("spec") or {}, body.get("status") or {}, body.get("metadata") or {}
        version = meta.get("resourceVersion")
        claim = spec.get("claimRef") or {}
        if not claim.get("name"):
            return Charge(version, False)
        if status.get("phase") != OPEN_PHASE and not status.get("accounting"):
            return Charge(version, False)  # never Bound: nothing accrued
        labels = (str(claim.get("namespace") or ""), str(claim["name"]), str(spec.get("elasticGPUClassName") or ""),
                  str(meta.get("name") or ""))
    # What `period_of` reads, without its dataclasses (the list of a fleet builds one per ElasticGPU).
    accounting = status.get("accounting")
    closed = _closed(accounting) if isinstance(accounting, (dict, Mapping)) else _NONE
    since = _since(status, meta)
    size = size_of(status.get("capacity") or {}) if since is not None else _EMPTY
    # Interned: a fleet has a few namespaces and classes, and each body parsed has its own copy.
    return Charge(version, True, sys.intern(labels[0]), labels[1], sys.intern(labels[2]), labels[3],
                  closed.core_seconds, closed.memory_mib_seconds, closed.card_seconds, since,
                  size.cores, size.memory_mib, size.cards)


_NONE = Accrued()
_EMPTY = Size()


def fold(body: Mapping[str, Any], *, phase: str, capacity: Mapping[str, Any] | None,
         now: float) -> dict[str, Any] | None:
    """`status.accounting` to write with a status patch that sets `phase` (and `capacity`,
    when given) on the ElasticGPU `body`; None when the patch leaves it as it is.

    OBSERVATION: a period is open and the phase leaves Bound, or the size changes (a resize):
    the open period is added to the closed sums at the old size, and a new one opens at `now`
    if the ElasticGPU stays Bound. OBSERVATION: none is open and the phase becomes Bound: one
    opens at `now`. Otherwise nothing changes."""
    status = body.get("status") or {}
    metadata = body.get("metadata") or {}
    old_capacity = status.get("capacity") or {}
    new_capacity = old_capacity if capacity is None else capacity
    accounting = status.get("accounting")
    closed = _closed(accounting) if isinstance(accounting, Mapping) else Accrued()
    since = _since(status, metadata)
    at = now_seconds(now)
    stamp = timestamps.format_epoch(at)
    stays_open = phase == OPEN_PHASE
    if since is None:
        return closed.to_status(since=stamp) if stays_open else None
    old_size = size_of(old_capacity)
    if stays_open and size_of(new_capacity) == old_size and isinstance(accounting, Mapping):
        return None
    total = closed + _over(old_size, at - since)
    return total.to_status(since=stamp if stays_open else None)


def view(egpu: ElasticGPU) -> dict[str, Any]:
    """The parts of the model `egpu` that `accrued` and `fold` read, as the API serves them."""
    status = egpu.status
    return {
        "metadata": {"creationTimestamp": egpu.metadata.creation_timestamp},
        "status": {"phase": status.phase, "capacity": dict(status.capacity),
                   "accounting": status.accounting.to_dict() if status.accounting is not None else None},
    }
