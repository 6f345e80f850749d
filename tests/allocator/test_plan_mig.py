"""`elasticgpu plan` plans claims of `partitioning: MIG` classes as MIG instances (issue 26): the profile,
the card and the start slice, next to the instances the GPU objects already hold; soft slices never land
on a card in MIG mode; a request no profile covers stays Pending naming the largest profile."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import yaml

from elasticgpu import plan

A100 = "NVIDIA A100-SXM4-80GB"


def gpu(index: int, *, mig: bool, allocations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"apiVersion": "elasticgpu.io/v1alpha1", "kind": "GPU", "metadata": {"name": f"gpu-{index}"},
            "spec": {"index": index, "uuid": f"GPU-{index}", "model": A100, "memory": 81920, "nodeName": "n1",
                     "mig": mig},
            "status": {"allocations": allocations or []}}  # fmt: skip


def klass(name: str, **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "elasticgpu.io/v1alpha1", "kind": "ElasticGPUClass", "metadata": {"name": name},
            "provisioner": "elasticgpu.io/gpushare", **extra}  # fmt: skip


def claim(name: str, klass_name: str, **requests: Any) -> dict[str, Any]:
    return {"apiVersion": "elasticgpu.io/v1alpha1", "kind": "ElasticGPUClaim",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"elasticGPUClassName": klass_name,
                     "resources": {"requests": {f"elasticgpu.io/{k.replace('_', '-')}": v
                                                for k, v in requests.items()}}}}  # fmt: skip


def run(capsys: pytest.CaptureFixture[str], path: Path) -> dict[str, str]:
    parser = argparse.ArgumentParser()
    plan.add_arguments(parser)
    plan.run(parser.parse_args(["-f", str(path)]))
    out = capsys.readouterr().out
    return {line.split()[1]: line for line in out.splitlines()[1:]}


def test_plan_places_mig_claims_as_instances_beside_the_ones_held(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    held = {"elasticGPU": "egpu-held", "cores": 42, "memory": 40960, "partition": {"profile": "3g.40gb", "start": 4}}
    docs = [
        gpu(0, mig=True, allocations=[held]), gpu(1, mig=False),
        klass("mig", partitioning="MIG", parameters={"gpuModel": "A100*"}), klass("soft"),
        claim("first", "mig", gpu_core=30),          # 3g.40gb: its only free start is 0
        claim("soft-slice", "soft", gpu_core=30),    # never on the MIG card
        claim("no-room", "mig", gpu_core=10),        # every memory slice of GPU-0 is taken now
        claim("too-big", "mig", gpu_core=50, gpu_memory="90000Mi"),
    ]  # fmt: skip
    (tmp_path / "in.yaml").write_text(yaml.safe_dump_all(docs))
    lines = run(capsys, tmp_path / "in.yaml")
    assert "Bound" in lines["first"] and lines["first"].endswith("MIG 3g.40gb at slice 0 of GPU-0")
    assert "Bound" in lines["soft-slice"] and "GPU-1" in lines["soft-slice"] and "GPU-0" not in lines["soft-slice"]
    assert "Pending" in lines["no-room"]
    assert "Pending" in lines["too-big"] and "no MIG profile of A100-80GB covers" in lines["too-big"]
    assert "the largest is 7g.80gb" in lines["too-big"]


def test_plan_reserves_the_profile_and_the_yaml_shows_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = [gpu(0, mig=True), klass("mig", partitioning="MIG"), claim("small", "mig", gpu_core=10, gpu_memory="4Gi"),
            claim("whole", "mig", gpu_core=60)]  # fmt: skip
    (tmp_path / "in.yaml").write_text(yaml.safe_dump_all(docs))
    found = plan.read_inputs([str(tmp_path / "in.yaml")])
    results = {r.claim.metadata.name: r for r in plan.plan(found)}
    small = results["small"].placement
    assert small is not None and (small.cards[0].cores, small.cards[0].memory_mib) == (14, 10240)  # 1g.10gb
    assert results["small"].message.startswith("MIG 1g.10gb at slice ")
    # 60% maps to 7g.80gb, the whole card, which the 1g instance already uses a slice of.
    assert results["whole"].placement is None
    [egpu] = plan.elastic_gpus(list(results.values()), found.classes)
    assert egpu.to_dict()["spec"]["capacity"] == {"elasticgpu.io/gpu-core": 14, "elasticgpu.io/gpu-memory": "10Gi"}
