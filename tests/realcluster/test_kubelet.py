"""Kubernetes' own scheduler and kubelet on the test containerd: the ground the product's node
tests stand on here (testcluster/README.md, "kubelet")."""

from __future__ import annotations

import time
import uuid

import pytest
from kubernetes import client

pytestmark = pytest.mark.realcluster

RUNNING_WITHIN_S = 120.0


def test_a_pod_is_scheduled_by_the_scheduler_and_run_by_kubelet(
    api_client: client.ApiClient, kubelet_node: str, namespace: str
) -> None:
    from tests.containerd_runtime import find_build

    image = find_build(build_if_missing=False)["ELASTICGPU_TESTRUNTIME_IMAGE_NAME"]
    core = client.CoreV1Api(api_client)
    name = f"p-{uuid.uuid4().hex[:8]}"
    core.create_namespaced_pod(namespace, {
        "metadata": {"name": name},
        "spec": {"hostNetwork": True, "terminationGracePeriodSeconds": 1, "containers": [{
            "name": "main", "image": image, "imagePullPolicy": "Never",
            "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]}]},
    })  # fmt: skip
    deadline = time.monotonic() + RUNNING_WITHIN_S
    while (pod := core.read_namespaced_pod(name, namespace)).status.phase != "Running":
        assert pod.status.phase == "Pending", pod.status
        assert time.monotonic() < deadline, (
            f"pod {namespace}/{name} not Running after {RUNNING_WITHIN_S:.0f} s: {pod.status}"
        )
        time.sleep(0.5)
    assert pod.spec.node_name == kubelet_node  # bound by kube-scheduler, not by the test
    assert pod.status.container_statuses[0].ready
