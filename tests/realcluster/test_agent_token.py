"""The agent's Node-bound token on Kubernetes' own API server: real bound service-account tokens
(deploy/agent-kubeconfig.sh, `kubectl create token --bound-object-kind Node`), real RBAC (the
chart's deploy/agent.yaml and nothing wider) and the real ValidatingAdmissionPolicy plugin
(deploy/policies/agent-node-scope.yaml).

tests/policies/ proves the policies' logic on the fixture server through impersonation; here no
identity is made up: the API server authenticates the token it signed and puts the node's name
into the user's extra info itself.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from elasticgpu.agent import errors
from elasticgpu.agent import kube as agent_api
from elasticgpu.api import names
from tests.binding import objects as o
from tests.kube_cluster import TestCluster, kube_request
from tests.realcluster import install
from tests.realcluster.control_plane import ControlPlane

pytestmark = pytest.mark.realcluster

GPUS = f"/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL_GPU}"
NOT_BOUND = "the elasticgpu agent writes with a token that names its node; this one names none"
ENFORCED_WITHIN_S = 60.0


@pytest.fixture(scope="module")
def agent_installed(api_client: client.ApiClient, crds_installed: list[str]) -> None:
    """The agent's identity and RBAC (deploy/agent.yaml) and its policies, applied as a user does."""
    install.apply_file(api_client, install.DEPLOY / "agent.yaml")
    install.apply_file(api_client, install.DEPLOY / "policies" / "agent-node-scope.yaml")


@contextlib.contextmanager
def _agent(kubeconfig: Path, node: str) -> Iterator[agent_api.AgentKube]:
    kube = agent_api.AgentKube(agent_api.load_api_client(str(kubeconfig), None), node_name=node,
                               field_manager="elasticgpu-agent")  # fmt: skip
    try:
        yield kube
    finally:
        kube.close()


class Nodes:
    """Nodes A and B with one card each, made by the admin."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        tag = uuid.uuid4().hex[:8]
        self.nodes = {side: f"real-{tag}-{side}" for side in "ab"}
        self.gpus = {side: f"gpu-{tag}-{side}" for side in "ab"}
        core = client.CoreV1Api(api)
        for side in "ab":
            core.create_node({"metadata": {"name": self.nodes[side]}})
            body = o.gpu(self.gpus[side], node=self.nodes[side])
            body["metadata"]["labels"] = {names.LABEL_NODE: self.nodes[side]}
            answer = kube_request(api, "POST", GPUS, body=body)
            assert answer.status == 201, answer.body

    def gpu(self, side: str) -> dict[str, Any]:
        return dict(kube_request(self.api, "GET", f"{GPUS}/{self.gpus[side]}").json())

    def cleanup(self) -> None:
        core = client.CoreV1Api(self.api)
        for side in "ab":
            kube_request(self.api, "DELETE", f"{GPUS}/{self.gpus[side]}")
            with contextlib.suppress(client.ApiException):
                core.delete_node(self.nodes[side])


@pytest.fixture
def scene(api_client: client.ApiClient, agent_installed: None) -> Iterator[Nodes]:
    made = Nodes(api_client)
    try:
        yield made
    finally:
        made.cleanup()


def _usage(kube: agent_api.AgentKube, gpu: str, used: int) -> Callable[[], object]:
    def write() -> object:
        version = kube.read_gpu(gpu)["metadata"]["resourceVersion"]
        return kube.patch_gpu_status(gpu, resource_version=version, status={"usage": {"memoryUsed": used}})

    return write


def _refused(write: Callable[[], object], status: int, *says: str) -> str:
    with pytest.raises(errors.KubeError) as caught:
        write()
    message = str(caught.value)
    assert caught.value.status == status, message
    for text in says:
        assert text in message, message
    return message


def _until_refused(write: Callable[[], object], what: str) -> None:
    """The API server reads policies through an informer: wait (bounded) until one is in force."""
    deadline = time.monotonic() + ENFORCED_WITHIN_S
    while True:
        try:
            write()
        except errors.KubeError as error:
            if error.status == 403:
                return
            raise
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still allowed after {ENFORCED_WITHIN_S:.0f} s")
        time.sleep(0.5)


def test_a_node_bound_token_writes_its_own_gpu_and_not_another_nodes(
    kube_cluster: TestCluster, real_control_plane: ControlPlane, scene: Nodes, tmp_path: Path
) -> None:
    a, b = scene.nodes["a"], scene.nodes["b"]
    token_a = install.agent_kubeconfig(kube_cluster, a, tmp_path)
    with _agent(token_a, a) as agent_a:
        # The refusal below must come from the policy, not from a policy not yet loaded: wait
        # until node A's agent is refused node B's card once, then check every write.
        _until_refused(_usage(agent_a, scene.gpus["b"], 7), "agent-gpus.elasticgpu.io for node B's card")
        _usage(agent_a, scene.gpus["a"], 100)()
        _refused(_usage(agent_a, scene.gpus["b"], 7), 403, f"GPU {scene.gpus['b']}: spec.nodeName is {b}",
                 f"the agent of node {a} writes only the GPU objects of its own node")  # fmt: skip
    with _agent(token_a, b) as intruder:
        _refused(lambda: intruder.patch_node_labels({"nvidia.com/gpu.count": "8"}), 403,
                 f"Node {b}: the agent of node {a} writes only its own Node")  # fmt: skip
    with _agent(token_a, a) as agent_a:
        agent_a.patch_node_labels({"nvidia.com/gpu.present": "true"})
    assert scene.gpu("a")["status"]["usage"] == {"memoryUsed": 100}
    assert "usage" not in scene.gpu("b").get("status", {})


def test_a_token_bound_to_no_node_reads_but_writes_nothing(
    kube_cluster: TestCluster, scene: Nodes, tmp_path: Path
) -> None:
    assert kube_cluster.kubectl is not None
    env = {**os.environ, "KUBECONFIG": str(kube_cluster.kubeconfig)}
    token = subprocess.run([str(kube_cluster.kubectl), "create", "token", "elasticgpu-agent", "-n",
                            "elasticgpu-system"], env=env, capture_output=True, text=True, timeout=60,
                           check=True).stdout.strip()  # fmt: skip
    config = yaml.safe_load(kube_cluster.kubeconfig.read_text())
    config["users"] = [{"name": "unbound", "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = "unbound"
    unbound = tmp_path / "unbound.kubeconfig"
    unbound.write_text(yaml.safe_dump(config))
    with _agent(unbound, scene.nodes["a"]) as agent:
        _until_refused(_usage(agent, scene.gpus["a"], 1), "agent-gpus.elasticgpu.io for an unbound token")
        _refused(_usage(agent, scene.gpus["a"], 1), 403, NOT_BOUND, "deploy/agent-kubeconfig.sh NODE")
        assert agent.read_gpu(scene.gpus["a"])["spec"]["nodeName"] == scene.nodes["a"]


def test_the_token_dies_with_its_node(kube_cluster: TestCluster, api_client: client.ApiClient, scene: Nodes,
                                      tmp_path: Path) -> None:  # fmt: skip
    a = scene.nodes["a"]
    token_a = install.agent_kubeconfig(kube_cluster, a, tmp_path)
    with _agent(token_a, a) as agent:
        assert agent.read_gpu(scene.gpus["a"])["spec"]["nodeName"] == a
        client.CoreV1Api(api_client).delete_node(a)
        # The API server checks the bound object (by name and uid) on every request.
        deadline = time.monotonic() + 30
        while True:
            try:
                agent.read_gpu(scene.gpus["a"])
            except errors.KubeError as error:
                assert error.status == 401, str(error)
                break
            assert time.monotonic() < deadline, "a token bound to a deleted Node still authenticates"
            time.sleep(0.5)
