"""What a user sees with kubectl: `get egpuc` columns, `explain`, and the refusal of a bad claim."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from elasticgpu.api import ObjectReference, allocatable_summary, claim_key, gpu_capacity, gpu_list
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
    assert header.split() == ["NAME", "STATUS", "EGPU", "CORE", "MEMORY", "NODE", "CLASS", "REASON", "AGE"]
    assert row.split()[0] == "notebook"
    status = {"status": {"phase": "Pending", "reason": "WaitingForFirstConsumer",
                         "message": "waiting for a pod that uses this claim"}}
    patched = kubectl("patch", "egpuc", "notebook", "--subresource=status", "--type=merge", "-p", json.dumps(status))
    assert patched.returncode == 0, patched.stderr
    [row] = _rows(kubectl("get", "egpuc", "notebook"))
    assert (row["STATUS"], row["REASON"]) == ("Pending", "WaitingForFirstConsumer")
    by_category = kubectl("get", "elasticgpu-all")
    assert by_category.returncode == 0 and "notebook" in by_category.stdout


def test_get_elasticgpu_by_name_reads_the_kind_not_a_category(kubectl) -> None:  # type: ignore[no-untyped-def]
    manifest = (
        "apiVersion: elasticgpu.io/v1alpha1\nkind: ElasticGPU\nmetadata: {name: by-name}\n"
        "spec: {capacity: {elasticgpu.io/gpu-core: 10}, gpuShare: {gpuName: gpu-0000}, reclaimPolicy: Retain}\n"
    )
    created = kubectl("apply", "-f", "-", stdin=manifest)
    assert created.returncode == 0, created.stderr
    try:
        got = kubectl("get", "elasticgpu", "by-name")
        assert got.returncode == 0, got.stderr
        assert got.stdout.splitlines()[1].split()[0] == "by-name"
    finally:
        kubectl("delete", "elasticgpu", "by-name", "--wait=false")


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


def _rows(listed: subprocess.CompletedProcess[str]) -> list[dict[str, str]]:
    """kubectl's table as dicts: each column starts where its header starts (cells may be blank)."""
    assert listed.returncode == 0, listed.stderr
    header, *lines = listed.stdout.splitlines()
    starts = [match.start() for match in re.finditer(r"\S+", header)]
    bounds = list(zip(starts, [*starts[1:], None], strict=True))
    return [{header[a:b].strip(): line[a:b].strip() for a, b in bounds} for line in lines]


def test_get_pgpu_shows_memory_and_allocatable_in_gi(kubectl) -> None:  # type: ignore[no-untyped-def]
    path = ROOT / "examples" / "demo" / "gpu.yaml"
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    kubectl("delete", "-f", str(path), "--ignore-not-found")
    try:
        assert kubectl("apply", "-f", str(path)).returncode == 0
        status = {"capacity": gpu_capacity(81920), "allocatableSummary": allocatable_summary(70, 40960)}
        body = json.dumps({"status": status})
        patched = kubectl("patch", "pgpu", name, "--subresource=status", "--type=merge", "-p", body)
        assert patched.returncode == 0, patched.stderr
        (row,) = _rows(kubectl("get", "pgpu", name))
        assert {key: row[key] for key in ("NAME", "NODE", "MEMORY", "ALLOCATABLE")} == {
            "NAME": name,
            "NODE": "gpu-node-1",
            "MEMORY": "80Gi",
            "ALLOCATABLE": "70%/40Gi",
        }
    finally:
        kubectl("delete", "-f", str(path), "--ignore-not-found")


def test_get_egpu_shows_gpus_and_claim_as_text(kubectl) -> None:  # type: ignore[no-untyped-def]
    path = ROOT / "examples" / "demo" / "elasticgpu-static.yaml"
    kubectl("delete", "-f", str(path), "--ignore-not-found")
    try:
        assert kubectl("apply", "-f", str(path)).returncode == 0
        ref = ObjectReference(namespace="team-a", name="inference")
        gpus = ["GPU-8f6b2c1e", "GPU-1c2d3e4f"]
        status = {"phase": "Bound", "gpus": gpus, "gpuList": gpu_list(gpus), "claim": claim_key(ref)}
        body = json.dumps({"status": status})
        patched = kubectl("patch", "egpu", "static-a100-slice", "--subresource=status", "--type=merge", "-p", body)
        assert patched.returncode == 0, patched.stderr
        (row,) = _rows(kubectl("get", "egpu", "static-a100-slice"))
        assert (row["GPUS"], row["CLAIM"], row["STATUS"]) == ("GPU-8f6b2c1e,GPU-1c2d3e4f", "team-a/inference", "Bound")
    finally:
        kubectl("delete", "-f", str(path), "--ignore-not-found")
