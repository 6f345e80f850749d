"""A GPU node in NRI mode (issue 34 item 3), on Kubernetes' own control plane and kubelet: containerd
with NRI switched on (its NRI socket in the test's folder), kubelet's runtime endpoint containerd's
own CRI socket (nothing between them), and the agent with `--node-hook nri --nri-socket <that
socket>` (its Node-bound token, the simulated cards of test_agent_node.py's `gpu_node`), whose NRI
plugin (nri-plugin/build.sh's, cached) containerd calls at each CreateContainer.

A user's pod with a claim (gated by the webhook, bound by the controller, placed by kube-scheduler)
runs with its card and nobody else's; a pod without a claim runs and sees none."""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from elasticgpu.api import names
from elasticgpu.testbed import components, processes
from tests.kube_cluster import TestCluster, kube_request
from tests.realcluster import install, kubelet
from tests.realcluster.control_plane import ControlPlane
from tests.realcluster.test_agent_node import SIMULATION
from tests.realcluster.test_claim_pod import _container_env, container_env, container_exec
from tests.realcluster.test_claim_pod import product as product  # the module fixture, shared

pytestmark = [pytest.mark.realcluster, pytest.mark.timeout(300)]

NODE = "realcluster-nri-node"
WITHIN_S = 120.0
CUSTOM = f"/apis/{names.GROUP}/{names.VERSION}"
LIMITS_FILE = "/run/elasticgpu/limits.json"


@dataclass
class NriGpuNode:
    name: str
    agent: processes.Child
    kubelet: kubelet.Kubelet
    image: str
    runtime_endpoint: str  # containerd's own CRI socket: kubelet's runtime endpoint too


def _agent_command(node: str, kubeconfig: Path, paths: components.AgentPaths, runtime_socket: Path,
                   nri_socket: Path, plugin: str, home: Path) -> list[str]:  # fmt: skip
    """The agent of `node` in NRI mode with the simulated backend (components.start_agent's flags, but
    the NRI hook in place of the CRI proxy; --cri-upstream: its private CRI channel to containerd, for
    stops; no --cri-listen, which NRI mode does not serve)."""
    return components._elasticgpu(
        "agent", "run", "--node-name", node, "--kubeconfig", str(kubeconfig), "--backend", "simulated",
        "--simulation", str(paths.simulation), "--device-dir", str(paths.device_dir),
        "--ledger-url", f"sqlite:///{paths.ledger}", "--metrics-bind-address", "0",
        "--events-namespace", "default", "--heartbeat-interval-s", "5", "--rediscover-interval-s", "2",
        "--inject-dir", str(paths.inject_dir), "--cdi-dir", str(paths.cdi_dir),
        "--cri-front-dir", str(paths.front_dir), "--limits-dir", str(home / "limits"),
        "--cri-proxy", "true", "--node-hook", "nri", "--nri-socket", str(nri_socket), "--nri-plugin", plugin,
        "--nri-agent-socket", str(home / "nri-agent.sock"), "--cri-upstream", str(runtime_socket),
    )  # fmt: skip


def _unclaimed_env_through_nri(endpoint: str, image: str) -> dict[str, str] | None:
    """Create (not start) a container of a pod without a claim straight on containerd, before kubelet
    runs (a kubelet removes sandboxes it does not know), and return the environment of its OCI spec;
    None when the creation failed. `NVIDIA_VISIBLE_DEVICES=void` there means the agent's NRI plugin is
    registered and answering (NRI fails open: untouched before)."""
    import grpc

    from elasticgpu.agent.cri import api
    from tests.containerd_runtime import container_config, sandbox_config

    with grpc.insecure_channel(endpoint) as channel:
        stub = api.services.RuntimeServiceStub(channel)
        sandbox = sandbox_config(name=f"probe-{uuid.uuid4().hex[:6]}", namespace="default", uid=uuid.uuid4().hex)
        pod_id = stub.RunPodSandbox(api.pb.RunPodSandboxRequest(config=sandbox), timeout=30).pod_sandbox_id
        try:
            config = container_config(name="main", image=image, sandbox=sandbox)
            try:
                made = stub.CreateContainer(api.pb.CreateContainerRequest(
                    pod_sandbox_id=pod_id, config=config, sandbox_config=sandbox), timeout=30)  # fmt: skip
            except grpc.RpcError:
                return None
            status = stub.ContainerStatus(api.pb.ContainerStatusRequest(container_id=made.container_id, verbose=True),
                                          timeout=10)  # fmt: skip
            spec = json.loads(status.info["info"])["runtimeSpec"]
            return dict(item.split("=", 1) for item in spec["process"]["env"])
        finally:
            with contextlib.suppress(grpc.RpcError):
                stub.StopPodSandbox(api.pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=30)
                stub.RemovePodSandbox(api.pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=30)


@pytest.fixture(scope="module")
def nri_gpu_node(
    kube_cluster: TestCluster, real_control_plane: ControlPlane, api_client: client.ApiClient, crds_installed: list[str]
) -> Iterator[NriGpuNode]:
    """A GPU node in NRI mode (see the module docstring): skips when the test runtime or the NRI
    plugin cannot be had; fails when they are there but the node does not come up."""
    from tests.agent.nri.conftest import plugin_binary
    from tests.containerd_runtime import RuntimeUnavailable, running_containerd

    try:
        plugin = plugin_binary()
    except RuntimeUnavailable as e:
        pytest.skip(f"no NRI plugin: {e}")
    install.apply_file(api_client, install.DEPLOY / "agent.yaml")
    install.apply_file(api_client, install.DEPLOY / "policies" / "agent-node-scope.yaml")
    core = client.CoreV1Api(api_client)
    core.create_node({"metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}}})
    with contextlib.ExitStack() as stack:
        stack.callback(_delete_node, core, NODE)
        try:
            runtime = stack.enter_context(running_containerd(nri=True))
        except RuntimeUnavailable as e:
            pytest.skip(str(e))
        assert runtime.nri_socket is not None
        home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="egnr-", dir="/tmp")))
        token = install.agent_kubeconfig(kube_cluster, NODE, home)
        paths = components.AgentPaths.under(home, NODE, runtime.cdi_dir)
        paths.simulation.write_text(SIMULATION)
        agent = real_control_plane.children.start(
            f"agent of {NODE}", _agent_command(NODE, token, paths, runtime.socket, runtime.nri_socket, plugin, home),
            log=home / f"agent-{NODE}.log", cwd=components.REPO_ROOT)  # fmt: skip
        stack.callback(agent.stop)
        found: list[dict[str, str] | None] = [None]

        def plugin_answers() -> bool:
            found[0] = _unclaimed_env_through_nri(runtime.endpoint, runtime.image)
            return (found[0] or {}).get("NVIDIA_VISIBLE_DEVICES") == "void"

        try:
            processes.wait_until(plugin_answers, f"the NRI plugin of the agent of {NODE} answering containerd",
                                 timeout_s=WITHIN_S, children=[agent])  # fmt: skip
        except processes.DemoError as e:
            pytest.fail(f"{e}; last probe's env: {found[0]}\n{agent.tail(40)}", pytrace=False)
        kubelet.give_network_config(runtime.directory / "cni" / "conf")
        running = stack.enter_context(kubelet.running_kubelet(real_control_plane, NODE, runtime.endpoint))
        assert running.config["containerRuntimeEndpoint"] == f"unix://{runtime.socket}"

        def ready() -> bool:
            conditions = core.read_node(NODE).status.conditions or []
            return any(c.type == "Ready" and c.status == "True" for c in conditions)

        processes.wait_until(ready, f"Node {NODE} Ready on containerd's own socket", timeout_s=WITHIN_S,
                             children=[agent, running.child])  # fmt: skip
        yield NriGpuNode(NODE, agent, running, runtime.image, runtime.endpoint)


def _delete_node(core: client.CoreV1Api, node: str) -> None:
    with contextlib.suppress(client.ApiException):
        core.delete_node(node)


def _pod(name: str, image: str, claim: str | None, node: str | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "annotations": {names.claim_annotation("main"): claim} if claim else {}},
        "spec": {"hostNetwork": True, "terminationGracePeriodSeconds": 1,
                 **({"nodeSelector": {"kubernetes.io/hostname": node}} if node else {}),
                 "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                                 "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]}]},
    }  # fmt: skip


def _wait_running(core: client.CoreV1Api, namespace: str, pods: list[str], node: NriGpuNode) -> dict[str, Any]:
    deadline = time.monotonic() + WITHIN_S
    while True:
        now = {name: core.read_namespaced_pod(name, namespace) for name in pods}
        if all(p.status.phase == "Running" for p in now.values()):
            return now
        assert all(p.status.phase in ("Pending", "Running") for p in now.values()), {
            n: (p.status.phase, p.status.reason, p.status.message, p.status.container_statuses) for n, p in now.items()
        }
        assert time.monotonic() < deadline, (
            f"not Running: { {n: (p.spec.node_name, p.status) for n, p in now.items()} }\n"
            f"{node.kubelet.child.tail(20)}\n{node.agent.tail(20)}"
        )
        time.sleep(0.5)


def _nvidia_devices(node: NriGpuNode, namespace: str, pod: str) -> list[str]:
    return sorted(container_exec(node.runtime_endpoint, namespace, pod, ["sh", "-c", "ls /dev | grep nvidia; true"])
                  .split())  # fmt: skip


def test_a_pod_without_a_claim_runs_and_sees_no_card(
    api_client: client.ApiClient, nri_gpu_node: NriGpuNode, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(namespace, _pod("plain", nri_gpu_node.image, None, node=nri_gpu_node.name))
    _wait_running(core, namespace, ["plain"], nri_gpu_node)
    env = _container_env(nri_gpu_node.runtime_endpoint, namespace, "plain")
    assert env.get("NVIDIA_VISIBLE_DEVICES") == "void", {k: v for k, v in env.items() if "NVIDIA" in k}
    inside = container_env(nri_gpu_node.runtime_endpoint, namespace, "plain")
    assert inside.get("NVIDIA_VISIBLE_DEVICES") == "void", inside
    assert "ELASTICGPU_LIMITS_FILE" not in inside, inside
    assert _nvidia_devices(nri_gpu_node, namespace, "plain") == []
    core.delete_namespaced_pod("plain", namespace)


def test_pods_with_claims_run_each_with_its_card_and_not_the_others(
    api_client: client.ApiClient, product: None, nri_gpu_node: NriGpuNode, namespace: str
) -> None:
    """Two claims of 60 cores of a node's two 100-core cards: each binds a card of its own; each pod is
    gated, bound, placed on the node and Running with its card only (env and device nodes)."""
    core = client.CoreV1Api(api_client)
    class_name = f"nri-{uuid.uuid4().hex[:8]}"
    klass = {"apiVersion": names.API_VERSION, "kind": names.KIND_CLASS, "metadata": {"name": class_name},
             "provisioner": names.PROVISIONER_GPUSHARE, "parameters": {"gpuModel": "A100"},
             "reclaimPolicy": "Delete", "bindingMode": "Immediate"}  # fmt: skip
    assert kube_request(api_client, "POST", f"{CUSTOM}/{names.PLURAL_CLASS}", body=klass).status == 201
    claims = f"{CUSTOM}/namespaces/{namespace}/{names.PLURAL_CLAIM}"
    for name in ("first", "second"):
        claim = {"apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM, "metadata": {"name": name},
                 "spec": {"elasticGPUClassName": class_name, "resources": {"requests": {
                     names.RESOURCE_CORE: 60, names.RESOURCE_MEMORY: "10Gi"}}}}  # fmt: skip
        answer = kube_request(api_client, "POST", claims, body=claim)
        assert answer.status == 201, answer.body
    # The webhook gates a pod naming a claim (the real API server calls it once it is registered).
    deadline = time.monotonic() + WITHIN_S
    while True:
        probe = kube_request(api_client, "POST", f"/api/v1/namespaces/{namespace}/pods", query=[("dryRun", "All")],
                             body=_pod("probe", nri_gpu_node.image, "first")).json()  # fmt: skip
        if any(g.get("name") == names.SCHEDULING_GATE for g in probe["spec"].get("schedulingGates") or []):
            break
        assert time.monotonic() < deadline, f"the API server does not call the webhook: {probe}"
        time.sleep(0.5)
    for name in ("first", "second"):
        created = core.create_namespaced_pod(namespace, _pod(name, nri_gpu_node.image, name))
        assert [g.name for g in created.spec.scheduling_gates or []] == [names.SCHEDULING_GATE]
    pods = _wait_running(core, namespace, ["first", "second"], nri_gpu_node)
    cards: dict[str, str] = {}
    device_nodes: dict[str, str] = {}
    for name in ("first", "second"):
        bound = kube_request(api_client, "GET", f"{claims}/{name}").json()["status"]
        assert bound["phase"] == "Bound" and bound["nodeName"] == nri_gpu_node.name, bound
        assert len(bound["gpus"]) == 1, bound
        cards[name] = bound["gpus"][0]
        assert pods[name].spec.node_name == nri_gpu_node.name
    assert cards["first"] != cards["second"], cards
    for name, other in (("first", "second"), ("second", "first")):
        env = _container_env(nri_gpu_node.runtime_endpoint, namespace, name)
        assert env.get("NVIDIA_VISIBLE_DEVICES") == cards[name], env
        assert env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == "60", env
        inside = container_env(nri_gpu_node.runtime_endpoint, namespace, name)
        assert inside.get("NVIDIA_VISIBLE_DEVICES") == cards[name], inside
        assert cards[other] not in " ".join(f"{k}={v}" for k, v in inside.items()), inside
        # Its claim's limits file, mounted by the NRI adjustment (docs/resize-node.md).
        assert inside.get("ELASTICGPU_LIMITS_FILE") == LIMITS_FILE, inside
        limits = json.loads(container_exec(nri_gpu_node.runtime_endpoint, namespace, name, ["cat", LIMITS_FILE]))
        assert (limits["claim"], limits["cores"], limits["memoryMiB"]) == (f"{namespace}/{name}", 60, 10240), limits
        # Its card's device node only (with the control nodes), not the other's.
        card_nodes = [d for d in _nvidia_devices(nri_gpu_node, namespace, name) if d.removeprefix("nvidia").isdigit()]
        assert len(card_nodes) == 1, card_nodes
        device_nodes[name] = card_nodes[0]
    assert device_nodes["first"] != device_nodes["second"], device_nodes
    for name in ("first", "second"):
        core.delete_namespaced_pod(name, namespace)
        kube_request(api_client, "DELETE", f"{claims}/{name}")
    kube_request(api_client, "DELETE", f"{CUSTOM}/{names.PLURAL_CLASS}/{class_name}")
