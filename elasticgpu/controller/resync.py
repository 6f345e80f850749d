"""Level-based repair: what a periodic resync finds that no event will ever fix.

- a reservation on a GPU whose ElasticGPU does not exist, older than the grace period (a crash
  between the commit point and the ElasticGPU's creation, whose claim then went away): free it;
- everything else (claims whose ElasticGPU vanished become Lost, Released ones are reclaimed,
  Pending ones are retried) is the ordinary sync of every object, which the resync requeues.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

from elasticgpu.controller.reservations import Ledger, parse_time


@dataclass(frozen=True)
class OrphanReservation:
    """A reservation with no ElasticGPU, past the grace period."""

    key: str
    gpu_names: tuple[str, ...]


def find_orphans(
    ledger: Ledger, *, elastic_gpus: Collection[str], now: datetime, grace_s: float
) -> list[OrphanReservation]:
    """Reservations whose ElasticGPU is not in `elastic_gpus` and that are older than `grace_s`.
    An allocation without `reservedAt` counts as old (someone wrote it by hand)."""
    orphans: list[OrphanReservation] = []
    for gpu_name in ledger.gpu_names():
        model = ledger.gpu(gpu_name)
        if model is None:
            continue
        for allocation in model.status.allocations:
            if allocation.elastic_gpu in elastic_gpus:
                continue
            reserved = parse_time(allocation.reserved_at)
            if reserved is not None and now - reserved < timedelta(seconds=grace_s):
                continue
            orphans.append(OrphanReservation(allocation.elastic_gpu, (gpu_name,)))
    return orphans
