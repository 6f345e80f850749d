"""What discovery reports and does about MIG: profiles, placements and instances of a card.

MIG mode itself is the admin's choice (it needs a card reset) and is reported per card
(`Card.mig_enabled`, the GPU object's `spec.mig`); the agent never changes it. On a card in
MIG mode a backend that implements `MigControl` lists the profiles with the starts NVML allows
(`nvmlDeviceGetGpuInstancePossiblePlacements`), lists the instances, and creates or destroys a
GPU instance (with one compute instance over all of it), raising the `errors.MigError` of the
NVML error it got: insufficient resources, in use, not found, invalid placement, not enabled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

NVML_PROFILE_IDS = (19, 15, 14, 9, 5, 0)
"""NVML's GPU instance profile ids (`nvidia-smi mig -lgip`, column ID) of the profiles of
`elasticgpu.allocator.mig.profiles`, smallest first: 1g (one memory slice), 1g (two), 2g, 3g,
4g, 7g."""


@dataclass(frozen=True, kw_only=True)
class MigProfileInfo:
    """One GPU instance profile of a card, with where it may start."""

    name: str
    """e.g. `3g.40gb`."""
    profile_id: int
    """NVML's GPU instance profile id."""
    compute_slices: int
    memory_slices: int
    memory_mib: int
    starts: tuple[int, ...]
    """The memory slices an instance of the profile may start at."""


@dataclass(frozen=True, kw_only=True)
class MigInstanceInfo:
    """One GPU instance on a card (with its one compute instance)."""

    card_uuid: str
    gpu_instance_id: int
    profile: str
    start: int
    size: int
    """Memory slices it takes from `start`."""
    uuid: str
    """The instance's uuid as CUDA and NVIDIA_VISIBLE_DEVICES name it (`MIG-...`)."""
    device_paths: tuple[str, ...]
    """Device nodes a container needs for it besides the card's (the nvidia-caps access files)."""


@runtime_checkable  # the agent installs its MIG hooks where the backend has these calls (agent/mig/room.py)
class MigControl(Protocol):
    """The MIG calls of a discovery backend (the only place the agent carves cards)."""

    def mig_profiles(self, card_uuid: str) -> list[MigProfileInfo]:
        """The card's profiles and their allowed starts; `MigNotEnabled` when not in MIG mode."""
        ...

    def mig_instances(self, card_uuid: str) -> list[MigInstanceInfo]:
        """The card's GPU instances, by id; `MigNotEnabled` when not in MIG mode."""
        ...

    def create_mig_instance(self, card_uuid: str, *, profile: str, start: int) -> MigInstanceInfo:
        """Create a GPU instance of `profile` at memory slice `start`, and its compute instance."""
        ...

    def destroy_mig_instance(self, card_uuid: str, gpu_instance_id: int) -> None:
        """Destroy a GPU instance and its compute instances; `MigInUse` while a process runs on it."""
        ...
