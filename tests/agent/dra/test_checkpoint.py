"""The DRA checkpoint: entries survive a new reader (an agent restart), a damaged file is refused
with the fix, never silently taken as empty (that would unprepare claims whose containers run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from elasticgpu.agent.dra import checkpoint


def entry(uid: str, state: str = checkpoint.COMPLETED) -> checkpoint.ClaimEntry:
    device = checkpoint.PreparedDevice(requests=("gpu",), pool="node-a", device="gpu-0", uuid="GPU-0",
                                       cdi_ids=("elasticgpu.io/gpu=GPU-0",), cores=30, memory_mib=1024,
                                       share_id="s-1")  # fmt: skip
    return checkpoint.ClaimEntry(uid=uid, namespace="ns", name="c", state=state, devices=(device,), pods=("p-1",))


def test_entries_survive_a_new_reader(tmp_path: Path) -> None:
    checkpoint.Checkpoint(tmp_path / "cp.json").put(entry("u-1"))
    checkpoint.Checkpoint(tmp_path / "cp.json").put(entry("u-2", checkpoint.STARTED))
    again = checkpoint.Checkpoint(tmp_path / "cp.json")
    assert again.get("u-1") == entry("u-1")
    assert again.get("u-2") == entry("u-2", checkpoint.STARTED)
    again.remove("u-1")
    again.remove("u-unknown")
    assert set(checkpoint.Checkpoint(tmp_path / "cp.json").entries()) == {"u-2"}


def test_a_tampered_file_is_refused_naming_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "cp.json"
    checkpoint.Checkpoint(path).put(entry("u-1"))
    document = json.loads(path.read_text())
    document["claims"]["u-1"]["devices"][0]["cores"] = 100
    path.write_text(json.dumps(document))
    with pytest.raises(checkpoint.CheckpointCorrupt, match="checksum; move it aside"):
        checkpoint.Checkpoint(path).entries()
    path.write_text("{half")
    with pytest.raises(checkpoint.CheckpointCorrupt, match="not JSON"):
        checkpoint.Checkpoint(path).get("u-1")
