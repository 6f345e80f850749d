"""`elasticgpu plan` for claims of `partitioning: MIG` classes: a MIG instance's profile, card and start.

The controller's placement (controller/flow/mig_binding.py) without a cluster: the MIG cards
are the GPU objects whose agent reports MIG mode (`spec.mig: true`; the short node list has no
MIG cards), with the instances their `status.allocations[].partition` already hold; each claim
is placed by `allocator.mig` (the least-fragmenting card and start) among the cards its class
may use, and what earlier claims of the plan took stays taken across classes. A planned claim
reserves its profile's cores and memory (usually more than asked: what quota counts), and its
row says which instance it gets ("MIG 3g.40gb at slice 4 of GPU-...").

A card in MIG mode serves MIG classes only: `soft_record` keeps soft slices off it in the plan's
ordinary inventory, as the controller does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from elasticgpu.allocator import CardRecord, CardShare, Health, Placement
from elasticgpu.allocator.mig import MigPlacement, MigUnplaceable, cluster, model_for
from elasticgpu.allocator.mig import claims as mig_claims
from elasticgpu.api import GPU, GpuRequest
from elasticgpu.api.gpu_class import ClassParameters


def soft_record(gpu: GPU) -> CardRecord:
    """The plan's soft-slice view of a GPU object: a card in MIG mode takes no soft slice (Unhealthy to it)."""
    record = CardRecord.from_gpu(gpu)
    return dataclasses.replace(record, health=Health.UNHEALTHY) if gpu.spec.mig else record


@dataclass(frozen=True)
class MigPending:
    """Why a MIG claim stays Pending; `never` when no card of the class could ever hold it (NeverFits)."""

    reason: str
    never: bool = False


class MigPlanner:
    """The plan's MIG cards and the instances its claims took so far."""

    def __init__(self, gpus: Sequence[GPU], node_labels: Mapping[str, Mapping[str, str]] | None = None) -> None:
        """`gpus`: the GPU objects read (cards not in MIG mode are left out); `node_labels`: their nodes' labels."""
        labels = node_labels or {}
        self._cards = [cluster.ClusterCard(g, labels.get(g.spec.node_name, {})) for g in gpus if g.spec.mig]
        self._memory = {g.spec.uuid: (g.spec.model, g.spec.memory) for g in gpus}
        self._planned: dict[str, MigPlacement] = {}
        self.instances: dict[str, MigPlacement] = {}
        """The instances of the claims placed, by claim key."""

    def allocate(self, key: str, request: GpuRequest, parameters: ClassParameters) -> Placement | MigPending:
        """Place claim `key` under a class with these parameters and keep it; the reservation, or why not."""
        allocator = cluster.build(self._cards, models=parameters.gpu_model, node_selector=parameters.node_selector)
        known = {card.uuid for card in allocator.cards()}
        for other, placement in self._planned.items():
            if all(i.uuid in known for i in placement.instances):
                allocator.reserve(other, placement)  # the plan's earlier claims hold their slots
        found = allocator.place(mig_claims.mig_request(request))
        if isinstance(found, MigUnplaceable):
            reason = found.reason
            if found.never:
                for card in allocator.cards():  # name the largest profile, as the controller does
                    reason = mig_claims.never_covered(request, card.model, card.memory_mib)
                    break
            return MigPending(reason, never=found.never)
        self._planned[key] = self.instances[key] = found
        return self._reservation(found)

    def release(self, key: str) -> None:
        """Give back what `key` took (a quota refused it)."""
        self._planned.pop(key, None)
        self.instances.pop(key, None)

    def describe(self, key: str) -> str:
        """The instances of `key`, e.g. `MIG 3g.40gb at slice 4 of GPU-1`."""
        placement = self.instances.get(key)
        if placement is None:
            return ""
        return "MIG " + ", ".join(f"{i.profile} at slice {i.start} of {i.uuid}" for i in placement.instances)

    def _reservation(self, found: MigPlacement) -> Placement:
        # As the controller commits it: the profile's share; the largest profile is the whole card.
        shares = []
        for instance in found.instances:
            card_model, memory = self._memory[instance.uuid]
            model = model_for(card_model, memory)
            assert model is not None  # the allocator holds only cards with MIG tables
            profile = model.profile(instance.profile)
            whole = profile is model.largest
            shares.append(CardShare(uuid=instance.uuid, cores=100 if whole else profile.cores,
                                    memory_mib=profile.memory_on(memory), whole=whole))
        return Placement(node=found.node, cards=tuple(shares))
