"""Preemption honours a real PodDisruptionBudget (issue 27 item 2), on Kubernetes' own API server: its
Eviction API answers 429 while the budget (kept by kube-controller-manager's disruption controller)
allows no disruption, and the controller neither deletes the pod nor fails the victim meanwhile; once
the budget allows one, the eviction goes through and the preemptor binds.

The victim's pod is bound to a Node object with no kubelet and written Running and Ready by the test
(as a kubelet would report it), so that the budget counts it healthy: the eviction API ignores budgets
for pods that are not running. The controller runs in the test's process with the chart's identity
(deploy/controller.yaml's ServiceAccount, ClusterRole and bindings, a token of that ServiceAccount):
the eviction, the pod reads and the ElasticGPU writes of a preemption pass the real RBAC.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from elasticgpu.api import names
from elasticgpu.controller.decisions import preemption
from elasticgpu.controller.edge.kube import KubeApi
from tests.binding import objects as o
from tests.binding.conftest import Cluster, cluster, kube, new_controller, settle  # noqa: F401  # fixtures
from tests.kube_cluster import TestCluster
from tests.realcluster import install
from tests.realcluster.test_claim_pod import SYSTEM

pytestmark = pytest.mark.realcluster


def _until(check: Any, what: str, *, timeout_s: float, work: Any = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f}s waiting for {what}"
        if work is not None:
            work()
        time.sleep(0.2)


def _as_the_chart(kube_cluster: TestCluster, api_client: client.ApiClient, home: Path) -> KubeApi:
    """The controller's API client with the chart's ServiceAccount and RBAC, not the admin's."""
    install.apply_file(api_client, install.DEPLOY / "controller.yaml", install.IDENTITY_KINDS)
    return KubeApi.from_kubeconfig(str(install.service_account_kubeconfig(
        kube_cluster, "elasticgpu-controller", SYSTEM, home)))


def test_a_budget_that_allows_no_disruption_holds_the_preemption_until_it_does(
        cluster: Cluster, kube_cluster: TestCluster, api_client: client.ApiClient,  # noqa: F811
        tmp_path: Path) -> None:
    core, policy = client.CoreV1Api(api_client), client.PolicyV1Api(api_client)
    namespace = cluster.namespace
    node = f"{cluster.prefix}-node"
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    try:
        model = f"T{cluster.prefix}"
        cluster.gpu(o.gpu(f"gpu-{cluster.prefix}-0", node=node, model=model))
        for klass, priority in (("low", None), ("high", 1000)):
            body = o.klass(f"{cluster.prefix}-{klass}", parameters={"gpuModel": model})
            if priority is not None:
                body["priority"] = priority
            cluster.klass(body)
        cluster.claim(o.claim("batch", cores=100, memory=None, class_name=f"{cluster.prefix}-low"))
        controller = new_controller(_as_the_chart(kube_cluster, api_client, tmp_path), namespace)
        settle(controller)
        assert cluster.get_claim("batch")["status"]["phase"] == "Bound"

        core.create_namespaced_pod(namespace, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "trainer", "labels": {"app": "trainer", names.LABEL_USES_CLAIMS: "true"},
                         "annotations": {names.claim_annotation("main"): "batch"}},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox:1.36"}],
                     "tolerations": [{"operator": "Exists"}]}})
        now = "2026-01-01T00:00:00Z"
        core.patch_namespaced_pod_status("trainer", namespace, {"status": {
            "phase": "Running", "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}]}})
        policy.create_namespaced_pod_disruption_budget(namespace, {
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "trainer"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "trainer"}}}})

        def allowed() -> int | None:
            status = policy.read_namespaced_pod_disruption_budget("trainer", namespace).status
            return None if status is None or status.current_healthy != 1 else status.disruptions_allowed

        _until(lambda: allowed() == 0, "the disruption controller to count the pod healthy", timeout_s=60)
        settle(controller)
        cluster.claim(o.claim("urgent", cores=50, memory=None, class_name=f"{cluster.prefix}-high"))
        settle(controller)
        status = cluster.get_claim("urgent")["status"]
        assert (status["phase"], status["reason"]) == ("Pending", preemption.REASON_PREEMPTING), status
        assert "PodDisruptionBudget" in status["message"]
        pod = core.read_namespaced_pod("trainer", namespace)
        assert pod.metadata.deletion_timestamp is None, "the budget was bypassed"
        assert cluster.get_claim("batch")["status"]["phase"] == "Bound", "the victim keeps its card meanwhile"

        policy.patch_namespaced_pod_disruption_budget("trainer", namespace, {"spec": {"minAvailable": 0}})
        _until(lambda: (allowed() or 0) >= 1, "the budget to allow a disruption", timeout_s=60)
        _until(lambda: cluster.get_claim("urgent")["status"].get("phase") == "Bound", "the preemptor Bound",
               timeout_s=60, work=controller.drain)
        assert cluster.get_claim("batch")["status"]["phase"] == "Lost"
        try:
            evicted = core.read_namespaced_pod("trainer", namespace)
            assert evicted.metadata.deletion_timestamp is not None, "the pod was not evicted"
        except client.ApiException as err:
            assert err.status == 404
    finally:
        with contextlib.suppress(client.ApiException):
            core.delete_namespaced_pod("trainer", namespace, grace_period_seconds=0)
        with contextlib.suppress(client.ApiException):
            core.delete_node(node)
