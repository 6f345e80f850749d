"""A short run of bench/fair_share.py: both orders run over one saturating stream, and FairShare
spreads the cores held over the ten namespaces more evenly than FIFO (Jain's index)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_fair_share_is_fairer_than_fifo_on_a_saturating_stream(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("fair_share_bench", REPO / "bench" / "fair_share.py")
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    sys.modules["fair_share_bench"] = bench  # dataclasses look their module up
    spec.loader.exec_module(bench)
    assert bench.main(["--ticks", "100", "--nodes", "4", "--warmup", "30"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()
            if line.startswith(("FIFO ", "FairShare "))}
    fifo, fair = float(rows["FIFO"][1]), float(rows["FairShare"][1])
    assert 0.1 <= fifo < fair <= 1.0, (fifo, fair)
    assert fair >= 0.9
