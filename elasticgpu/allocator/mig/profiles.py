"""MIG card models and their profiles: slots, sizes and the starts each profile may take.

A MIG-capable card (A100, H100, H200) has 7 compute slices and 8 memory slices. A GPU instance
of a profile takes `compute` compute slices and `size` consecutive memory slices beginning at
one of the profile's allowed starts; NVML refuses any other start, and two instances never
share a memory slice. The tables below follow NVIDIA's published placement tables:

    NVIDIA Multi-Instance GPU User Guide, "Supported MIG Profiles"
    https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html

which give, for the A100 (40GB and 80GB), the H100 (80GB, 94GB NVL, 96GB GH200) and the H200
(141GB), one geometry with the memory named per card (A100-80GB shown; NVML's
`nvmlDeviceGetGpuInstancePossiblePlacements` returns the same starts and sizes):

    profile   compute  memory slices  starts
    1g.10gb      1          1         0 1 2 3 4 5 6   (slot 7 has no compute slice left)
    1g.20gb      1          2         0 2 4 6
    2g.20gb      2          2         0 2 4
    3g.40gb      3          4         0 4
    4g.40gb      4          4         0
    7g.80gb      7          8         0

The `+me` (media extension) variants are left out: they take the same slots as their base
profile, and no claim asks for a media engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from elasticgpu.allocator.shapes import model_matches
from elasticgpu.api import names

COMPUTE_SLICES = 7
MEMORY_SLICES = 8


@dataclass(frozen=True)
class Profile:
    """One MIG profile of a card model: its name, compute slices, memory slices, allowed starts."""

    name: str
    compute: int
    size: int
    """Consecutive memory slices the instance takes."""
    starts: tuple[int, ...]

    @property
    def mask(self) -> int:
        """The memory slices of an instance at start 0, as a bit mask (shift it by the start)."""
        return (1 << self.size) - 1

    def slots(self, start: int) -> int:
        """The memory slices of an instance at `start`, as a bit mask."""
        return self.mask << start

    @property
    def cores(self) -> int:
        """Percent of the card's compute the instance gets (rounded down: 3g is 42%)."""
        return names.CORES_PER_CARD * self.compute // COMPUTE_SLICES

    def memory_on(self, card_memory_mib: int) -> int:
        """MiB the instance gets on a card of `card_memory_mib` (its share of the memory slices)."""
        return card_memory_mib * self.size // MEMORY_SLICES

    def covers(self, *, cores: int, memory_mib: int, card_memory_mib: int) -> bool:
        """Whether an instance gives at least `cores` percent of the compute and `memory_mib` MiB."""
        return cores * COMPUTE_SLICES <= names.CORES_PER_CARD * self.compute and memory_mib <= self.memory_on(
            card_memory_mib
        )


# One geometry serves every model in the tables: (compute, memory slices, starts) per profile,
# smallest first (fewest memory slices, then fewest compute slices).
_GEOMETRY: tuple[tuple[int, int, tuple[int, ...]], ...] = (
    (1, 1, (0, 1, 2, 3, 4, 5, 6)),
    (1, 2, (0, 2, 4, 6)),
    (2, 2, (0, 2, 4)),
    (3, 4, (0, 4)),
    (4, 4, (0,)),
    (7, 8, (0,)),
)


@dataclass(frozen=True)
class MigModel:
    """A MIG-capable card model: which cards it describes and its profiles, smallest first."""

    name: str
    families: tuple[str, ...]
    """Globs of the product names NVML reports (`A100*`); the vendor prefix may be left out."""
    memory_gb: int
    """Nominal memory: among the models of one family, the one nearest the card's memory wins."""
    profiles: tuple[Profile, ...]
    compute_slices: int = COMPUTE_SLICES
    memory_slices: int = MEMORY_SLICES

    @property
    def largest(self) -> Profile:
        """The profile that takes the whole card."""
        return self.profiles[-1]

    def profile(self, name: str) -> Profile:
        """The profile of this name; `KeyError` names the model's profiles when there is none."""
        for profile in self.profiles:
            if profile.name == name:
                return profile
        raise KeyError(f"{self.name} has no MIG profile {name}; its profiles: {', '.join(self.names)}")

    @property
    def names(self) -> tuple[str, ...]:
        """Profile names, smallest first."""
        return tuple(p.name for p in self.profiles)


def _model(name: str, families: tuple[str, ...], memory_gb: int, gbs: tuple[int, ...]) -> MigModel:
    profiles = tuple(
        Profile(f"{compute}g.{gb}gb", compute, size, starts)
        for (compute, size, starts), gb in zip(_GEOMETRY, gbs, strict=True)
    )
    return MigModel(name=name, families=families, memory_gb=memory_gb, profiles=profiles)


_A100 = ("A100*", "A800*")
_H100 = ("H100*", "H800*", "GH200*")
MODELS: tuple[MigModel, ...] = (
    _model("A100-40GB", _A100, 40, (5, 10, 10, 20, 20, 40)),
    _model("A100-80GB", _A100, 80, (10, 20, 20, 40, 40, 80)),
    _model("H100-80GB", _H100, 80, (10, 20, 20, 40, 40, 80)),
    _model("H100-94GB", _H100, 94, (12, 24, 24, 47, 47, 94)),
    _model("H100-96GB", _H100, 96, (12, 24, 24, 48, 48, 96)),
    _model("H200-141GB", ("H200*",), 141, (18, 35, 35, 71, 71, 141)),
)
"""The card models elasticgpu can carve; a card of any other model cannot serve a MIG class."""


def model_for(card_model: str, memory_mib: int) -> MigModel | None:
    """The MIG model of a card (its product name as NVML reports it and its memory), or None
    when the card cannot be partitioned (no MIG, or a model the tables do not know)."""
    family = [m for m in MODELS if model_matches(card_model, m.families)]
    if not family:
        return None
    return min(family, key=lambda m: abs(m.memory_gb * 1024 - memory_mib))


def by_name(name: str) -> MigModel:
    """A model of the tables by its name (`A100-80GB`); `KeyError` lists the names."""
    for model in MODELS:
        if model.name == name:
            return model
    raise KeyError(f"no MIG model {name}; known: {', '.join(m.name for m in MODELS)}")


def profile_for(model: MigModel, *, cores: int, memory_mib: int, card_memory_mib: int) -> Profile | None:
    """The smallest profile of `model` that gives at least `cores` percent and `memory_mib` MiB on a
    card of `card_memory_mib`, or None when not even the whole card (the largest profile) does."""
    for profile in model.profiles:
        if profile.covers(cores=cores, memory_mib=memory_mib, card_memory_mib=card_memory_mib):
            return profile
    return None
