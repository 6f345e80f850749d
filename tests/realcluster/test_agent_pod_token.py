"""The agent as a DaemonSet pod (agent.nodeHook=nri, issue 34 item 2) on Kubernetes' own API server: no
per-node kubeconfig, only the token of a pod of the chart's DaemonSet, which the API server binds to the
pod and into which it writes the pod's node (ServiceAccountTokenPodNodeInfo, GA in 1.32). The
policies of deploy/policies/agent-node-scope.yaml then let it write its node's objects and refuse
another node's, with their messages; nothing is made up: the API server issues and authenticates the
token, and says itself (SelfSubjectReview) which node it names.

The pod is the chart's pod template (deploy/agent-daemonset.yaml) placed on node A by name, as the
DaemonSet controller places it; the nodes here have no kubelet, so it never runs, and its token is
asked for as kubelet asks for it (TokenRequest bound to the pod). The DaemonSet itself is checked by
the API server (server-side apply, dry run): the fixture server does not serve apps/v1.
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from elasticgpu.agent import errors
from tests.kube_cluster import TestCluster, kube_request
from tests.realcluster import install
from tests.realcluster.control_plane import ControlPlane
from tests.realcluster.test_agent_token import Nodes, _agent, _refused, _until_refused, _usage

pytestmark = pytest.mark.realcluster

NAMESPACE = "elasticgpu-system"
ACCOUNT = "elasticgpu-agent"
NODE_NAME = "authentication.kubernetes.io/node-name"
POD_NAME = "authentication.kubernetes.io/pod-name"
GONE_WITHIN_S = 30.0


@pytest.fixture(scope="module")
def agent_installed(api_client: client.ApiClient, crds_installed: list[str]) -> None:
    """The agent's identity and RBAC (deploy/agent.yaml) and its policies, applied as a user does."""
    install.apply_file(api_client, install.DEPLOY / "agent.yaml")
    install.apply_file(api_client, install.DEPLOY / "policies" / "agent-node-scope.yaml")


@pytest.fixture
def scene(api_client: client.ApiClient, agent_installed: None) -> Iterator[Nodes]:
    """Nodes A and B with a card each (tests/realcluster/test_agent_token.py)."""
    made = Nodes(api_client)
    try:
        yield made
    finally:
        made.cleanup()


def _daemonset_documents() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((install.DEPLOY / "agent-daemonset.yaml").read_text()) if d]


def test_the_api_server_accepts_the_agent_daemonset(api_client: client.ApiClient, agent_installed: None) -> None:
    for doc in _daemonset_documents():
        kind, name = doc["kind"], doc["metadata"]["name"]
        base = "/apis/apps/v1" if kind == "DaemonSet" else "/api/v1"
        plural = {"DaemonSet": "daemonsets", "ConfigMap": "configmaps", "Namespace": "namespaces"}[kind]
        where = f"/namespaces/{doc['metadata']['namespace']}" if kind != "Namespace" else ""
        answer = kube_request(api_client, "PATCH", f"{base}{where}/{plural}/{name}", body=doc,
                              headers={"Content-Type": "application/apply-patch+yaml"},
                              query=[("fieldManager", "chart-test"), ("force", "true"), ("dryRun", "All"),
                                     ("fieldValidation", "Strict")])  # fmt: skip
        assert answer.status in (200, 201), f"{kind} {name}: HTTP {answer.status}: {answer.body[:1500]!r}"


class AgentPod:
    """A pod of the chart's agent DaemonSet on `node`, made by the admin, and a token kubelet would get for it."""

    def __init__(self, api: client.ApiClient, node: str) -> None:
        self.api = api
        # The agent's, not elasticgpu-mps (the MPS daemons' DaemonSet, which runs without a token).
        (daemonset,) = [d for d in _daemonset_documents()
                        if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "elasticgpu-agent"]
        template = copy.deepcopy(daemonset["spec"]["template"])
        self.name = f"elasticgpu-agent-{uuid.uuid4().hex[:6]}"
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {**template["metadata"], "name": self.name, "namespace": NAMESPACE},
                "spec": {**template["spec"], "nodeName": node}}  # fmt: skip
        answer = kube_request(api, "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body=body)
        assert answer.status == 201, answer.body
        self.uid = answer.json()["metadata"]["uid"]
        assert answer.json()["spec"]["serviceAccountName"] == ACCOUNT

    def token(self) -> str:
        """TokenRequest bound to the pod, as kubelet makes for the pod's projected token volume."""
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"expirationSeconds": 3600,
                         "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": self.name, "uid": self.uid}}}
        answer = kube_request(self.api, "POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{ACCOUNT}/token",
                              body=body)  # fmt: skip
        assert answer.status == 201, answer.body
        return str(answer.json()["status"]["token"])

    def delete(self) -> None:
        kube_request(self.api, "DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{self.name}",
                     query=[("gracePeriodSeconds", "0")])  # fmt: skip


def _kubeconfig(cluster: TestCluster, token: str, path: Path) -> Path:
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    config["users"] = [{"name": "agent-pod", "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = "agent-pod"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def _who(cluster: TestCluster, kubeconfig: Path) -> dict[str, Any]:
    """The user info the API server gives the token (SelfSubjectReview, GA in 1.28)."""
    from kubernetes import config as kube_config

    api = kube_config.new_client_from_config(config_file=str(kubeconfig))
    try:
        answer = kube_request(api, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                              body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})  # fmt: skip
        assert answer.status == 201, answer.body
        return dict(answer.json()["status"]["userInfo"])
    finally:
        api.close()


@pytest.fixture
def pod_a(api_client: client.ApiClient, scene: Nodes) -> Iterator[AgentPod]:
    made = AgentPod(api_client, scene.nodes["a"])
    try:
        yield made
    finally:
        made.delete()


def test_the_token_of_an_agent_pod_on_node_a_writes_as_a_and_is_refused_node_b(
    kube_cluster: TestCluster, real_control_plane: ControlPlane, scene: Nodes, pod_a: AgentPod, tmp_path: Path
) -> None:
    a, b = scene.nodes["a"], scene.nodes["b"]
    kubeconfig = _kubeconfig(kube_cluster, pod_a.token(), tmp_path / "pod-a.kubeconfig")
    who = _who(kube_cluster, kubeconfig)
    assert who["username"] == f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}"
    # The API server wrote the pod's node into the token itself.
    assert who["extra"][NODE_NAME] == [a] and who["extra"][POD_NAME] == [pod_a.name], who
    with _agent(kubeconfig, a) as agent_a:
        _until_refused(_usage(agent_a, scene.gpus["b"], 7), "agent-gpus.elasticgpu.io for node B's card")
        _usage(agent_a, scene.gpus["a"], 100)()
        agent_a.patch_node_labels({"nvidia.com/gpu.present": "true"})
        agent_a.create_event(namespace="default", involved={"apiVersion": "v1", "kind": "Node", "name": a},
                             type_="Normal", reason="AgentPodProbe", message="probe",
                             now="2026-12-03T00:00:00Z")  # fmt: skip
        _refused(_usage(agent_a, scene.gpus["b"], 7), 403, "agent-gpus.elasticgpu.io",
                 f"GPU {scene.gpus['b']}: spec.nodeName is {b}",
                 f"the agent of node {a} writes only the GPU objects of its own node")  # fmt: skip
    # The same token, with the agent believing it is node B's: its Node and its Events are refused too.
    with _agent(kubeconfig, b) as intruder:
        _refused(lambda: intruder.patch_node_labels({"nvidia.com/gpu.count": "8"}), 403, "agent-node.elasticgpu.io",
                 f"Node {b}: the agent of node {a} writes only its own Node")  # fmt: skip
        _refused(lambda: intruder.create_event(namespace="default", involved={"apiVersion": "v1", "kind": "Node",
                                                                              "name": b},
                                               type_="Normal", reason="AgentPodProbe", message="forged",
                                               now="2026-12-03T00:00:00Z"), 403, "agent-events.elasticgpu.io",
                 f"source.host is {b}", f"the agent of node {a} reports Events from its own node only")  # fmt: skip
    assert scene.gpu("a")["status"]["usage"] == {"memoryUsed": 100}
    assert "usage" not in scene.gpu("b").get("status", {})
    events = client.CoreV1Api(scene.api).list_namespaced_event("default",
                                                               field_selector="reason=AgentPodProbe").items
    assert {(e.source.host, e.message) for e in events} >= {(a, "probe")}
    assert not [e for e in events if e.message == "forged"]


def test_the_pod_token_dies_with_its_pod(kube_cluster: TestCluster, scene: Nodes, pod_a: AgentPod,
                                         tmp_path: Path) -> None:  # fmt: skip
    kubeconfig = _kubeconfig(kube_cluster, pod_a.token(), tmp_path / "pod-a.kubeconfig")
    with _agent(kubeconfig, scene.nodes["a"]) as agent:
        assert agent.read_gpu(scene.gpus["a"])["spec"]["nodeName"] == scene.nodes["a"]
        pod_a.delete()
        # The API server checks the bound pod (by name and uid) on every request.
        deadline = time.monotonic() + GONE_WITHIN_S
        while True:
            try:
                agent.read_gpu(scene.gpus["a"])
            except errors.KubeError as error:
                assert error.status == 401, str(error)
                break
            assert time.monotonic() < deadline, "a token bound to a deleted pod still authenticates"
            time.sleep(0.5)
