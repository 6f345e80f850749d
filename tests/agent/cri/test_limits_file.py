"""The limits file's pure parts: the size a claim must enforce, the files' format, their atomic writes."""

from __future__ import annotations

import json
import stat
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from elasticgpu.agent.injecting import limits_file
from elasticgpu.agent.injecting.limits_file import LimitsFiles, Size
from elasticgpu.agent.ledger.store import Allocation


def row(claim: str, egpu: str, *uuids: str, row_id: int = 1) -> Allocation:
    return Allocation(
        id=row_id, state="created", container_id=f"c{row_id}", pod_uid="u", pod_namespace="ns", pod_name="p",
        container_name="main", claim_namespace="ns", claim_name=claim, elastic_gpu=egpu, gpu_uuids=uuids, cores=30,
        memory_mib=10240, started_at=datetime(2026, 1, 1, tzinfo=UTC), created_at=None, released_at=None,
    )  # fmt: skip


def gpu(uuid: str, *allocations: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"uuid": uuid}, "status": {"allocations": list(allocations)}}


def test_the_enforced_size_is_the_limit_else_the_reservation() -> None:
    objects = {
        "gpu-a": gpu("GPU-A", {"elasticGPU": "egpu-x", "cores": 30, "memory": 10240},
                     {"elasticGPU": "egpu-y", "cores": 50, "memory": 8192, "limit": {"cores": 20, "memory": 4096}}),
        "gpu-b": gpu("GPU-B", {"elasticGPU": "egpu-z", "cores": 100, "memory": 81920, "exclusive": True}),
    }  # fmt: skip
    rows = [row("x", "egpu-x", "GPU-A"), row("y", "egpu-y", "gpu-a"), row("z", "egpu-z", "GPU-B"),
            row("gone", "egpu-gone", "GPU-A")]  # fmt: skip
    assert limits_file.enforced_sizes(rows, objects) == {
        ("ns", "x"): Size(30, 10240), ("ns", "y"): Size(20, 4096), ("ns", "z"): Size(100, 81920),
    }  # fmt: skip


def test_files_are_replaced_whole_and_count_generations(tmp_path: Path) -> None:
    files = LimitsFiles(tmp_path / "limits")
    assert files.read("ns", "train") is None
    assert files.prepare("ns", "train", Size(30, 10240), cards=1) == Size(30, 10240)
    assert files.prepare("ns", "train", Size(99, 1), cards=1) == Size(30, 10240)  # kept: running containers read it
    assert files.write("ns", "train", Size(20, 4096), cards=2) == 2
    folder = files.folder("ns", "train")
    assert json.loads((folder / "limits.json").read_text()) == {"claim": "ns/train", "cores": 20, "memoryMiB": 4096,
                                                                "generation": 2}  # fmt: skip
    env = (folder / "limits.env").read_text().splitlines()
    assert {"ELASTICGPU_CORES=20", "ELASTICGPU_MEMORY_MIB=4096", "ELASTICGPU_GENERATION=2", "CUDA_DEVICE_SM_LIMIT=20",
            "CUDA_DEVICE_MEMORY_LIMIT_0=4096m", "CUDA_DEVICE_MEMORY_LIMIT_1=4096m"} <= set(env)  # fmt: skip
    # MPS's names too (issue 25): a process started after a resize with the file sourced gets the new size.
    assert {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=20", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M,1=4096M",
            "CUDA_DEVICE_SM_LIMIT_1=20"} <= set(env)  # fmt: skip
    assert sorted(p.name for p in folder.iterdir()) == ["limits.env", "limits.json"]  # no temporary file left
    assert stat.S_IMODE((folder / "limits.json").stat().st_mode) == 0o644
    assert files.mount("ns", "train") == (str(folder), "/run/elasticgpu")


def test_only_folders_of_claims_without_rows_are_removed(tmp_path: Path) -> None:
    files = LimitsFiles(tmp_path)
    for name in ("a", "b"):
        files.write("ns", name, Size(10, 1024), cards=1)
    (tmp_path / "not-ours").mkdir()
    assert files.remove_except([("ns", "a")]) == ["ns_b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-ours", "ns_a"]
