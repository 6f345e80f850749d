"""What a namespace holds on the cards, for its ElasticGPUQuotas (pure, no I/O).

A reservation in a GPU's `status.allocations` whose `claimRef` names a claim of the namespace is
held by the namespace, and charged to its quotas, until it is freed: a claim's quota charge
never drops below what the GPU objects reserve for it (issue 23). In particular a deleted claim
whose pods the node's agent still reports running on the card (`running_holders`) keeps both
its reservation and its charge. One exception, as a ResourceQuota stops counting a PVC once it
is deleted even if its PersistentVolume is Retained: a reservation whose claim is gone, that no
container runs on (as its agent reports, while that report is believed), and whose ElasticGPU
is Released under reclaim policy Retain belongs to the admin who will delete it, not to the
namespace.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Set
from dataclasses import dataclass

from elasticgpu.api import GPU, ElasticGPU
from elasticgpu.controller.decisions import running_holders


@dataclass
class Held:
    """What one claim's reservations hold, summed over its cards."""

    name: str
    cores: int = 0
    memory: int = 0
    cards: int = 0


def handed_to_admin(egpu: ElasticGPU) -> bool:
    """True for an ElasticGPU Released under reclaim policy Retain: its claim is gone and an
    admin frees it (the namespace no longer holds it)."""
    return egpu.status.phase == "Released" and (egpu.spec.reclaim_policy or "Retain") == "Retain"


def held_by(namespace: str, *, gpus: Iterable[GPU], alive: Set[str], handed: Callable[[str], bool],
            gpu: Callable[[str], GPU | None], expired: Callable[[GPU], str] = lambda _gpu: "") -> dict[str, Held]:
    """By claim uid, what the reservations on `gpus` hold for the claims of `namespace`.

    `alive`: uids of the namespace's claims that exist; `handed`: whether the ElasticGPU of that
    name is handed to an admin (`handed_to_admin`; asked only for claims that are gone); `gpu`:
    GPU objects by name, for the running holders; `expired`: why a GPU's report of running
    claims is no longer believed (`running_holders.expired_reason`), "" while it is.
    A reservation counts unless its claim is gone, no container of it runs on the card, and its
    ElasticGPU is handed to an admin."""
    held: dict[str, Held] = {}
    for model in gpus:
        gpu_name = model.metadata.name or ""
        for allocation in model.status.allocations:
            ref = allocation.claim_ref
            if ref is None or ref.namespace != namespace or not ref.uid:
                continue
            if ref.uid not in alive and handed(allocation.elastic_gpu) and not running_holders.running(
                    running_holders.holders_of(allocation.elastic_gpu, claim_ref=ref, gpu_names=[gpu_name],
                                               gpus=gpu, expired=expired)):
                continue
            total = held.setdefault(ref.uid, Held(name=ref.name or ""))
            total.cores += allocation.cores
            total.memory += allocation.memory
            total.cards += 1 if allocation.exclusive else 0
    return held
