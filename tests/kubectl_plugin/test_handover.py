"""Issue 46: `kubectl egpu handover NODE` moves a node from the device plugin to elasticgpu and back, against the
local API server, with a stand-in GPU Operator (its device plugin switch drives the Node's allocatable, as
kubelet reports it) and a stand-in agent (publishes the node's cards once the node is labelled for it).

What must hold: the GPU pod is drained before the device plugin is switched off (it keeps its card until
then), the agent is labelled only once the Node offers no nvidia.com/gpu (nothing handed out twice), each
step says what it waits for, and the way back leaves no GPU object or agent label of ours.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from elasticgpu.api import names, node_handover
from elasticgpu.kubectl_plugin import doctor
from elasticgpu.kubectl_plugin.handover import POLL_S
from tests.kube_cluster import TestCluster

VENV_BIN = Path(sys.executable).parent
GPUS = 2


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class World:
    """The node, a stand-in GPU Operator and a stand-in agent, each a thread that acts as its original does."""

    core: client.CoreV1Api
    custom: client.CustomObjectsApi
    node: str
    stop: threading.Event = field(default_factory=threading.Event)
    operator_on: bool = True
    seen: list[str] = field(default_factory=list)
    """What the stand-ins saw that must never happen, or the order of things (for the asserts)."""

    def labels(self) -> dict[str, str]:
        return dict(self.core.read_node(self.node).metadata.labels or {})

    def offered(self) -> int:
        allocatable = self.core.read_node(self.node).status.allocatable or {}
        return int(allocatable.get("nvidia.com/gpu", "0"))

    def pod_names(self) -> set[str]:
        pods = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.node}").items
        return {p.metadata.name for p in pods}

    def gpu_objects(self) -> list[dict[str, Any]]:
        answer = self.custom.list_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL_GPU,
                                                        label_selector=f"{names.LABEL_NODE}={self.node}")
        items: list[dict[str, Any]] = answer["items"]
        return items

    def operator(self) -> None:
        """The GPU Operator and kubelet: the device plugin runs while nvidia.com/gpu.deploy.device-plugin is not
        "false", and kubelet offers its cards in the Node's allocatable (0 once it is gone; capacity stays)."""
        while not self.stop.wait(0.2):
            if not self.operator_on:
                continue
            try:
                running = self.labels().get(node_handover.LABEL_DEVICE_PLUGIN_DEPLOY) != "false"
                want = GPUS if running else 0
                if self.offered() != want:
                    if not running and "trainer" in self.pod_names():
                        self.seen.append("device plugin switched off while its pod still ran")
                    self.core.patch_node_status(self.node, {"status": {
                        "capacity": {"nvidia.com/gpu": str(GPUS)}, "allocatable": {"nvidia.com/gpu": str(want)}}})
                    self.seen.append(f"allocatable {want}")
            except ApiException:
                continue

    def agent(self) -> None:
        """The agent: on a node labelled for it, publishes its cards with a heartbeat and its hook registered."""
        while not self.stop.wait(0.3):
            try:
                if self.labels().get(node_handover.LABEL_AGENT) != "true":
                    continue
                if self.offered():
                    self.seen.append("agent labelled while the Node offered nvidia.com/gpu")
                for index in range(GPUS):
                    self._publish(index)
            except ApiException:
                continue

    def _publish(self, index: int) -> None:
        name = f"gpu-{self.node}-{index}"
        body = {"apiVersion": names.API_VERSION, "kind": names.KIND_GPU,
                "metadata": {"name": name, "labels": {names.LABEL_NODE: self.node}},
                "spec": {"index": index, "uuid": f"GPU-{self.node}-{index}", "model": "NVIDIA A100-SXM4-80GB",
                         "memory": 81920, "nodeName": self.node}}
        try:
            self.custom.create_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL_GPU, body)
            self.seen.append("published")
        except ApiException as e:
            if e.status != 409:
                raise
        conditions = [
            {"type": "Heartbeat", "status": "True", "reason": "AgentHeartbeat", "message": "",
             "lastTransitionTime": _now()},
            {"type": node_handover.CONDITION_NODE_HOOK, "status": "True", "reason": "Registered",
             "message": "the NRI plugin is registered with the runtime", "lastTransitionTime": _now()},
            {"type": node_handover.CONDITION_FAIL_OPEN, "status": "False", "reason": "ToolkitIgnoresEnvvar",
             "message": "accept-nvidia-visible-devices-envvar-when-unprivileged = false", "lastTransitionTime": _now()},
        ]
        self.custom.patch_cluster_custom_object_status(names.GROUP, names.VERSION, names.PLURAL_GPU, name,
                                                       {"status": {"conditions": conditions}})


@pytest.fixture
def world(api_client: client.ApiClient, crds_installed: object, namespace: str) -> Iterator[World]:
    core = client.CoreV1Api(api_client)
    node = f"handover-{uuid.uuid4().hex[:8]}"
    # A GPU Operator node: GFD's labels, the operator's per-operand switches, the device plugin's resource.
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=node, labels={
        "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": str(GPUS), "nvidia.com/gfd.timestamp": "1700000000",
        node_handover.LABEL_DEVICE_PLUGIN_DEPLOY: "true"})))
    core.patch_node_status(node, {"status": {"capacity": {"nvidia.com/gpu": str(GPUS)},
                                             "allocatable": {"nvidia.com/gpu": str(GPUS)}}})
    made = World(core, client.CustomObjectsApi(api_client), node)
    threads = [threading.Thread(target=made.operator, daemon=True), threading.Thread(target=made.agent, daemon=True)]
    for thread in threads:
        thread.start()
    yield made
    made.stop.set()
    for thread in threads:
        thread.join(timeout=10)
    for gpu in made.gpu_objects():
        made.custom.delete_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL_GPU,
                                                 gpu["metadata"]["name"])
    core.delete_node(node)


def _pod(name: str, node: str, namespace: str, *, gpus: int = 0, labels: dict[str, str] | None = None) -> Any:
    resources = client.V1ResourceRequirements(limits={"nvidia.com/gpu": str(gpus)}) if gpus else None
    return client.V1Pod(metadata=client.V1ObjectMeta(name=name, namespace=namespace, labels=labels),
                        spec=client.V1PodSpec(node_name=node, containers=[
                            client.V1Container(name="main", image="busybox", resources=resources)]))


def _handover(kube_cluster: TestCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    # No kubelet and no eviction subresource on the test server: pods are deleted (kubectl drain's flag).
    return subprocess.run([str(VENV_BIN / "kubectl-egpu"), "handover", *args, "--kubeconfig",
                           str(kube_cluster.kubeconfig), "--disable-eviction", "--grace-period-s", "0"],
                          capture_output=True, text=True, timeout=300, env=env)  # fmt: skip


def test_a_node_moves_to_elasticgpu_and_back(world: World, kube_cluster: TestCluster, namespace: str) -> None:
    core = world.core
    core.create_namespaced_pod(namespace, _pod("trainer", world.node, namespace, gpus=1))
    core.create_namespaced_pod(namespace, _pod("web", world.node, namespace))

    moved = _handover(kube_cluster, world.node, "--to", "elasticgpu", "--step-timeout-s", "120")
    assert moved.returncode == 0, moved.stdout + moved.stderr
    out = moved.stdout
    for n in range(1, 6):
        assert f"[{n}/5]" in out, out
    assert out.count("waiting up to 120 s for") == 3, out
    assert f"draining the pods that use nvidia.com/gpu (or another GPU device plugin's resource) on node" \
           f" {world.node}: deleting {namespace}/trainer" in out
    assert world.pod_names() == {"web"}, "only the GPU pod is drained"
    labels = world.labels()
    assert labels[node_handover.LABEL_DEVICE_PLUGIN_DEPLOY] == "false" and labels[node_handover.LABEL_AGENT] == "true"
    assert len(world.gpu_objects()) == GPUS
    node = core.read_node(world.node)
    assert not node.spec.unschedulable and "elasticgpu.io/handover" not in (node.metadata.annotations or {})
    bad = [s for s in world.seen if "while" in s]
    assert not bad, world.seen  # drained before the switch; the agent only once the Node offered no card
    assert world.seen.index("allocatable 0") < world.seen.index("published"), world.seen

    # doctor reads what the agent reports: nothing FAILs on the moved node.
    checks = doctor.checks(core.api_client.sanitize_for_serialization(core.read_node(world.node)),
                           world.gpu_objects(), [], time.time())
    assert [v for v, _, _ in checks if v in ("FAIL", "warn")] == [], checks
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    told = subprocess.run([str(VENV_BIN / "kubectl-egpu"), "doctor", world.node, "--kubeconfig",
                           str(kube_cluster.kubeconfig)], capture_output=True, text=True, timeout=120, env=env)
    assert told.returncode == 0, told.stdout + told.stderr
    assert [line.split(":")[0] for line in told.stdout.splitlines()] == [
        "ok   opted in", "ok   GPU Operator's device plugin", "ok   allocator conflicts", "ok   agent's cards",
        "ok   node hook", "ok   toolkit setting"], told.stdout

    # And back: a pod that uses claims is drained; nothing of ours is left on the node.
    core.create_namespaced_pod(namespace, _pod("claimer", world.node, namespace,
                                               labels={names.LABEL_USES_CLAIMS: "true"}))
    back = _handover(kube_cluster, world.node, "--to", "device-plugin", "--step-timeout-s", "120")
    assert back.returncode == 0, back.stdout + back.stderr
    assert "[6/6]" in back.stdout and f"deleting {namespace}/claimer" in back.stdout
    assert world.pod_names() == {"web"}
    labels = world.labels()
    assert node_handover.LABEL_AGENT not in labels and labels[node_handover.LABEL_DEVICE_PLUGIN_DEPLOY] == "true"
    assert world.gpu_objects() == []
    # GFD labels the node too: its nvidia.com/gpu.* labels stay, and the command says why.
    assert labels["nvidia.com/gpu.present"] == "true"
    assert "GPU Feature Discovery writes the same ones here" in back.stdout
    assert world.offered() == GPUS and not core.read_node(world.node).spec.unschedulable
    assert "/var/lib/elasticgpu" in back.stdout  # what stays on the node's disk is said


def test_a_device_plugin_that_does_not_leave_stops_the_move_with_the_node_cordoned(
    world: World, kube_cluster: TestCluster
) -> None:
    world.operator_on = False  # the label is set, nobody acts on it (a device plugin not run by the GPU Operator)
    moved = _handover(kube_cluster, world.node, "--to", "elasticgpu", "--step-timeout-s", "4")
    assert moved.returncode != 0
    assert "to offer no GPU resource of a device plugin" in moved.stderr and "did not happen within 4 s" in \
        moved.stderr and "nvidia.com/gpu: 2 allocatable" in moved.stderr, moved.stderr
    node = world.core.read_node(world.node)
    assert node.spec.unschedulable and node_handover.LABEL_AGENT not in (node.metadata.labels or {})
    assert world.gpu_objects() == []

    # Run again once the plugin is gone: the command goes on and uncordons the node it cordoned.
    world.operator_on = True
    again = _handover(kube_cluster, world.node, "--to", "elasticgpu", "--step-timeout-s", "120")
    assert again.returncode == 0, again.stdout + again.stderr
    assert not world.core.read_node(world.node).spec.unschedulable


def test_the_way_back_refuses_while_a_claim_holds_a_card(world: World, kube_cluster: TestCluster) -> None:
    assert _handover(kube_cluster, world.node, "--to", "elasticgpu", "--step-timeout-s", "120").returncode == 0
    card = world.gpu_objects()[0]["metadata"]["name"]
    egpu = f"egpu-held-{world.node}"
    world.custom.create_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL_ELASTIC_GPU, {
        "apiVersion": names.API_VERSION, "kind": "ElasticGPU", "metadata": {"name": egpu},
        "spec": {"capacity": {names.RESOURCE_CORE: 30}, "gpuShare": {"gpuName": card},
                 "claimRef": {"namespace": "team", "name": "c1", "kind": "ElasticGPUClaim"}}})
    try:
        back = _handover(kube_cluster, world.node, "--to", "device-plugin", "--step-timeout-s", "10")
        assert back.returncode != 0
        assert f"{egpu} (claim team/c1" in back.stderr and "Nothing was changed" in back.stderr, back.stderr
        assert world.labels()[node_handover.LABEL_AGENT] == "true"
    finally:
        world.custom.delete_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL_ELASTIC_GPU, egpu)


def test_the_way_back_drains_the_pods_of_a_deleted_claim_and_waits_for_its_elasticgpu(
    world: World, kube_cluster: TestCluster, namespace: str
) -> None:
    """A deleted claim that claim protection keeps while its pod runs does not hold the way back (it did: the
    command refused again after 'delete those claims', found on the real kubelet); its ElasticGPU is waited for
    before the node's GPU objects go."""
    assert _handover(kube_cluster, world.node, "--to", "elasticgpu", "--step-timeout-s", "120").returncode == 0
    card = world.gpu_objects()[0]["metadata"]["name"]
    world.custom.create_namespaced_custom_object(names.GROUP, names.VERSION, namespace, names.PLURAL_CLAIM, {
        "apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM,
        "metadata": {"name": "going", "finalizers": ["test.elasticgpu.io/in-use"]},
        "spec": {"elasticGPUClassName": "any", "resources": {"requests": {names.RESOURCE_CORE: 30}}}})  # fmt: skip
    world.custom.delete_namespaced_custom_object(names.GROUP, names.VERSION, namespace, names.PLURAL_CLAIM, "going")
    egpu = f"egpu-going-{world.node}"
    world.custom.create_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL_ELASTIC_GPU, {
        "apiVersion": names.API_VERSION, "kind": "ElasticGPU", "metadata": {"name": egpu},
        "spec": {"capacity": {names.RESOURCE_CORE: 30}, "gpuShare": {"gpuName": card},
                 "claimRef": {"namespace": namespace, "name": "going", "kind": "ElasticGPUClaim"}}})  # fmt: skip
    world.core.create_namespaced_pod(namespace, _pod("claimer", world.node, namespace,
                                                     labels={names.LABEL_USES_CLAIMS: "true"}))  # fmt: skip
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    command = subprocess.Popen([str(VENV_BIN / "kubectl-egpu"), "handover", world.node, "--to", "device-plugin",
                                "--kubeconfig", str(kube_cluster.kubeconfig), "--disable-eviction",
                                "--grace-period-s", "0", "--step-timeout-s", "120"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while "claimer" in world.pod_names():
            assert command.poll() is None, command.communicate()[0]
            assert time.monotonic() < deadline, "the claim's pod was not drained"
            time.sleep(0.2)
        time.sleep(3 * POLL_S)  # the command now waits for the ElasticGPU: the GPU objects must stay meanwhile
        assert command.poll() is None and len(world.gpu_objects()) == GPUS
        # What the controller does once the pod is gone: the claim goes, its ElasticGPU is deleted.
        world.custom.patch_namespaced_custom_object(names.GROUP, names.VERSION, namespace, names.PLURAL_CLAIM,
                                                    "going", {"metadata": {"finalizers": None}})  # fmt: skip
        world.custom.delete_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL_ELASTIC_GPU, egpu)
        out, _ = command.communicate(timeout=120)
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()
    assert command.returncode == 0, out
    assert f"the ElasticGPUs of the deleted claims on node {world.node} to go" in out, out
    assert world.gpu_objects() == [] and world.labels()[node_handover.LABEL_DEVICE_PLUGIN_DEPLOY] == "true"
