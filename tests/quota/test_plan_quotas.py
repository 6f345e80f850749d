"""`elasticgpu plan` reads ElasticGPUQuotas and reports the claims a quota keeps Pending."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from elasticgpu import plan, user_errors

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "plan"
QUOTAS = """\
apiVersion: elasticgpu.io/v1alpha1
kind: ElasticGPUQuota
metadata: {name: team-a-gpus, namespace: team-a}
spec:
  hard: {elasticgpu.io/gpu-core: 60}
---
apiVersion: elasticgpu.io/v1alpha1
kind: ElasticGPUQuota
metadata: {name: team-b-cards, namespace: team-b}
spec:
  hard: {a100-whole.nvidia.com/gpu: 2}
"""


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, str]]:
    parser = argparse.ArgumentParser()
    plan.add_arguments(parser)
    code = plan.run(parser.parse_args(list(argv)))
    out = capsys.readouterr().out
    return code, {line.split()[1]: line for line in out.splitlines()[1:]}


def test_plan_keeps_claims_over_quota_pending_and_says_why(capsys: pytest.CaptureFixture[str],
                                                          tmp_path: Path) -> None:
    _, before = _run(capsys, "-f", str(EXAMPLES))
    assert "Bound" in before["inference"] and "Bound" in before["training"]
    (tmp_path / "quotas.yaml").write_text(QUOTAS)
    _, lines = _run(capsys, "-f", str(EXAMPLES), "-f", str(tmp_path / "quotas.yaml"))
    assert "Bound" in lines["notebook"]  # 30 of team-a's 60 cores
    assert "Pending" in lines["inference"]  # 30 + 50 > 60
    assert "QuotaExceeded: ElasticGPUQuota team-a-gpus: elasticgpu.io/gpu-core would be 80" in lines["inference"]
    assert "limit 60 (used 30" in lines["inference"]
    assert "Pending" in lines["training"]  # 4 whole A100s, the class may hold 2
    assert "ElasticGPUQuota team-b-cards: a100-whole.nvidia.com/gpu would be 4" in lines["training"]


def test_plan_refuses_a_quota_with_a_bad_quantity(tmp_path: Path) -> None:
    (tmp_path / "quotas.yaml").write_text(QUOTAS.replace("60}", "lots}"))
    with pytest.raises(user_errors.InputFileInvalid, match=r"elasticgpu\.io/gpu-core"):
        plan.read_inputs([str(tmp_path / "quotas.yaml")])
