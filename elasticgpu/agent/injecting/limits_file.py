"""The per-claim limits file: the size a claim's running containers must enforce (docs/resize-node.md).

    host        <directory>/<namespace>_<name>/limits.json and limits.env (a claim's namespace and
                name are DNS names: `_` cannot occur in either, so the folder names one claim)
    container   the folder, bind-mounted read-only at /run/elasticgpu (the folder, not the files:
                a rename inside it is seen by the running container; a file bind mount would keep
                showing the replaced inode); ELASTICGPU_LIMITS_FILE=/run/elasticgpu/limits.json
    format      limits.json  {"claim": "ns/name", "cores": 30, "memoryMiB": 10240, "generation": 2}
                limits.env   KEY=VALUE lines for shells: ELASTICGPU_CORES=30, ELASTICGPU_MEMORY_MIB=10240,
                             ELASTICGPU_GENERATION=2, CUDA_DEVICE_SM_LIMIT(_<i>)=30,
                             CUDA_DEVICE_MEMORY_LIMIT_<i>=10240m, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30,
                             CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M
                `generation` grows by one on every change: a limiter that polls compares it.
    writes      each file to a temporary name in the folder, fsync, rename over the old one: a
                reader sees the old content or the new, never a part.

The size in effect on a card (`enforced_sizes`) is the GPU object's allocation for the claim's
ElasticGPU: its `limit` while the controller set one (a shrink under way), else its cores and
memory. The agent's holders publisher (holders.py) calls `sync` on every pass: the file of each
claim with open ledger rows says that size, the ledger records the size asked and the size
applied, and the folders of claims with no open rows are removed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elasticgpu.agent.injecting.atomic_file import write_atomically
from elasticgpu.agent.ledger.store import Allocation, LedgerStore

log = logging.getLogger(__name__)

CONTAINER_DIR = "/run/elasticgpu"
"""Where a claim container sees its claim's folder (read-only)."""
JSON_NAME = "limits.json"
ENV_NAME = "limits.env"
ENV_LIMITS_FILE = "ELASTICGPU_LIMITS_FILE"
"""Set in a claim container: the path of limits.json inside it."""
CONTAINER_FILE = f"{CONTAINER_DIR}/{JSON_NAME}"

_FOLDER = re.compile(r"^[a-z0-9.-]+_[a-z0-9.-]+$")


@dataclass(frozen=True, order=True)
class Size:
    """A claim's size on each of its cards: percent of compute and MiB of memory."""

    cores: int
    memory_mib: int

    def as_tuple(self) -> tuple[int, int]:
        """(cores, memory MiB), as the ledger keeps it."""
        return self.cores, self.memory_mib


def folder_name(namespace: str, name: str) -> str:
    """The folder of a claim: `<namespace>_<name>`."""
    return f"{namespace}_{name}"


def render_env(claim: str, size: Size, generation: int, cards: int) -> str:
    """limits.env: KEY=VALUE lines a shell can source (see the module docstring)."""
    lines = [
        "# elasticgpu: the limits of this container's claim, rewritten by the node agent when it is resized",
        f"ELASTICGPU_CLAIM={claim}",
        f"ELASTICGPU_GENERATION={generation}",
        f"ELASTICGPU_CORES={size.cores}",
        f"ELASTICGPU_MEMORY_MIB={size.memory_mib}",
    ]
    # The names of every isolation mode (MPS's and HAMi-core's read when a process starts): a process
    # started after a resize with this file sourced gets the new size, whichever mode the claim has.
    ordinals = range(max(cards, 1))
    if 0 < size.cores < 100:
        lines.append(f"CUDA_DEVICE_SM_LIMIT={size.cores}")
        lines.extend(f"CUDA_DEVICE_SM_LIMIT_{i}={size.cores}" for i in ordinals)
        lines.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={size.cores}")
    if size.memory_mib > 0:
        lines.extend(f"CUDA_DEVICE_MEMORY_LIMIT_{i}={size.memory_mib}m" for i in ordinals)
        lines.append("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=" + ",".join(f"{i}={size.memory_mib}M" for i in ordinals))
    return "\n".join(lines) + "\n"


class LimitsFiles:
    """The limits folders of this node's claims under `directory` (see the module docstring)."""

    def __init__(self, directory: Path) -> None:
        """`directory`: a folder on the node's own file system (the runtime bind-mounts from it)."""
        self.directory = directory
        self.lock = threading.Lock()
        """Held by the CRI hooks from `prepare` until the ledger row is written, and by `sync` for its
        pass: a folder being prepared for a new container is never removed as unused."""
        self.requested: dict[tuple[str, str], Size] = {}
        """Per claim with open rows, the size its allocation asks for now (as of the last `sync`): the CRI
        hooks count a resized claim at this size, not at the size its containers were created with."""

    def folder(self, namespace: str, name: str) -> Path:
        """The host folder of a claim."""
        return self.directory / folder_name(namespace, name)

    def read(self, namespace: str, name: str) -> tuple[Size, int] | None:
        """(size, generation) the claim's limits.json says, or None when there is none (or it cannot be read)."""
        try:
            data = json.loads((self.folder(namespace, name) / JSON_NAME).read_text())
            return Size(int(data["cores"]), int(data["memoryMiB"])), int(data.get("generation", 0))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write(self, namespace: str, name: str, size: Size, *, cards: int) -> int:
        """Write the claim's files atomically (limits.json last: it is the one a limiter polls); returns
        the generation written."""
        folder = self.folder(namespace, name)
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o755)  # read by any user of the container; written by the agent only
        known = self.read(namespace, name)
        generation = (known[1] + 1) if known is not None else 1
        claim = f"{namespace}/{name}"
        body = {"claim": claim, "cores": size.cores, "memoryMiB": size.memory_mib, "generation": generation}
        write_atomically(folder / ENV_NAME, render_env(claim, size, generation, cards))
        write_atomically(folder / JSON_NAME, json.dumps(body, sort_keys=True) + "\n")
        log.info("limits file of claim %s: %s%% of compute, %s MiB (generation %d)", claim, size.cores,
                 size.memory_mib, generation)  # fmt: skip
        return generation

    def prepare(self, namespace: str, name: str, size: Size, *, cards: int) -> Size:
        """Before a container of the claim is created: keep the file the running containers of the claim
        read (the publisher keeps it true), or write one with `size`. Returns the size the file says."""
        known = self.read(namespace, name)
        if known is not None:
            return known[0]
        self.write(namespace, name, size, cards=cards)
        return size

    def mount(self, namespace: str, name: str) -> tuple[str, str]:
        """(host path, container path) of the read-only mount of the claim's folder."""
        return str(self.folder(namespace, name)), CONTAINER_DIR

    def remove_except(self, keep: Iterable[tuple[str, str]]) -> list[str]:
        """Remove the folders of claims not in `keep` (no open rows: no container reads them); returns their names."""
        wanted = {folder_name(namespace, name) for namespace, name in keep}
        removed = []
        with contextlib.suppress(FileNotFoundError):
            for entry in self.directory.iterdir():
                if entry.is_dir() and _FOLDER.match(entry.name) and entry.name not in wanted:
                    shutil.rmtree(entry, ignore_errors=True)
                    removed.append(entry.name)
        return removed


def _allocation_size(allocation: Mapping[str, Any]) -> Size:
    limit = allocation.get("limit")
    if isinstance(limit, Mapping):
        return Size(int(limit.get("cores", 0)), int(limit.get("memory", 0)))
    return Size(int(allocation.get("cores", 0)), int(allocation.get("memory", 0)))


def enforced_sizes(rows: Sequence[Allocation], objects: Mapping[str, Mapping[str, Any]]) -> dict[tuple[str, str], Size]:
    """Per claim with open rows, the size its containers must enforce on each card: the allocation of its
    ElasticGPU in the cards' GPU objects (`limit` if set, else cores and memory; the smallest over its
    cards). A claim none of whose cards holds such an allocation is left out (its file stays as it is)."""
    by_uuid = {str((obj.get("spec") or {}).get("uuid") or "").lower(): obj for obj in objects.values()}
    sizes: dict[tuple[str, str], Size] = {}
    for row in rows:
        key = (row.claim_namespace, row.claim_name)
        for uuid in row.gpu_uuids:
            obj = by_uuid.get(uuid.lower())
            for allocation in ((obj or {}).get("status") or {}).get("allocations") or []:
                if allocation.get("elasticGPU") == row.elastic_gpu:
                    size = _allocation_size(allocation)
                    sizes[key] = min(sizes.get(key, size), size)
    return sizes


def sync(files: LimitsFiles | None, ledger: LedgerStore, objects: Mapping[str, Mapping[str, Any]]) -> list[Allocation]:
    """Make each claim's limits file say the size its GPU objects ask for, record both sizes in the
    ledger, remove the folders of claims without open rows. Returns the open rows as recorded.

    Without limits files (`--limits-dir ''`) the size asked is recorded all the same: usage and
    policing judge a container by it (`Allocation.size_now`), whether or not it can reach the container."""
    with files.lock if files is not None else contextlib.nullcontext():
        rows = ledger.open_allocations()
        if _sync(files, ledger, rows, objects):
            rows = ledger.open_allocations()
    return rows


def _sync(files: LimitsFiles | None, ledger: LedgerStore, rows: Sequence[Allocation],
          objects: Mapping[str, Mapping[str, Any]]) -> bool:
    # A ResourceClaim's rows (DRA's) have no ElasticGPU allocation to follow and no limits file (its size is fixed
    # for as long as it is allocated), and must not keep alive the folder of an ElasticGPUClaim of the same name.
    rows = [row for row in rows if not row.is_dra]
    sizes = enforced_sizes(rows, objects)
    if files is None:
        asked = {row.id: size for row in rows
                 if (size := sizes.get((row.claim_namespace, row.claim_name))) is not None
                 and row.requested != size.as_tuple()}
        changed = 0
        for size in set(asked.values()):
            ids = [row_id for row_id, wanted in asked.items() if wanted == size]
            changed += ledger.record_limits(ids, requested=size.as_tuple(), applied=None)
        return changed > 0
    files.requested = sizes
    by_claim: dict[tuple[str, str], list[Allocation]] = {}
    for row in rows:
        by_claim.setdefault((row.claim_namespace, row.claim_name), []).append(row)
    changed = False
    for (namespace, name), claim_rows in sorted(by_claim.items()):
        wanted = sizes.get((namespace, name))
        if wanted is None:
            continue  # no allocation seen for it (yet): nothing to ask
        with_file = [row for row in claim_rows if row.limits_file]
        known = files.read(namespace, name)
        applied: Size | None = known[0] if known is not None else None
        if with_file and applied != wanted:
            cards = max(len(row.gpu_uuids) for row in claim_rows)
            files.write(namespace, name, wanted, cards=cards)
            applied = wanted
        stale = [row.id for row in claim_rows
                 if row.requested != wanted.as_tuple() or (row.limits_file and row.applied != _tuple(applied))]
        if stale:
            changed |= ledger.record_limits(stale, requested=wanted.as_tuple(), applied=_tuple(applied)) > 0
    files.remove_except(by_claim)
    return changed


def _tuple(size: Size | None) -> tuple[int, int] | None:
    return None if size is None else size.as_tuple()
