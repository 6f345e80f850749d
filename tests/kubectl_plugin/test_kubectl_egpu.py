"""`kubectl egpu top|why`, run by the real kubectl (which finds `kubectl-egpu` on PATH) against the
test API server, on GPU objects and claims written as the agent and the controller write them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from elasticgpu.api import names
from tests.crds.objects import Objects
from tests.kube_cluster import TestCluster

VENV_BIN = Path(sys.executable).parent
MODEL = "NVIDIA A100-SXM4-80GB"


@pytest.fixture
def objects(api_client: client.ApiClient, crds_installed: object, namespace: str) -> Objects:
    return Objects(api_client, namespace)


@pytest.fixture
def egpu(kube_cluster: TestCluster, namespace: str):  # type: ignore[no-untyped-def]
    """`kubectl egpu ARGS --kubeconfig K` through the real kubectl, with the venv's bin on PATH."""
    if kube_cluster.kubectl is None:
        pytest.skip("no kubectl (neither from testserver/build.sh nor on PATH)")
    if not (VENV_BIN / "kubectl-egpu").exists():
        pytest.fail(f"{VENV_BIN}/kubectl-egpu is missing: reinstall the package (pip install -e .)")
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}

    def run(*args: str, kubeconfig: str | None = None) -> subprocess.CompletedProcess[str]:
        config = kubeconfig or str(kube_cluster.kubeconfig)
        return subprocess.run([str(kube_cluster.kubectl), "egpu", *args, "--kubeconfig", config],
                              capture_output=True, text=True, timeout=60, env=env)

    return run


def _gpu(node: str, index: int) -> dict[str, Any]:
    uuid = f"GPU-{node}-{index}"
    return {"apiVersion": names.API_VERSION, "kind": names.KIND_GPU, "metadata": {"name": uuid.lower()},
            "spec": {"index": index, "uuid": uuid, "model": MODEL, "memory": 81920, "nodeName": node}}


@pytest.fixture
def cluster_with_claims(objects: Objects, api_client: client.ApiClient, namespace: str) -> Iterator[str]:
    """One node of two cards: card 0 holds a running 30%/10Gi share, card 1 a whole card; a class
    that selects that node (other tests' GPUs do not count); a claim that cannot fit (96Gi)."""
    node = f"egpu-{namespace}"
    core = client.CoreV1Api(api_client)
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=node, labels={"egpu-test-node": namespace})))
    cards = [_gpu(node, 0), _gpu(node, 1)]
    klass = {"apiVersion": names.API_VERSION, "kind": names.KIND_CLASS, "metadata": {"name": f"c-{namespace}"},
             "provisioner": names.PROVISIONER_GPUSHARE, "parameters": {"nodeSelector": f"egpu-test-node={namespace}"}}
    try:
        for card in cards:
            objects.create(card)
        objects.create(klass)
        ref = {"apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM, "namespace": namespace}
        objects.patch_status(cards[0], {
            "health": "Healthy",
            "allocations": [{"elasticGPU": "egpu-a", "claimRef": {**ref, "name": "notebook"}, "cores": 30,
                             "memory": 10240}],
            "usage": {"memoryUsed": 3072, "coresUsed": 12},
            "runningClaims": [{"namespace": namespace, "name": "notebook", "pods": [f"{namespace}/nb"]}],
        })
        objects.patch_status(cards[1], {
            "health": "Healthy",
            "allocations": [{"elasticGPU": "egpu-b", "claimRef": {**ref, "name": "trainer"}, "cores": 100,
                             "memory": 81920, "exclusive": True}],
        })
        share = {names.RESOURCE_CORE: 20, names.RESOURCE_MEMORY: "20Gi"}
        for name, requests in (("too-big", {**share, names.RESOURCE_MEMORY: "96Gi"}), ("fits", share),
                               ("no-room", {**share, names.RESOURCE_MEMORY: "75Gi"}),
                               ("two-cards", {names.RESOURCE_NVIDIA_GPU: 2})):
            claim = {"apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM, "metadata": {"name": name},
                     "spec": {"elasticGPUClassName": f"c-{namespace}", "resources": {"requests": requests}}}
            objects.create(claim)
        objects.patch_status({"kind": names.KIND_CLAIM, "metadata": {"name": "too-big"}}, {
            "phase": "Pending", "reason": "NoCapacity", "message": "no card has room for 20% cores, 96Gi"})
        # A pod that uses it, gated, with the condition the controller writes (and one that does not).
        for pod, claim_name in (("big-pod", "too-big"), ("other-pod", "fits")):
            core.create_namespaced_pod(namespace, {
                "metadata": {"name": pod, "labels": {names.LABEL_USES_CLAIMS: "true"},
                             "annotations": {names.claim_annotation("main"): claim_name}},
                "spec": {"containers": [{"name": "main", "image": "busybox"}]}})
        core.patch_namespaced_pod_status("big-pod", namespace, {"status": {"conditions": [
            {"type": "elasticgpu.io/ClaimsReady", "status": "False", "reason": "ClaimPending",
             "message": "claim too-big is Pending"}]}})
        yield node
    finally:
        for card in cards:
            objects.delete(card)
        objects.delete(klass)
        core.delete_node(node)


def _table(text: str) -> list[dict[str, str]]:
    """kubectl's table as dicts: each column starts where its header starts."""
    header, *lines = text.splitlines()
    starts = [match.start() for match in re.finditer(r"\S+", header)]
    bounds = list(zip(starts, [*starts[1:], None], strict=True))
    return [{header[a:b].strip(): line[a:b].strip() for a, b in bounds} for line in lines]


def test_top_shows_each_card_reserved_used_health_and_claims(egpu, cluster_with_claims: str,  # type: ignore[no-untyped-def]
                                                            namespace: str) -> None:
    shown = egpu("top")
    assert shown.returncode == 0, shown.stderr
    rows = {row["GPU"]: row for row in _table(shown.stdout) if row["NODE"] == cluster_with_claims}
    card0, card1 = f"gpu-{cluster_with_claims}-0", f"gpu-{cluster_with_claims}-1"
    assert {k: rows[card0][k] for k in ("INDEX", "HEALTH", "CORES", "CORES-USED", "MEMORY", "MEMORY-USED",
                                        "CLAIMS")} == {
        "INDEX": "0", "HEALTH": "Healthy", "CORES": "30%", "CORES-USED": "12%", "MEMORY": "10Gi/80Gi",
        "MEMORY-USED": "3Gi", "CLAIMS": f"{namespace}/notebook:30%/10Gi+running"}
    assert (rows[card1]["CORES"], rows[card1]["MEMORY"], rows[card1]["CORES-USED"], rows[card1]["CLAIMS"]) == (
        "100%", "80Gi/80Gi", "-", f"{namespace}/trainer:whole")
    assert (rows["TOTAL"]["CORES"], rows["TOTAL"]["MEMORY"]) == ("130%", "90Gi/160Gi")
    assert rows[card0]["MODEL"] == MODEL
    # -n shows only that namespace's claims.
    other = {row["GPU"]: row for row in _table(egpu("top", "-n", "kube-system").stdout)
             if row["NODE"] == cluster_with_claims}
    assert other[card0]["CLAIMS"] == "<none>"


def test_why_names_the_reason_and_the_closest_card_and_what_it_lacks(egpu, cluster_with_claims: str,  # type: ignore[no-untyped-def]
                                                                      namespace: str) -> None:
    told = egpu("why", "too-big", "-n", namespace)
    assert told.returncode == 0, told.stderr
    assert f"ElasticGPUClaim {namespace}/too-big: Pending (NoCapacity)" in told.stdout
    assert "message:  no card has room for 20% cores, 96Gi" in told.stdout
    # The controller's own verdict (issue 36), from this node only (the class's nodeSelector): 96Gi
    # never fits an 80Gi card, so waiting will not help; `why` once showed the closest card as if it might.
    assert ("lacks:    NeverFits: no card in this cluster can ever give 20% cores, 96Gi: the largest is"
            f" {MODEL} with 80Gi (node {cluster_with_claims})") in told.stdout, told.stdout
    # 75Gi fits an empty card: card 1 is taken whole, card 0 has 80Gi - 10Gi free.
    no_room = egpu("why", "no-room", "-n", namespace)
    assert (f"lacks:    NoCapacity: no card can give 20% cores, 75Gi: {cluster_with_claims} card 0 has 70Gi free,"
            " the claim asks 75Gi") in no_room.stdout, no_room.stdout
    # A request the class refuses is a mistake to fix, not a card to wait for (it once said "fits now").
    two = egpu("why", "two-cards", "-n", namespace)
    assert (f"cause:    InvalidRequest: spec.resources: class c-{namespace} provisions slices of one card"
            in two.stdout), two.stdout
    assert "fits now" not in two.stdout
    # The pods that use it, with the controller's word on them; not the pod of another claim.
    assert "pod big-pod: elasticgpu.io/ClaimsReady=False (ClaimPending) claim too-big is Pending" in told.stdout
    assert "other-pod" not in told.stdout
    # kubectl's habit: the connection flags before the subcommand work as well as after it.
    fits = egpu("-n", namespace, "why", "fits")
    assert fits.returncode == 0, fits.stderr
    assert re.search(rf"fits now: {cluster_with_claims}: GPU-{cluster_with_claims}-0 \(20%, 20Gi\)", fits.stdout)
    assert "pod other-pod: no elasticgpu.io/ClaimsReady condition yet" in fits.stdout


def test_mistakes_are_one_line_and_exit_2(egpu, objects: Objects, namespace: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    missing = egpu("why", "nope", "-n", namespace)
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"kubectl egpu why: error: ElasticGPUClaim nope not found in namespace {namespace}: check the name"
        f" (kubectl get egpuc -n {namespace}) or pass -n NAMESPACE"]
    garbage = tmp_path / "kubeconfig"
    garbage.write_text("clusters: [unclosed\n")
    bad = egpu("top", kubeconfig=str(garbage))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and str(garbage) in bad.stderr


def test_release_force_sets_the_annotation_and_says_the_risk(egpu, objects: Objects, namespace: str) -> None:  # type: ignore[no-untyped-def]
    """`kubectl egpu release --force EGPU`: the admin's way out for a reservation kept for a claim its
    node's agent still reports running (issue 23, item 3). Without --force it only says what it would do."""
    name = f"{namespace}-kept"
    manifest = {"apiVersion": names.API_VERSION, "kind": names.KIND_ELASTIC_GPU, "metadata": {"name": name},
                "spec": {"capacity": {names.RESOURCE_CORE: 30, names.RESOURCE_MEMORY: "1Gi"},
                         "gpuShare": {"gpuName": f"gpu-{namespace}-0"}}}
    objects.create(manifest)
    try:
        dry = egpu("release", name)
        assert dry.returncode == 1, dry.stderr
        assert "nothing done: add --force" in dry.stdout and "risk:" in dry.stdout
        assert names.ANNOTATION_FORCE_RELEASE not in (objects.get(manifest)["metadata"].get("annotations") or {})
        done = egpu("release", "--force", name)
        assert done.returncode == 0, done.stderr
        assert f"{names.ANNOTATION_FORCE_RELEASE}=true set" in done.stdout and "risk:" in done.stdout
        assert objects.get(manifest)["metadata"]["annotations"][names.ANNOTATION_FORCE_RELEASE] == "true"
        missing = egpu("release", "--force", f"{namespace}-nope")
        assert missing.returncode == 2 and "not found" in missing.stderr
    finally:
        objects.delete(manifest)
