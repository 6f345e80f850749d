"""bench/real_scheduler.py at a tiny size: it runs on the real control plane and prints its figures
(pods scheduled per second, claims bound per second, latencies) for both runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from elasticgpu.demo import real_cluster

pytestmark = pytest.mark.realcluster

BENCH = Path(__file__).resolve().parents[2] / "bench" / "real_scheduler.py"


def test_the_bench_schedules_every_pod_and_prints_its_figures() -> None:
    try:
        real_cluster.find_k8s_binary()
        real_cluster.find_etcd()
    except real_cluster.ControlPlaneUnavailable as e:
        pytest.skip(str(e))
    done = subprocess.run([sys.executable, str(BENCH), "--nodes", "5", "--pods", "20", "--timeout-s", "120"],
                          capture_output=True, text=True, timeout=400)  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    rows = {line.split("|")[1].strip(): line for line in done.stdout.splitlines() if line.startswith("| ")}
    assert set(rows) >= {"claims", "plain"}, done.stdout
    assert "not scheduled" not in done.stdout, done.stdout
    claims = [cell.strip() for cell in rows["claims"].split("|")[1:-1]]
    assert float(claims[2]) > 0 and float(claims[3]) > 0, rows["claims"]  # pods scheduled/s, claims bound/s
