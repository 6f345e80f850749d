"""Where a claim of a `partitioning: MIG` class goes: a MIG instance's card and start slice.

Plans from the picture (under its lock), changes nothing: the MIG cards the class may use
(`allocator.mig.cluster`, their instances from the GPUs' `partition`s), the allocator's
least-fragmenting card and start, and the reservation to commit on each card: the profile's
share (cores and memory, what the instance has, usually more than asked) with its partition.
The commit is the ordinary one (a GPU status write with its resourceVersion), so two
controllers never carve one slot twice; a lost race re-plans.
"""

from __future__ import annotations

from dataclasses import dataclass

from elasticgpu.allocator import CardShare, Placement
from elasticgpu.allocator.mig import claims as mig_claims
from elasticgpu.allocator.mig import cluster
from elasticgpu.allocator.mig.placing import MigPlacement, MigUnplaceable
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
    cards = []
    for name in ledger.gpu_names():
        gpu = ledger.gpu(name)
        if gpu is not None:
            cards.append(cluster.ClusterCard(gpu, ledger.node_labels(gpu.spec.node_name), ledger.is_ready(name)))
    allocator = cluster.build(cards, models=parameters.gpu_model, node_selector=parameters.node_selector)
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
