"""`elasticgpu demo --kubeconfig` on Kubernetes' own control plane: the admission webhook called by
the real API server, the scheduling gate and node affinity honoured by the real scheduler, the
controller and agents under the real garbage collector and namespace controller; and afterwards,
as the demo promises on a cluster it does not own, nothing of it left behind."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from kubernetes import client

from elasticgpu.api import names
from tests.kube_cluster import TestCluster, kube_request

pytestmark = pytest.mark.realcluster

DEMO_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def demo_run(kube_cluster: TestCluster, crds_installed: list[str]) -> subprocess.CompletedProcess[str]:
    """One run of the demo against the control plane (the admin's kubeconfig)."""
    from tests.containerd_runtime import RuntimeUnavailable, find_build

    try:
        find_build(build_if_missing=False)
    except RuntimeUnavailable as e:
        pytest.skip(str(e))
    return subprocess.run([sys.executable, "-m", "elasticgpu", "demo", "--kubeconfig", str(kube_cluster.kubeconfig)],
                          capture_output=True, text=True, timeout=DEMO_TIMEOUT_S)  # fmt: skip


def test_every_claim_reaches_its_container(demo_run: subprocess.CompletedProcess[str]) -> None:
    assert demo_run.returncode == 0, demo_run.stdout[-4000:] + demo_run.stderr[-4000:]
    assert "every claim reached its container" in demo_run.stdout


def _items(api: client.ApiClient, plural: str) -> list[dict[str, Any]]:
    answer = kube_request(api, "GET", f"/apis/{names.GROUP}/{names.VERSION}/{plural}")
    assert answer.status == 200, answer.body
    return list(answer.json()["items"])


def test_nothing_is_left_behind(api_client: client.ApiClient, demo_run: subprocess.CompletedProcess[str]) -> None:
    left = {
        "ElasticGPUs": [e["metadata"]["name"] for e in _items(api_client, names.PLURAL_ELASTIC_GPU)
                        if (e["metadata"].get("labels") or {}).get(names.LABEL_CLAIM_NAMESPACE, "").startswith(
                            "elasticgpu-demo-")],
        "GPUs": [g["metadata"]["name"] for g in _items(api_client, names.PLURAL_GPU)
                 if (g["metadata"].get("labels") or {}).get(names.LABEL_NODE, "").startswith("egpu-demo-")],
        "Nodes": [n.metadata.name for n in client.CoreV1Api(api_client).list_node().items
                  if n.metadata.name.startswith("egpu-demo-")],
    }  # fmt: skip
    assert not any(left.values()), f"the demo left behind: {left}"
