"""What a user sees with kubectl: `get egpuc` columns, `explain`, and the refusal of a bad claim."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.crds.objects import Objects
from tests.kube_cluster import TestCluster

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def kubectl(kube_cluster: TestCluster, objects: Objects, namespace: str):  # type: ignore[no-untyped-def]
    if kube_cluster.kubectl is None:
        pytest.skip("no kubectl (neither from testserver/build.sh nor on PATH)")

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(kube_cluster.kubectl), "--kubeconfig", str(kube_cluster.kubeconfig), "-n", namespace, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )

    return run


def test_get_egpuc_shows_the_columns(kubectl) -> None:  # type: ignore[no-untyped-def]
    applied = kubectl("apply", "-f", str(ROOT / "examples" / "claim-slice.yaml"))
    assert applied.returncode == 0, applied.stderr
    listed = kubectl("get", "egpuc")
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()[:2]
    assert header.split() == ["NAME", "STATUS", "EGPU", "CORE", "MEMORY", "NODE", "CLASS", "AGE"]
    assert row.split()[0] == "notebook"
    wide = kubectl("get", "egpuc", "-o", "wide")
    assert wide.stdout.splitlines()[0].split()[-1] == "REASON"
    by_category = kubectl("get", "elasticgpu")
    assert by_category.returncode == 0 and "notebook" in by_category.stdout


def test_explain_describes_the_claim_spec(kubectl) -> None:  # type: ignore[no-untyped-def]
    explained = kubectl("explain", "egpuc.spec.resources.requests")
    assert explained.returncode == 0, explained.stderr
    assert "elasticgpu.io/gpu-core (1..100 percent of one card" in " ".join(explained.stdout.split())


def test_apply_of_a_bad_claim_names_the_field_and_the_rule(kubectl) -> None:  # type: ignore[no-untyped-def]
    bad = (
        "apiVersion: elasticgpu.io/v1alpha1\nkind: ElasticGPUClaim\nmetadata: {name: greedy}\n"
        "spec: {resources: {requests: {elasticgpu.io/gpu-core: 150}}}\n"
    )
    refused = kubectl("apply", "-f", "-", stdin=bad)
    assert refused.returncode != 0
    assert "spec.resources.requests[elasticgpu.io/gpu-core]: must be 1..100" in refused.stderr
    assert kubectl("get", "egpuc", "greedy").returncode != 0
