"""Level-based repair: what a periodic resync finds that no event will ever fix.

- a reservation on a GPU whose ElasticGPU does not exist, older than the grace period (a crash
  between the commit point and the ElasticGPU's creation, whose claim then went away): free it,
  unless the claim it was made for is still there and still binding to it (its sync creates the
  ElasticGPU and needs the reservation: under API errors and backoff that can take longer than
  the grace, and freeing it then left a Bound ElasticGPU with no reservation);
- everything else (claims whose ElasticGPU vanished become Lost, Released ones are reclaimed,
  Pending ones are retried) is the ordinary sync of every object, which the resync requeues.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from elasticgpu.api import GPU, ElasticGPUClaim, ObjectReference, timestamps


class GPUs(Protocol):
    """What a resync reads of the GPU ledger (`picture.reservations.Ledger` is one): decisions
    receive the picture's objects, they never import the picture (the rooms' layers)."""

    def gpu_names(self) -> list[str]:
        """The names of the GPUs seen."""
        ...

    def gpu(self, name: str) -> GPU | None:
        """The GPU `name` as seen, or None."""
        ...

    def keys_on(self, gpu_name: str) -> set[str]:
        """The ElasticGPU names GPU `gpu_name` holds a reservation for (answered without its model)."""
        ...


@dataclass(frozen=True)
class OrphanReservation:
    """A reservation with no ElasticGPU, past the grace period."""

    key: str
    gpu_names: tuple[str, ...]
    claim_ref: ObjectReference | None = None
    """The claim the reservation was made for, as written with it."""


def still_binding(orphan: OrphanReservation, claim_of: Callable[[str, str], ElasticGPUClaim | None]) -> bool:
    """Whether the claim `orphan` was reserved for still exists (same uid), is not being deleted,
    and is bound to nothing or to `orphan.key`: its own sync will create that ElasticGPU, so the
    reservation is not an orphan, however old. `claim_of(namespace, name)`: the claim as seen."""
    ref = orphan.claim_ref
    if ref is None or not ref.namespace or not ref.name:
        return False
    claim = claim_of(ref.namespace, ref.name)
    if claim is None or (ref.uid and claim.metadata.uid != ref.uid) or claim.metadata.deletion_timestamp:
        return False
    return claim.spec.elastic_gpu_name in (None, "", orphan.key)


def find_orphans(
    ledger: GPUs, *, elastic_gpus: Collection[str], now: datetime, grace_s: float
) -> list[OrphanReservation]:
    """Reservations whose ElasticGPU is not in `elastic_gpus` and that are older than `grace_s`.
    An allocation without `reservedAt` counts as old (someone wrote it by hand)."""
    orphans: list[OrphanReservation] = []
    for gpu_name in ledger.gpu_names():
        if all(key in elastic_gpus for key in ledger.keys_on(gpu_name)):
            continue  # every holder is known: no model built (the ledger builds models on read)
        model = ledger.gpu(gpu_name)
        if model is None:
            continue
        for allocation in model.status.allocations:
            if allocation.elastic_gpu in elastic_gpus:
                continue
            reserved = timestamps.parse(allocation.reserved_at)  # reservations.parse_time
            if reserved is not None and now - reserved < timedelta(seconds=grace_s):
                continue
            orphans.append(OrphanReservation(allocation.elastic_gpu, (gpu_name,), allocation.claim_ref))
    return orphans
