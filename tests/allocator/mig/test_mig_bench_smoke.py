"""A tiny run of bench/mig.py: it derives the MIG trace from openb, replays every policy, prints the table."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.bench import bench_module

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
    assert [row.split(" | ")[0].removeprefix("| ") for row in rows] == list(bench.ROWS)
    for row in rows:
        fit = float(row.split(" | ")[1])
        assert 0.0 <= fit <= 100.0


def _bench() -> object:
    return bench_module.load("mig_bench", "mig.py")


def test_upper_bound_is_exact_on_small_cases() -> None:
    """The bound's integer program on one card: what the slot rules allow, no more."""
    from elasticgpu.allocator.mig import MigRequest, by_name

    bench: Any = _bench()
    model = by_name("A100-80GB")
    memory = 80 * 1024

    def requests(*cores: int, cards: int = 0) -> list[Any]:
        made = [MigRequest(cores=c) for c in cores] + ([MigRequest(cores=100, cards=cards)] if cards else [])
        return [bench.Request(f"r{i}", r, r.profile_on(model, memory).size * max(r.cards, 1), 1)
                for i, r in enumerate(made)]

    assert bench.upper_bound(requests(50, 50), [1], model, memory) == 1  # 4g starts only at slice 0
    assert bench.upper_bound(requests(50, 30, 30), [1], model, memory) == 2  # 4g + 3g, or 3g + 3g
    assert bench.upper_bound(requests(*[10] * 8), [1], model, memory) == 7  # 7 compute slices
    assert bench.upper_bound(requests(10, 10, cards=2), [2], model, memory) == 2  # two 1g beat one 2-card
    assert bench.upper_bound(requests(10, cards=2), [2], model, memory) == 1
    assert bench.upper_bound(requests(cards=2), [1, 1], model, memory) == 0  # two cards, but on two nodes
    assert bench.upper_bound(requests(cards=4), [4, 2], model, memory) == 1
    # The best placement refuses the whole card for two 1g; made to place the whole card, it fits one.
    assert bench.upper_bound(requests(60, 10, 10), [1], model, memory) == 2
    assert bench.upper_bound(requests(60, 10, 10), [1], model, memory, at_least={("7g.80gb", 1): 1}) == 1
    configs = bench.configurations(model)
    assert (0, 0, 0, 0, 0, 1) in configs and (7, 0, 0, 0, 0, 0) in configs and (8, 0, 0, 0, 0, 0) not in configs
    assert (0, 0, 0, 0, 2, 0) not in configs and (0, 0, 0, 2, 0, 0) in configs


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from([5, 10, 20, 30, 50, 90, 100, 200]), min_size=1, max_size=40),
       st.integers(min_value=1, max_value=6))
def test_no_policy_beats_the_upper_bound(cores: list[int], cards: int) -> None:
    """Every policy, online or offline, fits at most the bound's count."""
    from elasticgpu.allocator.mig import MigRequest, by_name

    bench: Any = _bench()
    model = by_name("A100-80GB")
    memory = 80 * 1024
    made = [MigRequest(cores=c) if c <= 100 else MigRequest(cores=100, cards=c // 100) for c in cores]
    sequence = [bench.Request(f"r{i}", r, r.profile_on(model, memory).size * max(r.cards, 1), 1)
                for i, r in enumerate(made)]
    nodes = [("n0", cards // 2 + cards % 2), ("n1", cards // 2)]
    nodes = [n for n in nodes if n[1] > 0]
    bound = bench.upper_bound(sequence, [c for _, c in nodes], model, memory)
    workload = {r: 1.0 for r in made}
    for policy in ("first-fit", "fragmentation"):
        placed, _ = bench.fill(bench.make(policy, nodes, model, memory, workload), sequence)
        assert placed <= bound
    placed, _ = bench.fill(bench.make("first-fit", nodes, model, memory, workload),
                           bench.decreasing(sequence, model, memory))
    assert placed <= bound
