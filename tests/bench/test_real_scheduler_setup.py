"""bench/real_scheduler_setup.py writes the simulated cluster with several processes (issue 49 item 1:
5,000 nodes' set-up, ~85,000 writes, did not fit one process): every node arrives Ready with its
allocatable in its one create and each node gets its 8 GPU objects with their status, the nodes split
over spawned writer processes. (The test server serves no resource.k8s.io: the same writer's
ResourceSlices are checked by tests/realcluster/test_real_scheduler_bench.py.)"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest
from kubernetes import client

from elasticgpu.api import names
from tests.kube_cluster import TestCluster

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import real_scheduler_setup as setup  # noqa: E402

NODES = 12
FIRST = 9000
"""Node indexes 9000.. (bench-node-9000): apart from anything else in the session's cluster."""


@pytest.mark.timeout(240)
def test_writers_split_the_nodes_and_gpus(kube_cluster: TestCluster, api_client: client.ApiClient,
                                                 crds_installed: list[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(setup, "FAN_OUT_MIN", 1)  # 12 nodes fan out too (the bench: 500 and up)
    items = list(range(FIRST, FIRST + NODES))
    kubeconfig = str(kube_cluster.kubeconfig)
    core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    try:
        setup.write(kubeconfig, ("node", "gpus"), items, writers=3, threads=2)
        for n in items:
            node = core.read_node(setup.node_name(n))
            # one write: the status came with the create
            assert node.status.allocatable == {"cpu": "64", "memory": "256Gi", "pods": "110"}, node.status
            assert [(c.type, c.status) for c in node.status.conditions] == [("Ready", "True")]
            gpus = custom.list_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL_GPU,
                                                     label_selector=f"{names.LABEL_NODE}={setup.node_name(n)}")["items"]
            assert len(gpus) == setup.CARDS_PER_NODE, [g["metadata"]["name"] for g in gpus]
            assert all((g.get("status") or {}).get("health") for g in gpus), gpus[0]
    finally:
        for n in items:
            custom.delete_collection_cluster_custom_object(
                names.GROUP, names.VERSION, names.PLURAL_GPU, label_selector=f"{names.LABEL_NODE}={setup.node_name(n)}")
            with contextlib.suppress(client.ApiException):  # not created if the test failed early
                core.delete_node(setup.node_name(n))
