"""Where a claim of a `partitioning: MIG` class goes: a MIG instance's card and start slice.

Plans from the picture (under its lock), changes nothing: the MIG cards the class may use
(`allocator.mig.cluster`, their instances from the GPUs' `partition`s), the allocator's
least-fragmenting card and start, and the reservation to commit on each card: the profile's
share (cores and memory, what the instance has, usually more than asked) with its partition.
The commit is the ordinary one (a GPU status write with its resourceVersion), so two
controllers never carve one slot twice; a lost race re-plans.

A WaitForFirstConsumer class plans through `place_on` instead (`pods/pod_placement`): the same
decision among the cards of the nodes the pod may run on, beside the instances the pod's earlier
claims were tentatively given in the same pass (they are not on the GPUs yet).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from elasticgpu.allocator import CardShare, Placement
from elasticgpu.allocator.mig import claims as mig_claims
from elasticgpu.allocator.mig import cluster
from elasticgpu.allocator.mig.placing import MigAllocator, MigInstance, MigPlacement, MigUnplaceable
from elasticgpu.allocator.mig.profiles import model_for
from elasticgpu.api import GpuRequest
from elasticgpu.api.gpu import GPUPartition
from elasticgpu.api.gpu_class import ClassParameters
from elasticgpu.controller.picture.reservations import Ledger


@dataclass(frozen=True)
class MigPlan:
    """The reservation to commit: cores and memory per card, and each card's partition."""

    placement: Placement
    partitions: dict[str, GPUPartition]


@dataclass(frozen=True)
class MigWait:
    """Nothing fits: `never` when no card of the class could ever hold it (NeverFits)."""

    message: str
    never: bool


def plan(ledger: Ledger, request: GpuRequest, parameters: ClassParameters) -> MigPlan | MigWait:
    """The MIG reservation of `request` under a class with these parameters. Caller holds the picture's lock."""
    allocator = _allocator(ledger, parameters.gpu_model, parameters.node_selector, nodes=None)
    return _decide(ledger, allocator, request)


def place_on(ledger: Ledger, request: GpuRequest, *, models: tuple[str, ...], node_selector: dict[str, str],
             nodes: Collection[str], taken: Sequence[MigPlan] = ()) -> MigPlan | MigWait:
    """The MIG reservation of `request` on one of `nodes` (a pod's candidates), with the instances
    of `taken` (planned in this pass, not committed yet) counted as held. Caller holds the lock."""
    allocator = _allocator(ledger, models, node_selector, nodes=frozenset(nodes))
    known = {card.uuid for card in allocator.cards()}
    for number, earlier in enumerate(taken):
        instances = tuple(MigInstance(uuid, p.profile, p.start) for uuid, p in earlier.partitions.items()
                          if uuid in known)
        if instances:  # a card another class may use but this one may not is not in this allocator
            allocator.reserve(f"tentative-{number}", MigPlacement(earlier.placement.node, instances))
    return _decide(ledger, allocator, request)


def _allocator(ledger: Ledger, models: tuple[str, ...], node_selector: dict[str, str],
               nodes: frozenset[str] | None) -> MigAllocator:
    cards = []
    for name in ledger.mig_gpu_names():  # `cluster.build` skips the others: their models are not built
        gpu = ledger.gpu(name)
        if gpu is not None and (nodes is None or gpu.spec.node_name in nodes):
            cards.append(cluster.ClusterCard(gpu, ledger.node_labels(gpu.spec.node_name), ledger.is_ready(name)))
    return cluster.build(cards, models=models, node_selector=node_selector)


def _decide(ledger: Ledger, allocator: MigAllocator, request: GpuRequest) -> MigPlan | MigWait:
    found = allocator.place(mig_claims.mig_request(request))
    if isinstance(found, MigUnplaceable):
        message = found.reason
        if found.never:
            # Name the largest profile of the class's MIG cards (the allocator knows only the request).
            for card in allocator.cards():
                why = mig_claims.size_on(request, card_model=card.model.name, card_memory_mib=card.memory_mib)
                if isinstance(why, str):
                    message = mig_claims.never_covered(request, card.model, card.memory_mib)
                    break
        return MigWait(message, found.never)
    return _reservation(ledger, found)


def _reservation(ledger: Ledger, found: MigPlacement) -> MigPlan:
    shares: list[CardShare] = []
    partitions: dict[str, GPUPartition] = {}
    for instance in found.instances:
        gpu = ledger.gpu(ledger.name_of_uuid(instance.uuid))
        assert gpu is not None  # the allocator was built from these objects under the same lock
        model = model_for(gpu.spec.model, gpu.spec.memory)
        assert model is not None
        profile = model.profile(instance.profile)
        whole = profile is model.largest
        shares.append(CardShare(uuid=instance.uuid, cores=profile.cores if not whole else 100,
                                memory_mib=profile.memory_on(gpu.spec.memory), whole=whole))
        partitions[instance.uuid] = GPUPartition(profile=instance.profile, start=instance.start)
    return MigPlan(Placement(node=found.node, cards=tuple(shares)), partitions)
