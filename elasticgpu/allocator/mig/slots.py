"""What a MIG card's slots hold: the rules an instance must keep, and what stays free.

A card's state is a `Slots` pair: the memory slices in use (a bit mask over the 8 slices) and
the compute slices in use. It is small and hashable, so every measure over it is memoised.
"""

from __future__ import annotations

from typing import NamedTuple

from elasticgpu.allocator.mig.profiles import MigModel, Profile


class Slots(NamedTuple):
    """The slices of one card in use: `memory` as a bit mask, `compute` as a count."""

    memory: int = 0
    compute: int = 0


EMPTY = Slots()


def why_not(model: MigModel, slots: Slots, profile: Profile, start: int) -> str:
    """Why an instance of `profile` cannot start at memory slice `start` of a card in `slots`, or ""."""
    if profile not in model.profiles:
        return f"{model.name} has no profile {profile.name}"
    if start not in profile.starts:
        return f"{profile.name} may start only at slice {', '.join(map(str, profile.starts))}, not {start}"
    if slots.memory & profile.slots(start):
        return f"memory slices {start}..{start + profile.size - 1} are taken by another instance"
    if slots.compute + profile.compute > model.compute_slices:
        free = model.compute_slices - slots.compute
        return f"{profile.name} needs {profile.compute} compute slices, {free} are free"
    return ""


def fits(model: MigModel, slots: Slots, profile: Profile, start: int) -> bool:
    """Whether an instance of `profile` can start at `start` on a card in `slots`."""
    return (
        start in profile.starts
        and not slots.memory & profile.slots(start)
        and slots.compute + profile.compute <= model.compute_slices
    )


def free_starts(model: MigModel, slots: Slots, profile: Profile) -> tuple[int, ...]:
    """The starts where an instance of `profile` fits now, ascending."""
    if slots.compute + profile.compute > model.compute_slices:
        return ()
    return tuple(s for s in profile.starts if not slots.memory & profile.slots(s))


def taking(slots: Slots, profile: Profile, start: int) -> Slots:
    """The state after an instance of `profile` starts at `start` (checked by `fits` first)."""
    return Slots(slots.memory | profile.slots(start), slots.compute + profile.compute)


def giving_back(slots: Slots, profile: Profile, start: int) -> Slots:
    """The state after the instance of `profile` at `start` is destroyed."""
    return Slots(slots.memory & ~profile.slots(start), slots.compute - profile.compute)


def free_memory(model: MigModel, slots: Slots) -> int:
    """Memory slices nobody holds."""
    return model.memory_slices - slots.memory.bit_count()


def capacity(model: MigModel, slots: Slots, profile: Profile) -> int:
    """How many more instances of `profile` the card could still host.

    The instances of one profile all have one size, so taking the lowest free start each time
    is a maximum packing (earliest end first, for intervals of equal length); the free compute
    slices then cap the count.
    """
    memory = slots.memory
    count = 0
    for start in profile.starts:
        taken = profile.slots(start)
        if not memory & taken:
            memory |= taken
            count += 1
    return min(count, (model.compute_slices - slots.compute) // profile.compute)
