"""What the pod-sync tests share: a KubeApi, a `World` (nodes, GPUs, classes, claims and pods
of one test, removed afterwards) and gated pods as the admission webhook leaves them (gate and
label set), so these tests need no webhook process. The ValidatingAdmissionPolicies that mirror
kube-apiserver's pod update rules are installed for every test (`pod_update_policies`): an
update of ours that a real cluster refuses fails here too."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from elasticgpu.api import names
from elasticgpu.controller.decisions import pod_gate
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.process.reconciling import Controller
from tests.binding.conftest import Cluster, kube, new_controller, settle

__all__ = ["World", "kube", "new_controller", "settle", "wait_for", "world"]


def wait_for(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


class World(Cluster):
    """`Cluster` plus nodes and pods."""

    def __init__(self, kube: KubeApi, namespace: str, api_client: client.ApiClient) -> None:
        super().__init__(kube, namespace)
        self.core = client.CoreV1Api(api_client)
        self._nodes: list[str] = []

    def node(self, name: str, *, cpu: str | None = "8", memory: str | None = "32Gi",
             labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None) -> str:
        """A Node with allocatable CPU and memory (written through nodes/status, as kubelet does)."""
        metadata = {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}}
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": metadata}
        if taints:
            body["spec"] = {"taints": taints}
        self.core.create_node(body)
        self._nodes.append(name)
        allocatable = {k: v for k, v in (("cpu", cpu), ("memory", memory), ("pods", "110")) if v is not None}
        self.core.patch_node_status(name, {"status": {"allocatable": allocatable, "capacity": allocatable}})
        return name

    def pod(self, name: str, *, claims: dict[str, str] | None = None, inline: dict[str, str] | None = None,
            cpu: str | None = None, memory: str | None = None, gated: bool = True, node_name: str | None = None,
            affinity_terms: list[dict[str, Any]] | None = None, tolerations: list[dict[str, Any]] | None = None,
            containers: tuple[str, ...] = ("main", "side"), labels: dict[str, str] | None = None,
            pod_affinity: dict[str, Any] | None = None, host_port: int | None = None,
            annotations: dict[str, str] | None = None) -> dict[str, Any]:
        """A pod as the admission webhook leaves it: `claims` container -> claim name, `inline`
        container -> inline request; gate and label set when it uses claims (`gated`).
        `pod_affinity`: the podAffinity / podAntiAffinity part of spec.affinity; `host_port`: one
        on the first container; `annotations`: more of them, as the pod's author writes them."""
        extra = dict(annotations or {})
        annotations = {names.claim_annotation(c): v for c, v in (claims or {}).items()}
        annotations.update({names.inline_request_annotation(c): v for c, v in (inline or {}).items()})
        requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
        spec: dict[str, Any] = {
            "containers": [{"name": c, "image": "busybox:1.36", "resources": {"requests": requests} if i == 0 and
                            requests else {}} for i, c in enumerate(containers)],
            "terminationGracePeriodSeconds": 0,
        }
        metadata: dict[str, Any] = {"name": name, "annotations": {**annotations, **extra},
                                    "labels": dict(labels or {})}
        if host_port is not None:
            spec["containers"][0]["ports"] = [{"containerPort": host_port, "hostPort": host_port}]
        if annotations:
            metadata["labels"][names.LABEL_USES_CLAIMS] = "true"
            if gated:
                spec["schedulingGates"] = [{"name": "other.example/gate"}, {"name": names.SCHEDULING_GATE}]
        if node_name:
            spec["nodeName"] = node_name
        if affinity_terms is not None:
            spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": affinity_terms}}}
        if pod_affinity:
            spec.setdefault("affinity", {}).update(pod_affinity)
        if tolerations:
            spec["tolerations"] = tolerations
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
        return dict(self.core.api_client.sanitize_for_serialization(
            self.core.create_namespaced_pod(self.namespace, body)))

    def get_pod(self, name: str) -> dict[str, Any]:
        return self.kube.get_pod(self.namespace, name)

    def delete_pod(self, name: str) -> None:
        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0, _preload_content=False)

    def events(self, reason: str, *, name: str | None = None) -> list[dict[str, Any]]:
        """The Events of this namespace with `reason` (about object `name`, when given)."""
        return [e for e in self.kube.list_events(self.namespace) if e.get("reason") == reason
                and (name is None or (e.get("involvedObject") or {}).get("name") == name)]

    def claims_ready(self, pod: str) -> dict[str, Any] | None:
        """The pod's ClaimsReady condition."""
        return pod_gate.condition_of(self.get_pod(pod))

    def cleanup(self) -> None:
        for pod in self.core.list_namespaced_pod(self.namespace).items:
            self.delete_pod(pod.metadata.name)
        super().cleanup()
        for name in self._nodes:
            with contextlib.suppress(ApiException):
                self.core.delete_node(name)


@pytest.fixture
def world(kube: KubeApi, namespace: str, api_client: client.ApiClient, pod_update_policies: list[str]
          ) -> Iterator[World]:
    objects = World(kube, namespace, api_client)
    try:
        yield objects
    finally:
        objects.cleanup()


def controller_for(world: World) -> Controller:
    """A controller limited to the test's namespace."""
    return new_controller(world.kube, world.namespace)
