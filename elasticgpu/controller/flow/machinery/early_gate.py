"""The early gate: which keys a fresh start may sync before its picture is whole.

A fresh start (`process/early_start.py`) lists first what a placement reads (nodes, GPUs,
classes, quotas) and the claims, and binds from that while ElasticGPUs and pods are still listed
(issue 49: 89 s from start to first bind at 40,000 cards / 50,000 claims, most of it listing
objects a new claim's placement never reads). That is safe only for a claim whose sync reads
nothing but the cards: the commit point of a dynamic bind is the reservation written into a
GPU's `status.allocations` with a resourceVersion precondition, so capacity is exact from the
GPUs alone, and a bind that finds its ElasticGPU already made (a crashed leader's) reads it
back (`ClaimBinding._finish_provision`).

Every other key waits here (held, not lost) until `open`: anything that reads ElasticGPUs or
pods would decide from a half picture. A Bound claim or an ElasticGPU whose peer is
not listed yet would look orphaned or Lost, and a reservation with no ElasticGPU known would look
leaked; freeing or marking any of them on that guess could give a running pod's card away.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from elasticgpu.api import ElasticGPUClaim, ElasticGPUClass
from elasticgpu.controller.decisions import groups, provisioned_names
from elasticgpu.controller.flow.machinery.workqueue import Key, WorkQueue
from elasticgpu.controller.picture.picture import Picture


class EarlyGate:
    """Holds the keys that must wait for the whole picture; see the module docstring."""

    def __init__(self, *, picture: Picture, queue: WorkQueue) -> None:
        self.picture = picture
        self.queue = queue
        self._lock = threading.Lock()
        self._open = False
        self._held: set[Key] = set()

    @property
    def is_open(self) -> bool:
        with self._lock:
            return self._open

    def held(self) -> int:
        """How many keys wait for the whole picture."""
        with self._lock:
            return len(self._held)

    def admit(self, keys: list[Key]) -> list[Key]:
        """The keys of a batch that may be synced now; the others are held until `open`."""
        with self._lock:
            if self._open:
                return keys
        admitted = [key for key in keys if self.early_safe(key)]
        with self._lock:
            if self._open:  # opened meanwhile: nothing to hold
                return keys
            self._held.update(key for key in keys if key not in admitted)
        return admitted

    def open(self) -> int:
        """The picture is whole: queue every held key again (front lane: they are events' keys,
        woken before the list's); how many."""
        with self._lock:
            self._open = True
            held, self._held = self._held, set()
        for key in held:
            self.queue.add(key)
        return len(held)

    def early_safe(self, key: Key) -> bool:
        """Whether `key` is a claim whose sync reads only the cards: new (no phase, or Pending),
        not being deleted, standalone (no owner pod, no users: an inline claim's bind names its
        pod), naming no ElasticGPU and no selector (a static bind reads ElasticGPUs), in no group,
        of a known Immediate class that cannot preempt (victims are ElasticGPUs), in a namespace
        known to have no quota (its usage is counted from the claims)."""
        if key[0] != "claim" or len(key) != 3:
            return False
        with self.picture.lock:
            claim = self.picture.claim(key[1], key[2])
            if claim is None or not _standalone_and_new(claim):
                return False
            view = self.picture.view()
            name = claim.spec.class_name
            klass = view.classes.get(name) if name else view.default_class()
            if klass is None or klass.effective_binding_mode != "Immediate":
                return False
            if _may_preempt(klass, view.classes.values()):
                return False
        return self.picture.quotas.limits(key[1]) is False


def _standalone_and_new(claim: ElasticGPUClaim) -> bool:
    return (claim.status.phase in (None, "Pending") and not claim.metadata.deletion_timestamp
            and not claim.spec.elastic_gpu_name and claim.spec.selector is None and not claim.status.users
            and provisioned_names.controlling_pod(claim.metadata.owner_references) is None
            and not groups.group_name(claim))


def _may_preempt(klass: ElasticGPUClass, classes: Iterable[ElasticGPUClass]) -> bool:
    """Whether a claim of `klass` could preempt: its policy allows it and some class may rank below
    it. A PriorityClass is read with a GET only when needed; a class naming one counts as maybe."""
    if klass.preemption_policy == "Never":
        return False
    if klass.priority_class_name:
        return True
    mine = klass.priority or 0
    return any(other.priority_class_name or (other.priority or 0) < mine for other in classes)
