"""What a claim of a `partitioning: MIG` class becomes on a card: its profile and what it gets.

A slice claim maps to the smallest profile of the card's model that covers its cores and its
memory (the memory in proportion to the cores when it names none); whole cards map to the
largest profile, one per card. The instance then has the profile's compute and memory slices,
usually more than was asked: that is what is reserved, shown in the claim's status and
counted by quota. A request that no profile covers, not even the whole card, never fits.
"""

from __future__ import annotations

from dataclasses import dataclass

from elasticgpu.allocator.mig.placing import MigRequest
from elasticgpu.allocator.mig.profiles import MigModel, Profile, model_for
from elasticgpu.api.quantities import format_memory
from elasticgpu.api.resources import GpuRequest


@dataclass(frozen=True)
class MigSize:
    """The profile a request takes on a card, and what the instance has there."""

    profile: Profile
    cores: int
    """Percent of the card's compute (the profile's compute slices of 7, rounded down)."""
    memory_mib: int
    """MiB of the card's memory (the profile's memory slices of 8)."""


def mig_request(request: GpuRequest) -> MigRequest:
    """The placement request of a claim's GPU request."""
    if request.is_whole:
        return MigRequest(cores=100, cards=request.cards)
    return MigRequest(cores=request.cores, memory_mib=request.memory_mib)


def size_on(request: GpuRequest, *, card_model: str, card_memory_mib: int) -> MigSize | str:
    """The instance `request` gets on a card of this model and memory, or why it cannot get one
    there (the card has no MIG model, or no profile covers the request: naming the largest)."""
    model = model_for(card_model, card_memory_mib)
    if model is None:
        return f"{card_model} cannot be partitioned with MIG; use cards such as A100, H100 or H200"
    profile = mig_request(request).profile_on(model, card_memory_mib)
    if profile is None:
        return never_covered(request, model, card_memory_mib)
    return MigSize(profile, profile.cores, profile.memory_on(card_memory_mib))


def never_covered(request: GpuRequest, model: MigModel, card_memory_mib: int) -> str:
    """Why no profile of `model` covers `request`, naming the largest and what it gives."""
    largest = model.largest
    return (f"no MIG profile of {model.name} covers {request.describe()}: the largest is {largest.name}"
            f" ({largest.cores}% cores, {format_memory(largest.memory_on(card_memory_mib))}); ask for at most"
            " that, or use a class without partitioning")
