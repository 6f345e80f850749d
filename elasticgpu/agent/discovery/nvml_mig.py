"""MIG through NVML (`MigControl` of the NVML backend): profiles, placements, instances.

Follows nvidia-ml-py's API, the calls `nvidia-smi mig` makes:

    profiles   nvmlDeviceGetGpuInstanceProfileInfo (each profile kind: its NVML id and name, e.g.
               "MIG 3g.40gb") and nvmlDeviceGetGpuInstancePossiblePlacements_v2 (its starts)
    instances  nvmlDeviceGetGpuInstances per profile, nvmlGpuInstanceGetInfo (id, placement),
               the MIG device handles (nvmlDeviceGetMigDeviceHandleByIndex) for the `MIG-` uuid
               and the compute instance id, the nvidia-caps minors for its access devices
    create     nvmlDeviceCreateGpuInstanceWithPlacement at the start's placement, then one
               compute instance over all of it (nvmlGpuInstanceCreateComputeInstance); the GPU
               instance is destroyed again when the compute instance cannot be made
    destroy    nvmlComputeInstanceDestroy of its compute instances, nvmlGpuInstanceDestroy

NVML's errors become the agent's (`mig_error`): NOT_SUPPORTED -> MigNotEnabled, INVALID_ARGUMENT
-> MigInvalidPlacement, INSUFFICIENT_RESOURCES -> MigInsufficientResources, IN_USE -> MigInUse,
NOT_FOUND -> MigNotFound, anything else (NO_PERMISSION: the agent needs CAP_SYS_ADMIN) MigError.
The NVML module is passed in (nvml.py loads it); this file imports no NVML itself. Not run on a
card yet: only the error translation and the minors' parsing are tested (no GPU here).
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

from elasticgpu.agent import errors
from elasticgpu.agent.discovery.mig import MigInstanceInfo, MigProfileInfo

_GI_PROFILES = ("1_SLICE", "1_SLICE_REV1", "1_SLICE_REV2", "2_SLICE", "3_SLICE", "4_SLICE", "7_SLICE")
"""NVML's GPU instance profile kinds (NVML_GPU_INSTANCE_PROFILE_*) of the profiles elasticgpu carves."""
_CI_PROFILES = {1: "1_SLICE", 2: "2_SLICE", 3: "3_SLICE", 4: "4_SLICE", 7: "7_SLICE"}
"""The compute instance profile kind that takes all of a GPU instance of that many compute slices."""
MIG_MINORS = Path("/proc/driver/nvidia-caps/mig-minors")
CAPS_DIR = "/dev/nvidia-caps"
_MAX_PLACEMENTS = 8  # a card has 8 memory slices: no profile has more starts


def mig_error(error: Exception, what: str, nvml: Any) -> errors.MigError:
    """The agent's MIG error for an NVML error raised while doing `what` (see the module docstring)."""
    value = getattr(error, "value", None)
    kinds: dict[Any, type[errors.MigError]] = {
        nvml.NVML_ERROR_NOT_SUPPORTED: errors.MigNotEnabled,
        nvml.NVML_ERROR_INVALID_ARGUMENT: errors.MigInvalidPlacement,
        nvml.NVML_ERROR_INSUFFICIENT_RESOURCES: errors.MigInsufficientResources,
        nvml.NVML_ERROR_IN_USE: errors.MigInUse,
        nvml.NVML_ERROR_NOT_FOUND: errors.MigNotFound,
    }
    hints = {
        nvml.NVML_ERROR_NOT_SUPPORTED: "; the card is not in MIG mode (an admin enables it: nvidia-smi -i <index>"
                                       " -mig 1, then a reset)",
        nvml.NVML_ERROR_IN_USE: "; processes still run on it: stop them first",
        nvml.NVML_ERROR_NO_PERMISSION: "; carving MIG instances needs root (CAP_SYS_ADMIN) in the agent's container",
    }
    return kinds.get(value, errors.MigError)(f"{what}: NVML: {error}{hints.get(value, '')}")


def mig_minors(text: str) -> dict[str, int]:
    """The nvidia-caps minors in /proc/driver/nvidia-caps/mig-minors (`gpu0/gi1/access 12` -> that key: 12)."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            found[parts[0]] = int(parts[1])
    return found


def access_paths(minors: dict[str, int], *, card_minor: int, gpu_instance_id: int,
                 compute_instance_id: int) -> tuple[str, ...]:
    """The nvidia-caps device nodes a container needs for one GPU instance and its compute instance."""
    instance = f"gpu{card_minor}/gi{gpu_instance_id}"
    keys = (f"{instance}/access", f"{instance}/ci{compute_instance_id}/access")
    return tuple(f"{CAPS_DIR}/nvidia-cap{minors[key]}" for key in keys if key in minors)


class NvmlMig:
    """The MIG calls on one NVML module (the backend holds its lock around them)."""

    def __init__(self, nvml: Any, minors_file: Path = MIG_MINORS) -> None:
        self._nvml = nvml
        self._minors_file = minors_file

    def _call(self, what: str, function: Any, *args: Any) -> Any:
        try:
            return function(*args)
        except self._nvml.NVMLError as e:
            raise mig_error(e, what, self._nvml) from None

    def _profiles(self, handle: Any, card_uuid: str) -> list[tuple[Any, str]]:
        """(NVML's profile info, its name without "MIG ") of every profile kind the card has."""
        nvml, found = self._nvml, []
        mode = self._call(f"card {card_uuid}: reading its MIG mode", nvml.nvmlDeviceGetMigMode, handle)
        if not mode or mode[0] != nvml.NVML_DEVICE_MIG_ENABLE:
            raise errors.MigNotEnabled(f"card {card_uuid} is not in MIG mode; an admin enables it (nvidia-smi -i"
                                       " <index> -mig 1, then a reset)")
        for kind in _GI_PROFILES:
            try:
                info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(
                    handle, getattr(nvml, f"NVML_GPU_INSTANCE_PROFILE_{kind}"))
            except nvml.NVMLError:
                continue  # a profile kind this card or driver does not have
            name = info.name.decode() if isinstance(info.name, bytes) else str(info.name)
            found.append((info, name.removeprefix("MIG ").strip()))
        return found

    def _placements(self, handle: Any, profile_id: int, card_uuid: str) -> list[Any]:
        nvml = self._nvml
        placements = (nvml.c_nvmlGpuInstancePlacement_t * _MAX_PLACEMENTS)()
        count = ctypes.c_uint(_MAX_PLACEMENTS)
        self._call(f"card {card_uuid}: listing the placements of profile {profile_id}",
                   nvml.nvmlDeviceGetGpuInstancePossiblePlacements, handle, profile_id, placements, ctypes.byref(count))
        return list(placements[: count.value])

    def profiles(self, handle: Any, card_uuid: str) -> list[MigProfileInfo]:
        """The card's profiles with their allowed starts."""
        out = []
        for info, name in self._profiles(handle, card_uuid):
            placements = self._placements(handle, int(info.id), card_uuid)
            out.append(MigProfileInfo(
                name=name, profile_id=int(info.id), compute_slices=int(info.sliceCount),
                memory_slices=int(placements[0].size) if placements else 0, memory_mib=int(info.memorySizeMB),
                starts=tuple(sorted(int(p.start) for p in placements))))
        return out

    def instances(self, handle: Any, card_uuid: str, card_minor: int) -> list[MigInstanceInfo]:
        """The card's GPU instances (with their `MIG-` uuid and access devices), by id."""
        nvml = self._nvml
        devices = self._mig_devices(handle)
        minors = mig_minors(self._minors_file.read_text()) if self._minors_file.exists() else {}
        found: dict[int, MigInstanceInfo] = {}
        for info, name in self._profiles(handle, card_uuid):
            instances = (nvml.c_nvmlGpuInstance_t * _MAX_PLACEMENTS)()
            count = ctypes.c_uint(_MAX_PLACEMENTS)
            self._call(f"card {card_uuid}: listing its {name} instances", nvml.nvmlDeviceGetGpuInstances, handle,
                       int(info.id), instances, ctypes.byref(count))
            for gi in instances[: count.value]:
                gi_info = self._call(f"card {card_uuid}: reading a GPU instance", nvml.nvmlGpuInstanceGetInfo, gi)
                gi_id = int(gi_info.id)
                uuid, ci_id = devices.get(gi_id, ("", 0))
                found[gi_id] = MigInstanceInfo(
                    card_uuid=card_uuid, gpu_instance_id=gi_id, profile=name, start=int(gi_info.placement.start),
                    size=int(gi_info.placement.size), uuid=uuid,
                    device_paths=access_paths(minors, card_minor=card_minor, gpu_instance_id=gi_id,
                                              compute_instance_id=ci_id))
        return [found[i] for i in sorted(found)]

    def _mig_devices(self, handle: Any) -> dict[int, tuple[str, int]]:
        """GPU instance id -> (MIG uuid, compute instance id) of the card's MIG devices."""
        nvml, found = self._nvml, {}
        for index in range(int(self._call("counting MIG devices", nvml.nvmlDeviceGetMaxMigDeviceCount, handle))):
            try:
                device = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
            except nvml.NVMLError:
                continue  # no MIG device at this index
            uuid = nvml.nvmlDeviceGetUUID(device)
            text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            compute_instance_id = int(nvml.nvmlDeviceGetComputeInstanceId(device))
            found[int(nvml.nvmlDeviceGetGpuInstanceId(device))] = (text, compute_instance_id)
        return found

    def create(self, handle: Any, card_uuid: str, *, profile: str, start: int) -> int:
        """Create a GPU instance of `profile` at `start` and one compute instance over it; returns its id."""
        nvml = self._nvml
        chosen = [info for info, name in self._profiles(handle, card_uuid) if name == profile]
        if not chosen:
            raise errors.MigInvalidPlacement(f"card {card_uuid} has no MIG profile {profile}")
        info = chosen[0]
        at = [p for p in self._placements(handle, int(info.id), card_uuid) if int(p.start) == start]
        if not at:
            raise errors.MigInvalidPlacement(f"card {card_uuid}: {profile} may not start at memory slice {start}")
        what = f"card {card_uuid}: creating {profile} at slice {start}"
        gi = self._call(what, nvml.nvmlDeviceCreateGpuInstanceWithPlacement, handle, int(info.id), at[0])
        try:
            kind = getattr(nvml, f"NVML_COMPUTE_INSTANCE_PROFILE_{_CI_PROFILES[int(info.sliceCount)]}")
            ci_info = self._call(what, nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, kind,
                                 nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            self._call(what, nvml.nvmlGpuInstanceCreateComputeInstance, gi, int(ci_info.id))
        except BaseException:
            self._call(f"{what}: undoing the GPU instance", nvml.nvmlGpuInstanceDestroy, gi)
            raise
        return int(self._call(what, nvml.nvmlGpuInstanceGetInfo, gi).id)

    def destroy(self, handle: Any, card_uuid: str, gpu_instance_id: int) -> None:
        """Destroy a GPU instance's compute instances, then it."""
        nvml = self._nvml
        what = f"card {card_uuid}: destroying GPU instance {gpu_instance_id}"
        gi = self._call(what, nvml.nvmlDeviceGetGpuInstanceById, handle, gpu_instance_id)
        for kind in _CI_PROFILES.values():
            try:
                ci_info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, getattr(nvml, f"NVML_COMPUTE_INSTANCE_PROFILE_{kind}"),
                    nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            except nvml.NVMLError:
                continue  # a compute profile this GPU instance cannot have
            cis = (nvml.c_nvmlComputeInstance_t * _MAX_PLACEMENTS)()
            count = ctypes.c_uint(_MAX_PLACEMENTS)
            self._call(what, nvml.nvmlGpuInstanceGetComputeInstances, gi, int(ci_info.id), cis, ctypes.byref(count))
            for ci in cis[: count.value]:
                self._call(what, nvml.nvmlComputeInstanceDestroy, ci)
        self._call(what, nvml.nvmlGpuInstanceDestroy, gi)
