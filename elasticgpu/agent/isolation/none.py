"""Mode None: advisory. The container is told its size; nothing stops it from using more.

The limits go in as the environment MPS and HAMi-core read (so an image that preloads its own
HAMi-core, or a node whose admin runs MPS by hand, enforces them), and the limits file says the
same (docs/resize-node.md). Nothing to prepare, nothing to undo.
"""

from __future__ import annotations

from collections.abc import Sequence

from elasticgpu.agent.isolation import base

ENV_MPS_THREADS = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
ENV_MPS_MEMORY = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
ENV_HAMI_MEMORY_PREFIX = "CUDA_DEVICE_MEMORY_LIMIT"  # _<i>, and the bare name (all devices)
ENV_HAMI_SM = "CUDA_DEVICE_SM_LIMIT"  # and _<i>


def mps_env(slice_: base.Slice) -> list[tuple[str, str]]:
    """MPS's per-client limits: compute percent and pinned memory per device ordinal of the container.
    A memory-only slice (0 cores) reserved no compute: no compute limit (0 would starve it)."""
    envs = []
    if slice_.cores > 0:
        envs.append((ENV_MPS_THREADS, str(slice_.cores)))
    if slice_.memory_mib > 0:
        envs.append((ENV_MPS_MEMORY, ",".join(f"{i}={slice_.memory_mib}M" for i in range(len(slice_.uuids)))))
    return envs


def hami_env(slice_: base.Slice, *, per_device_sm: bool) -> list[tuple[str, str]]:
    """HAMi-core's limits per device ordinal of the container (`per_device_sm`: also CUDA_DEVICE_SM_LIMIT_<i>)."""
    envs = []
    if slice_.cores > 0:
        envs.append((ENV_HAMI_SM, str(slice_.cores)))
        if per_device_sm:
            envs.extend((f"{ENV_HAMI_SM}_{i}", str(slice_.cores)) for i in range(len(slice_.uuids)))
    if slice_.memory_mib > 0:
        envs.extend((f"{ENV_HAMI_MEMORY_PREFIX}_{i}", f"{slice_.memory_mib}m") for i in range(len(slice_.uuids)))
    return envs


class NoneRoom:
    """base.Room of mode None (see the module docstring)."""

    mode = base.MODE_NONE

    def problem(self) -> str | None:
        """Always available."""
        return None

    def prepare(self, slice_: base.Slice) -> str | None:
        """Nothing to prepare, nothing to warn of."""
        return None

    def contribute(self, slice_: base.Slice) -> base.Contribution:
        """Both mechanisms' names, advisory: only a limiter the image or node brings enforces them."""
        return base.Contribution(envs=(*mps_env(slice_), *hami_env(slice_, per_device_sm=False)))

    def sync(self, containers: Sequence[base.RunningContainer]) -> None:
        """Nothing to undo."""

    def close(self) -> None:
        """Nothing to stop."""
