"""bench/real_scheduler.py at a tiny size on the real control plane: every kind (plain pods, ours
whole and slice, DRA one device and shared devices, DRA served by our driver whole and shared, the
claim floor) gets all its pods scheduled with every claim
Bound or allocated, the writes per pod come from the API server's own counters, and a profiled
run yields a CPU profile that bench/pprof_buckets.py attributes. It runs with the raised client
limits, so the launcher's extra flags per component are exercised too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from elasticgpu.testbed import real_cluster

pytestmark = pytest.mark.realcluster

BENCH = Path(__file__).resolve().parents[2] / "bench" / "real_scheduler.py"
# our driver's kinds before ours: the cards go to DRA for them and come back for ours-* (both moves run)
KINDS = ("plain", "dra-ours", "dra-ours-shared", "ours-whole", "ours-slice", "dra-one", "dra-shared", "claim-floor")
FLOOR = KINDS.index("claim-floor")
PODS = 6


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.split("|")[1:-1]]


def test_the_bench_schedules_every_kind_and_counts_its_writes(tmp_path: Path) -> None:
    try:
        real_cluster.find_k8s_binary()
        real_cluster.find_etcd()
    except real_cluster.ControlPlaneUnavailable as e:
        pytest.skip(str(e))
    done = subprocess.run([sys.executable, str(BENCH), "--nodes", "3", "--pods", str(PODS), "--timeout-s", "120",
                           "--kinds", ",".join(KINDS), "--profile", "dra-one", "--limits", "raised",
                           "--out", str(tmp_path), "--idle-s", "3"],
                          capture_output=True, text=True, timeout=840)  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-4000:]
    assert "not scheduled" not in out, out
    # the raised client limits reached the controller manager and scheduler (they started with them)
    assert "limits: --kube-api-qps=500 --kube-api-burst=1000" in out, out
    per_run = out.split("Idle before each run")[0]  # the idle table's rows are named by run too
    runs = {_cells(line)[0]: _cells(line) for line in per_run.splitlines() if line.startswith("| ") and " #1 |" in line}
    assert set(runs) == {f"{kind} #1" for kind in KINDS}, out
    for kind in KINDS:
        row = runs[f"{kind} #1"]
        assert float(row[1]) > 0, row  # pods scheduled/s
        # claims ready: ours Bound, DRA allocated and reserved for the pod; plain has none
        assert row[3] == ("-" if kind == "plain" else str(PODS)), row
        assert float(row[4]) > 0, row  # the API server's CPU per pod
    writes = {_cells(line)[0]: _cells(line)[1:] for line in out.split("Writes per pod by resource")[1].splitlines()
              if line.startswith("| ") and not line.startswith("| resource verb")}  # fmt: skip
    # columns in KINDS order: every pod is created and bound once; claims come from our
    # controller (ours) or the resourceclaim controller (DRA), never the other's
    assert writes["pods create"] == ["1.00"] * len(KINDS), writes
    assert writes["pods/binding create"] == ["1.00"] * len(KINDS), writes
    assert writes["elasticgpuclaims create"] == ["-", "-", "-", "1.00", "1.00", "-", "-", "1.00"], writes
    assert writes["resourceclaims create"] == ["-", "1.00", "1.00", "-", "-", "1.00", "1.00", "-"], writes
    # the claim floor: its claim's create and status, the gate lift, and nothing of ElasticGPUs or cards
    assert writes["elasticgpuclaims/status patch"][FLOOR] == "1.00", writes
    assert writes["pods patch"][FLOOR] == "1.00", writes
    assert writes["elasticgpus create"][FLOOR] == "-", writes
    # an inline claim is created as its bind leaves its spec (issue 37): no claim of any kind is patched
    assert "elasticgpuclaims patch" not in writes, writes
    # CPU is counted to the last pod scheduled, less the idle rate measured before each run
    assert "Idle before each run" in out, out
    # each DRA run published only its own driver's slices, and withdrew them after
    assert "3 ResourceSlices of one.bench.example.com" in out and "3 ResourceSlices of shared.bench.example.com" in out
    # our driver's kinds: the cards were handed to DRA (the controller moved status.owner) and back for
    # the ours-* runs after them, and each dra-ours run's slices came from the agent's publisher
    assert "24 cards handed to DRA" in out and "24 cards handed to ElasticGPU" in out, out
    assert out.count("3 ResourceSlices of gpu.elasticgpu.io (the agent's publisher)") == 2, out
    assert "kube-apiserver CPU by bucket" in out and "| **total sampled** |" in out, out
    assert list((tmp_path / "profile-dra-one").glob("*.pb.gz")), list(tmp_path.iterdir())
    assert (tmp_path / "report.md").read_text().strip() in out
