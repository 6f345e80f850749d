"""Node autoscaling on Kubernetes' own API server (the local test server ends a deleted pod at once,
whatever its grace): a placeholder that a drain evicted with a grace period, on a node without a
kubelet (KWOK's, a node that died), stays Terminating, since nobody confirms its end. Its claims still
wait, so it must not stand for their ask: the controller removes it (grace 0) and asks again."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pytest
from kubernetes import client

from elasticgpu.controller.decisions import node_requests
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.process.reconciling import Controller
from elasticgpu.controller.settings import AutoscaleSettings, ControllerSettings
from tests.binding import objects as o
from tests.binding.conftest import Cluster, cluster, kube, settle  # noqa: F401  # fixtures

pytestmark = [pytest.mark.realcluster]


def _placeholders(kube: KubeApi, namespace: str) -> dict[str, dict[str, Any]]:  # noqa: F811
    return {p["metadata"]["name"]: p for p in kube.list_labelled_pods(namespace,
                                                                       f"{node_requests.LABEL_NODE_REQUEST}=true")}


def test_a_placeholder_being_deleted_is_removed_at_once_and_asked_again(
        cluster: Cluster, kube: KubeApi, api_client: client.ApiClient) -> None:  # noqa: F811
    prefix, namespace = cluster.prefix, cluster.namespace
    core = client.CoreV1Api(api_client)
    node = f"{prefix}-nokubelet"
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=node, labels={"pool": prefix})))
    controller = Controller(kube, ControllerSettings(autoscale=AutoscaleSettings(
        enabled=True, namespace=namespace, give_up_s=600.0)), namespace=namespace)
    try:
        cluster.klass(o.klass(f"{prefix}-whole", provisioner="elasticgpu.io/physical",
                              parameters={"gpuModel": f"T{prefix}", "nodeSelector": f"pool={prefix}"}))
        cluster.claim(o.claim("waiter", cards=1, cores=None, memory=None, class_name=f"{prefix}-whole"))
        settle(controller)
        controller.node_autoscaling.pass_once()
        [name] = _placeholders(kube, namespace)
        # It lands on the node (as kube-scheduler binds it), then a drain evicts it with 30 s of grace.
        kube._call("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", body={
            "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}})
        kube._call("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}",
                   body={"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 30})
        evicted = _placeholders(kube, namespace)[name]
        assert evicted["metadata"].get("deletionTimestamp"), evicted["metadata"]

        def replaced() -> bool:
            controller.node_autoscaling.pass_once()
            found = _placeholders(kube, namespace).get(name)
            return found is not None and found["metadata"]["uid"] != evicted["metadata"]["uid"]

        deadline = time.monotonic() + 20  # within the eviction's 30 s: the grace never ran out
        while not replaced():
            assert time.monotonic() < deadline, f"still the evicted one: {_placeholders(kube, namespace)}"
            time.sleep(0.2)
        fresh = _placeholders(kube, namespace)[name]
        assert not fresh["metadata"].get("deletionTimestamp") and not fresh["spec"].get("nodeName")
    finally:
        controller.close()
        with contextlib.suppress(client.ApiException):
            core.delete_node(node)
