"""The MIG cards a class may use, as a `MigAllocator`, built from the GPU objects.

A GPU object is a MIG card for a class when its agent reports MIG mode (`spec.mig`, the
admin's choice), its model has MIG tables, it matches the class's `gpuModel` and its node the
class's `nodeSelector`, and it is ready. Its reservations with a `partition` are its instances;
a card holding a reservation without one (a soft share or a whole card from before MIG mode)
is left out: its slots are unknown, so nothing is carved next to it. So is a card whose
partitions break a slot rule (written by hand, or a profile its model lacks): nothing new is
carved on a card whose state cannot be trusted, and the rest of the class goes on working.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from elasticgpu.allocator.mig import slots as slot_rules
from elasticgpu.allocator.mig.placing import MigAllocator, MigCard, MigInstance, MigPlacement, MigPolicy
from elasticgpu.allocator.mig.profiles import MigModel, model_for
from elasticgpu.allocator.shapes import model_matches
from elasticgpu.api.gpu import GPU, open_to_elastic_gpu


@dataclass(frozen=True)
class ClusterCard:
    """One GPU object as the builder needs it: the object, its node's labels, whether it is ready."""

    gpu: GPU
    labels: Mapping[str, str]
    ready: bool = True


def build(cards: Iterable[ClusterCard], *, models: tuple[str, ...] = (), node_selector: Mapping[str, str] | None = None,
          policy: MigPolicy = "fragmentation") -> MigAllocator:
    """A `MigAllocator` holding the class's MIG cards and their instances (keys: ElasticGPU names)."""
    allocator = MigAllocator(policy=policy)
    selector = node_selector or {}
    held: dict[str, list[tuple[str, MigInstance]]] = {}
    for card in cards:
        gpu, spec = card.gpu, card.gpu.spec
        model = model_for(spec.model, spec.memory)
        if (not spec.mig or model is None or not card.ready or gpu.status.health == "Unhealthy"
                or not open_to_elastic_gpu(gpu)):  # a card moving to DRA, or DRA's: no new instance
            continue
        if models and not model_matches(spec.model, models):
            continue
        if any(card.labels.get(k) != v for k, v in selector.items()):
            continue
        allocations = gpu.status.allocations
        if any(a.partition is None for a in allocations):
            continue  # a soft share or a whole card: its slots are unknown
        if not partitions_fit(model, [(a.partition.profile, a.partition.start) for a in allocations if a.partition]):
            continue
        allocator.add_card(MigCard(uuid=spec.uuid, node=spec.node_name, index=spec.index, model=model,
                                   memory_mib=spec.memory))
        for allocation in allocations:
            assert allocation.partition is not None
            instance = MigInstance(spec.uuid, allocation.partition.profile, allocation.partition.start)
            held.setdefault(allocation.elastic_gpu, []).append((spec.node_name, instance))
    for key, instances in held.items():
        node = instances[0][0]
        # Restored as they are on the server; `reserve` checks them, and a conflict there is the
        # server's own state (two writers): reported by raising, never squeezed in.
        allocator.reserve(key, MigPlacement(node, tuple(i for _, i in instances)))
    return allocator


def partitions_fit(model: MigModel, partitions: list[tuple[str, int]]) -> bool:
    """Whether these instances can all be on one card of `model` (profiles it has, allowed
    starts, no shared slice, compute within the card)."""
    used = slot_rules.EMPTY
    for name, start in partitions:
        if name not in model.names:
            return False
        profile = model.profile(name)
        if not slot_rules.fits(model, used, profile, start):
            return False
        used = slot_rules.taking(used, profile, start)
    return True
