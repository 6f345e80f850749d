"""A tiny run of bench/openb.py: it loads the trace, replays a few hundred pods, prints."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRACES = (REPO / "../shared/traces/openb").resolve()


@pytest.mark.skipif(not (TRACES / "openb_node_list_gpu_node.csv").exists(), reason="openb trace not present")
def test_bench_replays_a_few_hundred_pods(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("openb_bench", REPO / "bench" / "openb.py")
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    sys.modules["openb_bench"] = bench  # dataclasses look their module up
    spec.loader.exec_module(bench)
    code = bench.main(
        ["--seeds", "1", "--max-pods", "300", "--policies", "fragmentation", "random", "--out", str(tmp_path)]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "fragmentation" in out and "random" in out
    assert (tmp_path / "openb-default.png").stat().st_size > 1000


@pytest.mark.skipif(not (TRACES / "openb_pod_list_multigpu50.csv").exists(), reason="openb trace not present")
def test_topology_bench_runs_and_ours_beats_blind(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("topology_bench", REPO / "bench" / "topology.py")
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    sys.modules["topology_bench"] = bench
    spec.loader.exec_module(bench)
    assert bench.main(["--nodes", "16", "--arrivals", "2000", "--seeds", "1"]) == 0
    rows = {(cols[0], cols[1]): cols for cols in (line.split() for line in capsys.readouterr().out.splitlines())
            if len(cols) == 6 and cols[1].isdigit()}
    share = {v: float(rows[(v, "8")][4].rstrip("%")) for v in ("blind", "ours", "required")}
    assert share["required"] == 100.0 and share["ours"] > share["blind"], share


@pytest.mark.skipif(not (TRACES / "openb_pod_list_default.csv").exists(), reason="openb trace not present")
def test_gang_bench_runs_and_all_or_none_holds_no_card_idle(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("gangs_bench", REPO / "bench" / "gangs.py")
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    sys.modules["gangs_bench"] = bench
    spec.loader.exec_module(bench)
    assert bench.main(["--nodes", "16", "--hours", "3", "--seeds", "1"]) == 0
    rows = {line[:28].strip(): line[28:].split() for line in capsys.readouterr().out.splitlines()
            if line.startswith(("claim-by-claim ", "all-or-none"))}
    assert set(rows) == {"claim-by-claim", "all-or-none", "all-or-none + bounded wait"}, rows
    for binder in ("all-or-none", "all-or-none + bounded wait"):
        assert rows[binder][:2] == ["0.0", "0.0"], rows  # no card held idle by a partial group
        assert float(rows[binder][2]) > 0, rows  # jobs completed


@pytest.mark.timeout(120)
def test_without_its_trace_the_bench_says_where_the_trace_comes_from_in_one_line(tmp_path: Path) -> None:
    """Issue 36: it died with a FileNotFoundError traceback."""
    done = subprocess.run([sys.executable, str(REPO / "bench" / "openb.py"), "--trace-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2, done
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert str(tmp_path / "openb_node_list_gpu_node.csv") in lines[0], lines[0]
    assert "github.com/alibaba/clusterdata" in lines[0] and "--trace-dir FOLDER" in lines[0], lines[0]
