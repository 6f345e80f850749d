"""A tiny run of bench/mig.py: it derives the MIG trace from openb, replays every policy, prints the table."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
TRACES = (REPO / "../shared/traces/openb").resolve()


@pytest.mark.skipif(not (TRACES / "openb_node_list_gpu_node.csv").exists(), reason="openb trace not present")
def test_mig_bench_prints_every_policy(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("mig_bench", REPO / "bench" / "mig.py")
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    sys.modules["mig_bench"] = bench  # dataclasses look their module up
    spec.loader.exec_module(bench)
    assert bench.main(["--seeds", "1", "--max-nodes", "20", "--churn", "2"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "policy" not in line]
    assert [row.split(" | ")[0].removeprefix("| ") for row in rows] == list(bench.POLICIES)
    for row in rows:
        fit = float(row.split(" | ")[1])
        assert 0.0 <= fit <= 100.0
