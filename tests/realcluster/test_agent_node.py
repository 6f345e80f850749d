"""A GPU node as a user sets it up: the agent with its Node-bound token (deploy/agent.yaml's RBAC,
the policies, deploy/agent-kubeconfig.sh) in front of the node's containerd, and Kubernetes' own
kubelet with `--container-runtime-endpoint` at the agent's CRI socket: every CRI call kubelet makes
(status, stats, image filesystem, sandboxes, containers) goes through the agent's proxy."""

from __future__ import annotations

import contextlib
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client

from elasticgpu.api import names
from elasticgpu.testbed import components, processes
from tests.kube_cluster import TestCluster, kube_request
from tests.realcluster import install, kubelet
from tests.realcluster.control_plane import ControlPlane

pytestmark = pytest.mark.realcluster

NODE = "realcluster-gpu-node"
CARDS = 2
SIMULATION = (
    f"driver: {{version: 550.54.15, cuda: '12.4'}}\ncards: [{{model: A100, memory: 81920, numa: 0, count: {CARDS}}}]\n"
)
WITHIN_S = 120.0


@dataclass
class GpuNode:
    name: str
    agent: processes.Child
    kubelet: kubelet.Kubelet
    image: str
    runtime_endpoint: str  # the node's containerd (behind the agent)


@pytest.fixture(scope="module")
def gpu_node(
    kube_cluster: TestCluster, real_control_plane: ControlPlane, api_client: client.ApiClient, crds_installed: list[str]
) -> Iterator[GpuNode]:
    from tests.containerd_runtime import RuntimeUnavailable, running_containerd

    install.apply_file(api_client, install.DEPLOY / "agent.yaml")
    install.apply_file(api_client, install.DEPLOY / "policies" / "agent-node-scope.yaml")
    core = client.CoreV1Api(api_client)
    # The token is bound to the Node object, which must exist first (kubelet, starting after the
    # agent whose socket it needs, then finds it and keeps it up to date, as with a pre-made Node).
    core.create_node({"metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}}})
    with contextlib.ExitStack() as stack:
        try:
            runtime = stack.enter_context(running_containerd())
        except RuntimeUnavailable as e:
            pytest.skip(str(e))
        home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="egan-", dir="/tmp")))
        token = install.agent_kubeconfig(kube_cluster, NODE, home)
        paths = components.AgentPaths.under(home, NODE, runtime.cdi_dir)
        paths.simulation.write_text(SIMULATION)
        agent = components.start_agent(real_control_plane.children, node=NODE, kubeconfig=token, paths=paths,
                                       events_namespace="default", runtime_socket=runtime.socket,
                                       log_dir=home)  # fmt: skip
        stack.callback(agent.stop)
        processes.wait_until(paths.cri_socket.exists, f"the CRI socket of the agent of {NODE}", timeout_s=WITHIN_S,
                             children=[agent])  # fmt: skip
        kubelet.give_network_config(runtime.directory / "cni" / "conf")
        running = stack.enter_context(kubelet.running_kubelet(real_control_plane, NODE, f"unix://{paths.cri_socket}"))

        def ready() -> bool:
            conditions = core.read_node(NODE).status.conditions or []
            return any(c.type == "Ready" and c.status == "True" for c in conditions)

        processes.wait_until(ready, f"Node {NODE} Ready through the agent's CRI proxy", timeout_s=WITHIN_S,
                             children=[agent, running.child])  # fmt: skip
        yield GpuNode(NODE, agent, running, runtime.image, runtime.endpoint)
    with contextlib.suppress(client.ApiException):
        core.delete_node(NODE)


def test_the_agent_publishes_its_cards_with_its_node_bound_token(
    api_client: client.ApiClient, gpu_node: GpuNode
) -> None:
    path = f"/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL_GPU}"
    deadline = time.monotonic() + WITHIN_S
    while True:
        gpus = kube_request(api_client, "GET", path, query=[("labelSelector", f"{names.LABEL_NODE}={gpu_node.name}")])
        assert gpus.status == 200, gpus.body
        if len(gpus.json()["items"]) == CARDS:
            break
        assert gpu_node.agent.running(), gpu_node.agent.tail(30)
        assert time.monotonic() < deadline, f"the agent did not publish {CARDS} GPUs: {gpu_node.agent.tail(30)}"
        time.sleep(0.5)
    assert all(g["spec"]["nodeName"] == gpu_node.name for g in gpus.json()["items"])
    refused = [line for line in gpu_node.agent.log.read_text(errors="replace").splitlines() if "HTTP 403" in line]
    assert not refused, "the agent was refused under the chart's RBAC and policies:\n" + "\n".join(refused[:10])


def test_kubelet_runs_a_pod_without_a_claim_through_the_agent(
    api_client: client.ApiClient, gpu_node: GpuNode, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    name = f"p-{uuid.uuid4().hex[:8]}"
    core.create_namespaced_pod(namespace, {
        "metadata": {"name": name},
        "spec": {"hostNetwork": True, "terminationGracePeriodSeconds": 1,
                 "nodeSelector": {"kubernetes.io/hostname": gpu_node.name},
                 "containers": [{"name": "main", "image": gpu_node.image, "imagePullPolicy": "Never",
                                 "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]}]},
    })  # fmt: skip
    deadline = time.monotonic() + WITHIN_S
    while (pod := core.read_namespaced_pod(name, namespace)).status.phase != "Running":
        assert pod.status.phase == "Pending", pod.status
        assert time.monotonic() < deadline, (
            f"{namespace}/{name} not Running: {pod.status}\n{gpu_node.kubelet.child.tail(20)}"
        )
        time.sleep(0.5)
    from tests.realcluster.test_claim_pod import _container_env, container_env

    env = _container_env(gpu_node.runtime_endpoint, namespace, name)
    # A pod without a claim sees no card: the agent sets `void` (a CUDA image's `all` would see every card).
    assert env.get("NVIDIA_VISIBLE_DEVICES") == "void", {k: v for k, v in env.items() if "NVIDIA" in k}
    # ... as the process inside sees it (env run in the container), and no limits file of a claim.
    inside = container_env(gpu_node.runtime_endpoint, namespace, name)
    assert inside.get("NVIDIA_VISIBLE_DEVICES") == "void", inside
    assert "ELASTICGPU_LIMITS_FILE" not in inside, inside
    core.delete_namespaced_pod(name, namespace)
    deadline = time.monotonic() + WITHIN_S
    while name in [p.metadata.name for p in core.list_namespaced_pod(namespace).items]:
        assert time.monotonic() < deadline, f"kubelet did not finish deleting {namespace}/{name} through the agent"
        time.sleep(0.5)
