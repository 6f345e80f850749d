"""Issue 46 item 2 on a real kubelet: a node whose cards NVIDIA's device plugin hands out is moved to elasticgpu
with `kubectl egpu handover NODE --to elasticgpu`, and back with `--to device-plugin`.

The node: containerd with NRI, Kubernetes' kubelet straight on it, and a fake NVIDIA device plugin
(tests/realcluster/fake_device_plugin: real gRPC on a unix socket in kubelet's device-plugin folder, registered
with kubelet, `nvidia.com/gpu` = the simulated cards' uuids). The agent (NRI mode, the same simulated cards,
`--device-plugin-dir` kubelet's folder) is started once the node is labelled for it and stands by while the
plugin is live.

The test plays the two controllers a cluster has there and this one does not: the GPU Operator (its device
plugin runs on the node unless `nvidia.com/gpu.deploy.device-plugin=false`; stopping it removes its socket, and
kubelet then offers 0) and the agent's DaemonSet (an agent runs on the node while it is labelled
`elasticgpu.io/agent=true`, with a pod of the DaemonSet's labels standing for it, which goes once the agent has
stopped). Both act on what they see on the Node while the command runs, from the test's main thread (children
are spawned there only: they die with the thread that spawned them).

What must hold: the `nvidia.com/gpu` pod runs with the plugin's card until the command evicts it, and no GPU
object of the node is published while it exists (nothing handed out twice); the agent's cards are then published
and a claim pod runs with one; the way back leaves no GPU object of the node, and a `nvidia.com/gpu` pod runs
again, given its card by the plugin after the claim pod has gone.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from elasticgpu.agent.discovery.simulated import simulated_uuid
from elasticgpu.api import names, node_handover
from elasticgpu.testbed import components, processes
from tests.kube_cluster import TestCluster, kube_request
from tests.realcluster import install, kubelet
from tests.realcluster.control_plane import ControlPlane
from tests.realcluster.test_agent_node import CARDS, SIMULATION
from tests.realcluster.test_claim_pod import SYSTEM, _container_env
from tests.realcluster.test_claim_pod import product as product  # the module fixture, shared
from tests.realcluster.test_nri_node import _agent_command

pytestmark = [pytest.mark.realcluster, pytest.mark.timeout(900)]

NODE = "realcluster-handover-node"
WITHIN_S = 180.0
COMMAND_WITHIN_S = 420.0
CUSTOM = f"/apis/{names.GROUP}/{names.VERSION}"
AGENT_POD_LABELS = {"app.kubernetes.io/name": "elasticgpu", "app.kubernetes.io/component": "agent"}
STAND_IN = "agent-stand-in"
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
"""kubelet's device-plugin folder: fixed in kubelet (pluginapi.DevicePluginPath), not under --root-dir; the agent's
default --device-plugin-dir too."""
UUIDS = [simulated_uuid(NODE, i) for i in range(CARDS)]
SLEEP = ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]
ALLOCATED = re.compile(r"^allocated (\S+) at ([0-9.]+)$")


@dataclass
class HandoverNode:
    """The node and what the test runs on it in place of the GPU Operator and the agent's DaemonSet."""

    core: client.CoreV1Api
    api: client.ApiClient
    plane: ControlPlane
    kubelet: kubelet.Kubelet
    image: str
    runtime_endpoint: str
    home: Path
    token: Path
    paths: components.AgentPaths
    nri_socket: Path
    runtime_socket: Path
    nri_plugin: str
    plugin: processes.Child | None = None
    agent: processes.Child | None = None
    starts: list[str] = field(default_factory=list)
    """What the stand-ins did, in order (for the failure messages)."""

    device_plugin_dir: Path = DEVICE_PLUGIN_DIR
    kubelet_socket_inode: int = 0
    """kubelet.sock's inode once this node's kubelet made it: another kubelet started on the machine makes a new one
    (and empties the folder), which this test cannot survive; told plainly (`check_folder`)."""

    def check_folder(self) -> None:
        try:
            now = (self.device_plugin_dir / "kubelet.sock").stat().st_ino
        except FileNotFoundError:
            now = 0
        assert now == self.kubelet_socket_inode, (
            f"another kubelet started on this machine during the test: {self.device_plugin_dir}/kubelet.sock was made"
            " again (kubelet hard-codes that folder; this test needs it to itself)")

    def start_plugin(self) -> None:
        self.plugin = self.plane.children.start("fake device plugin", [
            sys.executable, "-m", "tests.realcluster.fake_device_plugin", "--dir", str(self.device_plugin_dir),
            "--ids", ",".join(UUIDS)], log=self.home / "device-plugin.log", cwd=components.REPO_ROOT)  # fmt: skip
        self.starts.append("device plugin started")

    def stop_plugin(self) -> None:
        assert self.plugin is not None
        self.plugin.stop()
        (self.device_plugin_dir / "nvidia-gpu.sock").unlink(missing_ok=True)  # the pod's folder goes with it
        self.plugin = None
        self.starts.append("device plugin stopped")

    def start_agent(self) -> None:
        self.agent = self.plane.children.start(f"agent of {NODE}", [
            *_agent_command(NODE, self.token, self.paths, self.runtime_socket, self.nri_socket, self.nri_plugin,
                            self.home),
            "--device-plugin-dir", str(self.device_plugin_dir), "--allocator-check-interval-s", "2",
        ], log=self.home / "agent.log", cwd=components.REPO_ROOT)  # fmt: skip
        with contextlib.suppress(client.ApiException):  # there from an earlier start
            self.core.create_namespaced_pod(SYSTEM, {
                "metadata": {"name": STAND_IN, "labels": AGENT_POD_LABELS},
                "spec": {"nodeName": NODE, "hostNetwork": True, "terminationGracePeriodSeconds": 1,
                         "tolerations": [{"operator": "Exists"}],
                         "containers": [{"name": "agent", "image": self.image, "imagePullPolicy": "Never",
                                         "command": SLEEP}]},
            })  # fmt: skip
        self.starts.append("agent started")

    def stop_agent(self) -> None:
        assert self.agent is not None
        self.agent.stop()
        self.agent = None
        with contextlib.suppress(client.ApiException):
            self.core.delete_namespaced_pod(STAND_IN, SYSTEM, grace_period_seconds=1)
        self.starts.append("agent stopped")

    def labels(self) -> dict[str, str]:
        return dict(self.core.read_node(NODE).metadata.labels or {})

    def act(self) -> None:
        """One look of the stand-in GPU Operator and DaemonSet at the Node's labels, and what they do about it."""
        labels = self.labels()
        plugin_wanted = labels.get(node_handover.LABEL_DEVICE_PLUGIN_DEPLOY) != "false"
        if plugin_wanted and (self.plugin is None or not self.plugin.running()):
            self.start_plugin()
        elif not plugin_wanted and self.plugin is not None:
            self.stop_plugin()
        agent_wanted = labels.get(node_handover.LABEL_AGENT) == "true"
        if agent_wanted and self.agent is None:
            self.start_agent()
        elif not agent_wanted and self.agent is not None:
            self.stop_agent()

    def offered(self) -> int:
        allocatable = self.core.read_node(NODE).status.allocatable or {}
        return int(allocatable.get("nvidia.com/gpu", "0"))

    def gpu_objects(self) -> list[dict[str, Any]]:
        answer = kube_request(self.api, "GET", f"{CUSTOM}/{names.PLURAL_GPU}",
                              query=[("labelSelector", f"{names.LABEL_NODE}={NODE}")])  # fmt: skip
        assert answer.status == 200, answer.body
        items: list[dict[str, Any]] = answer.json()["items"]
        return items

    def allocations(self) -> list[tuple[str, float]]:
        """What the plugin handed out, and when (its log)."""
        text = (self.home / "device-plugin.log").read_text(errors="replace")
        return [(m[1], float(m[2])) for line in text.splitlines() if (m := ALLOCATED.match(line))]

    def tails(self) -> str:
        parts = [f"stand-ins: {self.starts}", f"kubelet:\n{self.kubelet.child.tail(15)}"]
        parts.append(f"device plugin:\n{(self.home / 'device-plugin.log').read_text(errors='replace')[-2000:]}")
        if (self.home / "agent.log").exists():
            parts.append(f"agent:\n{(self.home / 'agent.log').read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)


def _wait(done: Any, what: str, node: HandoverNode, within_s: float = WITHIN_S) -> Any:
    deadline = time.monotonic() + within_s
    while not (found := done()):
        node.check_folder()
        assert node.plugin is None or node.plugin.running(), f"the fake device plugin exited\n{node.tails()}"
        assert node.agent is None or node.agent.running(), f"the agent exited\n{node.tails()}"
        assert time.monotonic() < deadline, f"{what} did not happen within {within_s:.0f} s\n{node.tails()}"
        time.sleep(0.5)
    return found


@pytest.fixture(scope="module")
def handover_node(
    kube_cluster: TestCluster, real_control_plane: ControlPlane, api_client: client.ApiClient, crds_installed: list[str]
) -> Iterator[HandoverNode]:
    """containerd with NRI, kubelet on it (Ready), the fake device plugin registered (the Node offers
    nvidia.com/gpu: CARDS); no agent yet. Skips when the runtime or the NRI plugin is not built."""
    from tests.agent.nri.conftest import plugin_binary
    from tests.containerd_runtime import RuntimeUnavailable, running_containerd

    try:
        nri_plugin = plugin_binary()
    except RuntimeUnavailable as e:
        pytest.skip(f"no NRI plugin: {e}")
    install.apply_file(api_client, install.DEPLOY / "agent.yaml")
    install.apply_file(api_client, install.DEPLOY / "policies" / "agent-node-scope.yaml")
    core = client.CoreV1Api(api_client)
    core.create_node({"metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}}})
    with contextlib.ExitStack() as stack:
        stack.callback(lambda: core.delete_node(NODE) if _exists(core) else None)
        try:
            runtime = stack.enter_context(running_containerd(nri=True))
        except RuntimeUnavailable as e:
            pytest.skip(str(e))
        assert runtime.nri_socket is not None
        home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="eghd-", dir="/tmp")))
        token = install.agent_kubeconfig(kube_cluster, NODE, home)
        paths = components.AgentPaths.under(home, NODE, runtime.cdi_dir)
        paths.simulation.write_text(SIMULATION)
        kubelet.give_network_config(runtime.directory / "cni" / "conf")
        running = stack.enter_context(kubelet.running_kubelet(real_control_plane, NODE, runtime.endpoint))
        node = HandoverNode(core, api_client, real_control_plane, running, runtime.image, runtime.endpoint, home,
                            token, paths, runtime.nri_socket, runtime.socket, nri_plugin)  # fmt: skip
        stack.callback(lambda: node.stop_agent() if node.agent is not None else None)
        stack.callback(lambda: node.stop_plugin() if node.plugin is not None else None)

        def ready() -> bool:
            conditions = core.read_node(NODE).status.conditions or []
            return any(c.type == "Ready" and c.status == "True" for c in conditions)

        deadline = time.monotonic() + WITHIN_S
        while not (ready() and (DEVICE_PLUGIN_DIR / "kubelet.sock").exists()):
            assert time.monotonic() < deadline, f"Node {NODE} not Ready\n{running.child.tail(20)}"
            time.sleep(0.5)
        node.kubelet_socket_inode = (DEVICE_PLUGIN_DIR / "kubelet.sock").stat().st_ino
        node.start_plugin()
        _wait(lambda: node.offered() == CARDS, f"kubelet to offer nvidia.com/gpu: {CARDS} from the fake plugin", node)
        yield node


def _exists(core: client.CoreV1Api) -> bool:
    try:
        core.read_node(NODE)
    except client.ApiException:
        return False
    return True


def _gpu_pod(name: str, image: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"hostNetwork": True, "terminationGracePeriodSeconds": 1,
                 "nodeSelector": {"kubernetes.io/hostname": NODE},
                 "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}},
                                 "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]}]},
    }  # fmt: skip


def _running(node: HandoverNode, namespace: str, name: str) -> bool:
    pod = node.core.read_namespaced_pod(name, namespace)
    assert pod.status.phase in ("Pending", "Running"), (pod.status, node.tails())
    return bool(pod.status.phase == "Running")


def _pod_exists(node: HandoverNode, namespace: str, name: str) -> bool:
    return name in {p.metadata.name for p in node.core.list_namespaced_pod(namespace).items}


@dataclass
class Sample:
    at: float
    gpu_pod: bool  # the nvidia.com/gpu pod exists (its container may hold its card until it is gone)
    gpu_pod_deleting: bool
    gpu_objects: int
    claimed: frozenset[str]  # cards ElasticGPUs hold on the node


def _claimed(node: HandoverNode) -> frozenset[str]:
    answer = kube_request(node.api, "GET", f"{CUSTOM}/{names.PLURAL_ELASTIC_GPU}")
    cards: set[str] = set()
    for egpu in answer.json().get("items", []):
        spec = egpu.get("spec") or {}
        cards |= set((spec.get("physicalGPU") or {}).get("gpuNames") or [])
        if share := (spec.get("gpuShare") or {}).get("gpuName"):
            cards.add(share)
    return frozenset(cards)


def _handover(node: HandoverNode, namespace: str, to: str, watched: str, samples: list[Sample]) -> tuple[int, str]:
    """Run `kubectl egpu handover NODE --to <to>` as a process; meanwhile play the GPU Operator and the DaemonSet
    and sample the node every half second. Returns its exit status and output."""
    log = node.home / f"handover-{to}-{uuid.uuid4().hex[:4]}.log"
    command = node.plane.children.start(f"handover --to {to}", [
        str(Path(sys.executable).parent / "kubectl-egpu"), "handover", NODE, "--to", to,
        "--kubeconfig", str(node.plane.kubeconfig), "--agent-namespace", SYSTEM, "--step-timeout-s", "300",
    ], log=log, env={**os.environ})  # fmt: skip
    deadline = time.monotonic() + COMMAND_WITHIN_S
    try:
        while command.running():
            node.check_folder()
            node.act()
            pods = {p.metadata.name: p for p in node.core.list_namespaced_pod(namespace).items}
            watched_pod = pods.get(watched)
            samples.append(Sample(time.time(), watched_pod is not None,
                                  bool(watched_pod and watched_pod.metadata.deletion_timestamp),
                                  len(node.gpu_objects()), _claimed(node)))  # fmt: skip
            assert time.monotonic() < deadline, f"handover --to {to} still running:\n{command.tail(30)}\n{node.tails()}"
            time.sleep(0.5)
    finally:
        command.stop()
    node.act()  # what the last step asked (a label set just before the command ended)
    return command.process.returncode, log.read_text(errors="replace")


def test_a_device_plugin_node_moves_to_elasticgpu_and_back(
    api_client: client.ApiClient, product: None, handover_node: HandoverNode, namespace: str
) -> None:
    node = handover_node
    core = node.core

    # A workload of the device plugin runs with its card.
    core.create_namespaced_pod(namespace, _gpu_pod("trainer", node.image))
    _wait(lambda: _running(node, namespace, "trainer"), "the nvidia.com/gpu pod Running", node)
    env = _container_env(node.runtime_endpoint, namespace, "trainer")
    plugin_card = env.get("NVIDIA_VISIBLE_DEVICES")
    assert plugin_card in UUIDS, {k: v for k, v in env.items() if "NVIDIA" in k}
    assert [card for card, _ in node.allocations()] == [plugin_card]

    # The node is labelled for the agent: it starts there and stands by, publishing nothing, saying why.
    core.patch_node(NODE, {"metadata": {"labels": {node_handover.LABEL_AGENT: "true"}}})
    node.act()
    assert node.agent is not None

    def told() -> list[str]:
        events = core.list_namespaced_event("default", field_selector=f"involvedObject.name={NODE}").items
        return [e.message for e in events if e.reason == node_handover.EVENT_ALLOCATOR_LIVE]

    said = _wait(told, f"the agent's {node_handover.EVENT_ALLOCATOR_LIVE} Event on Node {NODE}", node)
    assert "nvidia-gpu.sock" in said[0] and "nvidia.com/gpu" in said[0], said
    assert f"kubectl egpu handover {NODE}" in said[0], said
    assert node.agent.running(), node.tails()
    assert node.gpu_objects() == [], "the agent published GPUs beside a live device plugin"
    assert _running(node, namespace, "trainer")

    # To elasticgpu.
    there: list[Sample] = []
    rc, output = _handover(node, namespace, "elasticgpu", "trainer", there)
    assert rc == 0, f"{output}\n{node.tails()}"
    assert f"evicting {namespace}/trainer" in output, output
    assert node.plugin is None and not (node.device_plugin_dir / "nvidia-gpu.sock").exists()
    assert not _pod_exists(node, namespace, "trainer")
    # The plugin's pod held its card until it was drained: no GPU object of the node while it existed.
    overlap = [s for s in there if s.gpu_pod and s.gpu_objects]
    assert not overlap, f"GPUs published while the nvidia.com/gpu pod still existed: {overlap[:3]}\n{output}"
    assert any(s.gpu_pod and not s.gpu_pod_deleting for s in there), "the pod was gone before the command ran"
    gpus = node.gpu_objects()
    assert len(gpus) == CARDS, gpus
    assert not core.read_node(NODE).spec.unschedulable
    assert node.offered() == 0

    # A claim pod runs there, with one of the node's cards.
    class_name = f"ho-{uuid.uuid4().hex[:8]}"
    klass = {"apiVersion": names.API_VERSION, "kind": names.KIND_CLASS, "metadata": {"name": class_name},
             "provisioner": names.PROVISIONER_GPUSHARE, "parameters": {"gpuModel": "A100"},
             "reclaimPolicy": "Delete", "bindingMode": "Immediate"}  # fmt: skip
    assert kube_request(api_client, "POST", f"{CUSTOM}/{names.PLURAL_CLASS}", body=klass).status == 201
    claims = f"{CUSTOM}/namespaces/{namespace}/{names.PLURAL_CLAIM}"
    claim = {"apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM, "metadata": {"name": "job"},
             "spec": {"elasticGPUClassName": class_name, "resources": {"requests": {
                 names.RESOURCE_CORE: 100, names.RESOURCE_MEMORY: "10Gi"}}}}  # fmt: skip
    assert kube_request(api_client, "POST", claims, body=claim).status == 201

    def gated() -> bool:
        probe = kube_request(api_client, "POST", f"/api/v1/namespaces/{namespace}/pods", query=[("dryRun", "All")],
                             body=_claim_pod("probe", node.image)).json()  # fmt: skip
        return any(g.get("name") == names.SCHEDULING_GATE for g in probe["spec"].get("schedulingGates") or [])

    _wait(gated, "the webhook gating a pod with a claim", node)
    core.create_namespaced_pod(namespace, _claim_pod("worker", node.image))
    _wait(lambda: _running(node, namespace, "worker"), "the claim pod Running", node)
    bound = kube_request(api_client, "GET", f"{claims}/job").json()["status"]
    assert bound["phase"] == "Bound" and bound["nodeName"] == NODE and len(bound["gpus"]) == 1, bound
    claim_env = _container_env(node.runtime_endpoint, namespace, "worker")
    claim_card = claim_env.get("NVIDIA_VISIBLE_DEVICES", "")
    assert claim_card == bound["gpus"][0], claim_env
    assert claim_card.lower() in {u.lower() for u in UUIDS} or claim_card in {g["metadata"]["name"] for g in gpus}

    # Back: refused while a claim holds a card, and nothing changed.
    refused_rc, refused = _handover(node, namespace, "device-plugin", "worker", [])
    assert refused_rc != 0 and "ElasticGPUs still hold its cards" in refused, refused
    assert not core.read_node(NODE).spec.unschedulable and node.agent is not None
    assert _running(node, namespace, "worker")
    # The user deletes the claim as told (it stays while its pod uses it); the command then drains its pod.
    assert kube_request(api_client, "DELETE", f"{claims}/job").status in (200, 202)
    back: list[Sample] = []
    rc, output = _handover(node, namespace, "device-plugin", "worker", back)
    assert rc == 0, f"{output}\n{node.tails()}"
    assert f"evicting {namespace}/worker" in output, output
    assert not _pod_exists(node, namespace, "worker")
    worker_gone = max(s.at for s in back if s.gpu_pod) if any(s.gpu_pod for s in back) else 0.0
    assert node.gpu_objects() == [] and node.agent is None
    assert node_handover.LABEL_AGENT not in node.labels()
    assert node.labels().get(node_handover.LABEL_DEVICE_PLUGIN_DEPLOY) == "true"
    assert node.offered() == CARDS and not core.read_node(NODE).spec.unschedulable

    # A device plugin workload runs again, given its card by the plugin after the claim pod had gone.
    core.create_namespaced_pod(namespace, _gpu_pod("trainer-again", node.image))
    _wait(lambda: _running(node, namespace, "trainer-again"), "a nvidia.com/gpu pod Running again", node)
    again = _container_env(node.runtime_endpoint, namespace, "trainer-again").get("NVIDIA_VISIBLE_DEVICES")
    assert again in UUIDS, again
    (_, first_at), (last_card, last_at) = node.allocations()[0], node.allocations()[-1]
    assert last_card == again and last_at > worker_gone > first_at, (node.allocations(), worker_gone)
    core.delete_namespaced_pod("trainer-again", namespace)
    kube_request(api_client, "DELETE", f"{CUSTOM}/{names.PLURAL_CLASS}/{class_name}")


def _claim_pod(name: str, image: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "annotations": {names.claim_annotation("main"): "job"}},
        "spec": {"hostNetwork": True, "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                                 "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]}]},
    }  # fmt: skip
