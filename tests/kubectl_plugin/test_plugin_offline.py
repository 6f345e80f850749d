"""`kubectl egpu` without a cluster: plan, the public surface, and top's rows from plain GPU models."""

from __future__ import annotations

from pathlib import Path

import pytest

import elasticgpu.kubectl_plugin
from elasticgpu.api import GPU
from elasticgpu.kubectl_plugin import main, top


def test_the_public_surface_is_main_only() -> None:
    assert elasticgpu.kubectl_plugin.__all__ == ["main"]


def test_plan_is_elasticgpu_plan(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:3] == ["NAMESPACE", "NAME", "STATUS"]
    assert "too-much-memory" in out


def test_plan_of_a_missing_file_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    assert main(["plan", "-f", str(missing)]) == 2
    assert capsys.readouterr().err.strip() == f"kubectl egpu plan: error: -f {missing}: no such file or folder"


def _gpu(status: dict[str, object]) -> GPU:
    return GPU.model_validate({"metadata": {"name": "gpu-a"}, "spec": {
        "index": 0, "uuid": "GPU-A", "model": "M", "memory": 16384, "nodeName": "n1"}, "status": status})


def test_a_card_whose_agent_went_silent_shows_not_ready_and_its_orphan_running_claim() -> None:
    gpu = _gpu({"health": "Healthy",
                "conditions": [{"type": "Ready", "status": "False", "reason": "HeartbeatExpired"}],
                "runningClaims": [{"namespace": "a", "name": "gone"}]})
    [row] = top.rows([gpu], namespace=None)
    assert dict(zip(top.HEADER, row, strict=True)) == {
        "NODE": "n1", "GPU": "gpu-a", "INDEX": "0", "MODEL": "M", "HEALTH": "Healthy,NotReady(HeartbeatExpired)",
        "OWNER": "ElasticGPU", "CORES": "0%", "CORES-USED": "-", "MEMORY": "0Mi/16Gi", "MEMORY-USED": "-",
        "CLAIMS": "a/gone:released+running"}
    [row] = top.rows([gpu], namespace="b")
    assert row[-1] == ""


def test_top_shows_who_owns_each_card_and_a_move_under_way() -> None:
    moving, dras = _gpu({"owner": "ElasticGPU"}), _gpu({"owner": "DRA"})
    moving.spec.owner = dras.spec.owner = "DRA"
    owners = [dict(zip(top.HEADER, row, strict=True))["OWNER"]
              for row in top.rows([_gpu({}), moving, dras], namespace=None) if row[1] != "TOTAL"]
    assert owners == ["ElasticGPU", "ElasticGPU->DRA", "DRA"]
