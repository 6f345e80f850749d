"""`elasticgpu plan --resize`: each outcome of the controller's own resize and quota decisions,
against the cards and quotas as the plan left them, and a bad `--resize` told in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from elasticgpu import cli, plan_resize, user_errors

CLUSTER = """\
nodes:
  - {name: node-a, cards: 1, model: A100-SXM4-80GB, memory: 80Gi}
  - {name: node-h, cards: 2, model: H100-SXM5-80GB, memory: 80Gi}
---
apiVersion: elasticgpu.io/v1alpha1
kind: ElasticGPUClass
metadata: {name: elastic}
provisioner: elasticgpu.io/gpushare
parameters: {gpuModel: "A100*"}
allowClaimResize: true
---
apiVersion: elasticgpu.io/v1alpha1
kind: ElasticGPUClass
metadata: {name: fixed}
provisioner: elasticgpu.io/gpushare
parameters: {gpuModel: "A100*"}
---
apiVersion: elasticgpu.io/v1alpha1
kind: ElasticGPUClass
metadata: {name: whole}
provisioner: elasticgpu.io/physical
parameters: {gpuModel: "H100*"}
allowClaimResize: true
---
apiVersion: elasticgpu.io/v1alpha1
kind: ElasticGPUQuota
metadata: {name: team-a-gpus, namespace: team-a}
spec: {hard: {elasticgpu.io/gpu-core: 95}}
---
apiVersion: elasticgpu.io/v1alpha1
kind: ElasticGPUClaim
metadata: {name: a, namespace: team-a}
spec: {elasticGPUClassName: elastic, resources: {requests: {elasticgpu.io/gpu-core: 40,
  elasticgpu.io/gpu-memory: 20Gi}}}
---
apiVersion: elasticgpu.io/v1alpha1
kind: ElasticGPUClaim
metadata: {name: b, namespace: team-a}
spec: {elasticGPUClassName: elastic, resources: {requests: {elasticgpu.io/gpu-core: 40,
  elasticgpu.io/gpu-memory: 20Gi}}}
status: {usage: {memoryUsed: 15000, coresUsed: 30}}
---
apiVersion: elasticgpu.io/v1alpha1
kind: ElasticGPUClaim
metadata: {name: f, namespace: team-a}
spec: {elasticGPUClassName: fixed, resources: {requests: {elasticgpu.io/gpu-core: 10, elasticgpu.io/gpu-memory: 1Gi}}}
---
apiVersion: elasticgpu.io/v1alpha1
kind: ElasticGPUClaim
metadata: {name: big, namespace: team-a}
spec: {elasticGPUClassName: elastic, resources: {requests: {elasticgpu.io/gpu-core: 10,
  elasticgpu.io/gpu-memory: 96Gi}}}
---
apiVersion: elasticgpu.io/v1alpha1
kind: ElasticGPUClaim
metadata: {name: w, namespace: team-b}
spec: {elasticGPUClassName: whole, resources: {requests: {nvidia.com/gpu: 1}}}
"""


@pytest.fixture
def cluster_file(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER)
    return path


def _resize(capsys: pytest.CaptureFixture[str], cluster_file: Path, *asks: str) -> tuple[int, list[list[str]]]:
    """Runs `elasticgpu plan -f FILE --resize ...`; returns the exit code and the resize table's
    rows (namespace, name, size, outcome, message)."""
    argv = ["plan", "-f", str(cluster_file), "--strict"]
    for ask in asks:
        argv += ["--resize", ask]
    code = cli.main(argv)
    out = capsys.readouterr().out
    table = out.split("\n\n", 1)[1].splitlines()
    assert table[0].split()[:4] == ["NAMESPACE", "NAME", "RESIZE", "TO"], out
    return code, [row.split(None, 4) for row in table[1:]]


def test_an_expand_that_fits_its_card_and_quota(capsys: pytest.CaptureFixture[str], cluster_file: Path) -> None:
    _code, [row] = _resize(capsys, cluster_file, "team-a/a=45,20Gi")
    assert row[3] == "Expands", row
    assert "expanded from 40% cores, 20480 MiB to 45% cores, 20480 MiB on GPU gpu-node-a-0" in row[4]


def test_an_expand_with_no_room_on_its_card_says_what_the_card_lacks(capsys: pytest.CaptureFixture[str],
                                                                      cluster_file: Path) -> None:
    # 40 + 40 + 10 cores on the one A100: 10 free; 30 more lacks 20.
    code, [row] = _resize(capsys, cluster_file, "team-a/a=70,20Gi")
    assert row[3] == "NoRoomOnCard", row
    assert "the card lacks 20% cores and 0 MiB" in row[4] and "free: 10% cores" in row[4]
    assert code == 1  # --strict: a refused resize fails the gate


def test_an_expand_over_quota_names_the_quota_and_sees_the_resize_before_it(
        capsys: pytest.CaptureFixture[str], cluster_file: Path) -> None:
    # 90 cores charged of 95: a's +5 fits; then b's +5 finds the quota full (a's expand is applied).
    _code, [first, second] = _resize(capsys, cluster_file, "team-a/a=45,20Gi", "team-a/b=45,20Gi")
    assert first[3] == "Expands", first
    assert second[3] == "QuotaExceeded", second
    assert "ElasticGPUQuota team-a-gpus: elasticgpu.io/gpu-core would be 100, over its limit 95" in second[4]


def test_whole_cards_cannot_change_in_number(capsys: pytest.CaptureFixture[str], cluster_file: Path) -> None:
    _code, [row] = _resize(capsys, cluster_file, "team-b/w=cards=2")
    assert row[3] == "WholeCardResize", row
    assert "holds 1 whole card(s), asks for 2 whole card(s)" in row[4] and "create a new claim" in row[4]


def test_a_shrink_waits_for_the_node_and_one_below_use_is_blocked(capsys: pytest.CaptureFixture[str],
                                                                  cluster_file: Path) -> None:
    _code, [shrink, blocked] = _resize(capsys, cluster_file, "team-a/a=20,10Gi", "team-a/b=20,10Gi")
    assert shrink[3] == "ShrinkPending" and "waits" not in shrink[4] and "node node-a" in shrink[4], shrink
    assert blocked[3] == "ShrinkBlocked", blocked
    assert "it uses 30% cores and 15000 MiB (status.usage)" in blocked[4]


def test_a_class_without_allow_claim_resize_and_a_pending_claim(capsys: pytest.CaptureFixture[str],
                                                                cluster_file: Path) -> None:
    _code, [fixed, pending, same] = _resize(capsys, cluster_file, "team-a/f=20", "team-a/big=20", "team-a/a=40,20Gi")
    assert fixed[3] == "NotResizable" and "ElasticGPUClass fixed does not set allowClaimResize: true" in fixed[4]
    assert pending[3] == "NotBound", pending
    assert same[3] == "Unchanged", same


@pytest.mark.parametrize(("ask", "told"), [
    ("team-a/nope=20", "no such claim in the files given with -f (claims: team-a/a, "),
    ("team-a/a", "not NAMESPACE/CLAIM=SIZE"),
    ("a=20", "not NAMESPACE/CLAIM=SIZE"),
    ("team-a/a=lots,2Gi", "cores must be a whole number"),
    ("team-a/a=cards=0", "cards must be a whole number >= 1"),
    ("team-a/a=20,lots", "the new requests"),
])
def test_a_bad_resize_is_told_in_one_line_exit_2(capsys: pytest.CaptureFixture[str], cluster_file: Path,
                                                  ask: str, told: str) -> None:
    assert cli.main(["plan", "-f", str(cluster_file), "--resize", ask]) == user_errors.EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("elasticgpu plan: error: ") and told in err[0], err


def test_parse_reads_the_three_forms() -> None:
    assert plan_resize.parse("ns/c=60,20Gi").requests == {"elasticgpu.io/gpu-core": 60,
                                                          "elasticgpu.io/gpu-memory": "20Gi"}
    assert plan_resize.parse("ns/c=60").requests == {"elasticgpu.io/gpu-core": 60}
    assert plan_resize.parse("ns/c=cards=3").requests == {"nvidia.com/gpu": 3}


def test_a_size_no_claim_may_have_is_told_too(capsys: pytest.CaptureFixture[str], cluster_file: Path) -> None:
    assert cli.main(["plan", "-f", str(cluster_file), "--resize", "team-a/a=150"]) == user_errors.EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "claim team-a/a: the new requests" in err[0] and "gpu-core" in err[0], err
