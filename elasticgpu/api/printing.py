"""Status fields that exist for `kubectl get` alone, computed in one place.

A printer column shows one value found by a JSON path: it cannot join a list, join two fields or
convert MiB to `80Gi`. So the writers of each status (the controller; the node agent for GPUs)
also write a short text of what they already write, with these functions, and the columns in
`kinds.py` print that text.
"""

from __future__ import annotations

from collections.abc import Iterable

from elasticgpu.api import names
from elasticgpu.api.meta import ObjectReference
from elasticgpu.api.quantities import format_memory


def gpu_capacity(memory_mib: int) -> dict[str, int | str]:
    """`status.capacity` of a GPU whose card has `memory_mib` MiB: `{gpu-core: 100, gpu-memory: 80Gi}`.
    Its memory is the GPU's MEMORY column, in the units claims and ElasticGPUs show."""
    return {names.RESOURCE_CORE: names.CORES_PER_CARD, names.RESOURCE_MEMORY: format_memory(memory_mib)}


def allocatable_summary(cores: int, memory_mib: int) -> str:
    """`status.allocatableSummary` of a GPU (its ALLOCATABLE column): free cores (percent of the
    card) and free memory, e.g. `70%/40Gi`; `0%/0Mi` when reserved whole."""
    return f"{cores}%/{format_memory(memory_mib)}"


def gpu_list(uuids: Iterable[str]) -> str:
    """`status.gpuList` of an ElasticGPU (its GPUS column): `status.gpus` joined by commas."""
    return ",".join(uuids)


def claim_key(ref: ObjectReference) -> str:
    """`status.claim` of an ElasticGPU (its CLAIM column): `namespace/name` of `spec.claimRef`."""
    return f"{ref.namespace}/{ref.name}" if ref.namespace else ref.name or ""
