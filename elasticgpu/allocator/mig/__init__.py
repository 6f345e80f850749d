"""MIG placement: card models, their profiles and slots, and where an instance goes.

A card in MIG mode is carved into GPU instances of fixed profiles at fixed starts
(`profiles`: NVIDIA's placement tables). `slots` keeps the rules (never two instances on one
memory slice, never a start the profile does not allow, never more compute slices than the
card has); `fragmentation` measures what the free slices can still host; `placing` chooses
card and start so that it stays able to host the profiles asked for, the largest included.

    allocator = MigAllocator(policy="fragmentation")
    allocator.add_card(MigCard(uuid="GPU-1", node="n1", index=0, model=model_for("NVIDIA A100-SXM4-80GB", 81920),
                               memory_mib=81920))
    found = allocator.place(MigRequest(cores=30))    # 3g.40gb: 2g gives 28% only
    if isinstance(found, MigPlacement):
        allocator.reserve("ns/claim-uid", found)
"""

from elasticgpu.allocator.mig.cluster import partitions_fit
from elasticgpu.allocator.mig.fragmentation import CardSlots, MigFragmentation, MigShape
from elasticgpu.allocator.mig.placing import (
    MIG_POLICIES,
    MigAllocator,
    MigCard,
    MigInstance,
    MigPlacement,
    MigPolicy,
    MigRequest,
    MigUnplaceable,
)
from elasticgpu.allocator.mig.profiles import MODELS, MigModel, Profile, by_name, model_for, profile_for
from elasticgpu.allocator.mig.slots import EMPTY, Slots

__all__ = [
    "EMPTY",
    "MIG_POLICIES",
    "MODELS",
    "CardSlots",
    "MigAllocator",
    "MigCard",
    "MigFragmentation",
    "MigInstance",
    "MigModel",
    "MigPlacement",
    "MigPolicy",
    "MigRequest",
    "MigShape",
    "MigUnplaceable",
    "Profile",
    "Slots",
    "by_name",
    "model_for",
    "partitions_fit",
    "profile_for",
]
