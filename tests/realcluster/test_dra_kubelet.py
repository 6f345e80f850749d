"""The DRA driver on Kubernetes' own kubelet (1.36.3) and scheduler, with the test containerd (CDI on):
the agent of a GPU node runs with `--dra true` in front of containerd, as the chart runs it (its
Node-bound token, deploy/agent.yaml's RBAC, the policies); the controller moves a card to DRA; a pod
with a ResourceClaimTemplate of DeviceClass gpu.elasticgpu.io reaches Running with that card and
nothing else; kill -9 of the agent between prepare and unprepare loses nothing: the restarted agent
unprepares the claim when the pod goes. The node offers MPS (a stand-in nvidia-cuda-mps-control in the
simulated driver root, as tests/agent/cri's isolation tests use): pods sharing a card through consumable
capacity under a DeviceClass whose config says MPS run with the card's MPS daemon (issue 48)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from elasticgpu.agent.dra import claim_cdi, plugin_serving, slice_content
from elasticgpu.api import names
from elasticgpu.testbed import components, processes
from tests.agent.cri.isolation_node import SHM_FILE, STAND_IN_CONTROL, mounts_under
from tests.kube_cluster import TestCluster, kube_request
from tests.realcluster import install, kubelet
from tests.realcluster.control_plane import ControlPlane
from tests.realcluster.test_claim_pod import _container_env, container_env, container_exec
from tests.realcluster.test_claim_pod import product as product  # the module fixture: controller and webhook

pytestmark = pytest.mark.realcluster

NODE = "realcluster-dra-node"
SIMULATION = "driver: {version: 550.54.15, cuda: '12.4'}\ncards: [{model: A100, memory: 81920, numa: 0, count: 2}]\n"
WITHIN_S = 180.0
GPUS = f"/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL_GPU}"
RESOURCE = "/apis/resource.k8s.io/v1"
DEVICE_CLASS = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.elasticgpu.io"},
                "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.elasticgpu.io"'}}]}}  # fmt: skip


@dataclass
class DraNode:
    name: str
    agent: processes.Child
    kubelet: kubelet.Kubelet
    image: str
    runtime_endpoint: str
    cdi_dir: Path
    checkpoint: Path
    restart: Any  # () -> None: kill -9 the agent and start it again, as a DaemonSet would
    mps_record: Path  # what the stand-in MPS control binary was asked: `start <uuid> ...`, `quit <uuid>`


def _wait(what: str, check: Any, node: DraNode) -> Any:
    try:
        return processes.wait_until(check, what, timeout_s=WITHIN_S, children=[node.agent, node.kubelet.child])
    except processes.DemoError as e:
        kubelet_log = node.kubelet.child.log.read_text(errors="replace").splitlines()
        about = [line for line in kubelet_log if "plugin" in line.lower() or "dra" in line.lower()][-25:]
        raise AssertionError(f"{e}\nagent:\n{node.agent.tail(25)}\nkubelet (plugins, DRA):\n" + "\n".join(about)) from e


@pytest.fixture(scope="module")
def dra_node(kube_cluster: TestCluster, real_control_plane: ControlPlane, api_client: client.ApiClient,
             crds_installed: list[str]) -> Iterator[DraNode]:  # fmt: skip
    from tests.containerd_runtime import RuntimeUnavailable, running_containerd

    install.apply_file(api_client, install.DEPLOY / "agent.yaml")
    install.apply_file(api_client, install.DEPLOY / "policies" / "agent-node-scope.yaml")
    with contextlib.suppress(client.ApiException):
        kube_request(api_client, "POST", f"{RESOURCE}/deviceclasses", body=DEVICE_CLASS)
    core = client.CoreV1Api(api_client)
    core.create_node({"metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}}})
    with contextlib.ExitStack() as stack:
        try:
            runtime = stack.enter_context(running_containerd())
        except RuntimeUnavailable as e:
            pytest.skip(str(e))
        home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="egdk-", dir="/tmp")))
        kubelet_home = home / "kubelet"
        token = install.agent_kubeconfig(kube_cluster, NODE, home)
        paths = components.AgentPaths.under(home, NODE, runtime.cdi_dir)
        paths.simulation.write_text(SIMULATION)
        checkpoint = home / "dra-checkpoint.json"
        # MPS on the node: the stand-in control binary where the agent looks for the driver's (the simulated
        # backend's driver root, which it fills at start and leaves this file in).
        mps_record = home / "mps-record.txt"
        mps_record.touch()
        control = paths.device_dir / "driver-root" / "usr/bin/nvidia-cuda-mps-control"
        control.parent.mkdir(parents=True)
        control.write_text(STAND_IN_CONTROL.format(record=mps_record, shm_file=SHM_FILE))
        control.chmod(0o755)
        agents: list[processes.Child] = []

        def start() -> processes.Child:
            agent = components.start_agent(
                real_control_plane.children, node=NODE, kubeconfig=token, paths=paths, events_namespace="default",
                runtime_socket=runtime.socket, log_dir=home,
                extra=("--dra", "true", "--dra-kubelet-dir", str(kubelet_home / "root"),
                       "--dra-checkpoint", str(checkpoint), "--isolation-dir", str(home / "isolation"),
                       "--mps-stop-timeout-s", "5"))  # fmt: skip
            agents.append(agent)
            processes.wait_until(paths.cri_socket.exists, f"the CRI socket of the agent of {NODE}",
                                 timeout_s=WITHIN_S, children=[agent])  # fmt: skip
            return agent

        # Last (after the agents stop): the stand-in MPS servers the agents' daemons forked, and their shm mounts.
        stack.callback(_leave_no_mps, control, home / "isolation")
        agent = start()
        stack.callback(lambda: [a.stop() for a in agents])
        kubelet.give_network_config(runtime.directory / "cni" / "conf")
        running = stack.enter_context(kubelet.running_kubelet(real_control_plane, NODE, f"unix://{paths.cri_socket}",
                                                              directory=kubelet_home))  # fmt: skip

        def ready() -> bool:
            conditions = core.read_node(NODE).status.conditions or []
            return any(c.type == "Ready" and c.status == "True" for c in conditions)

        processes.wait_until(ready, f"Node {NODE} Ready", timeout_s=WITHIN_S, children=[agent, running.child])
        node = DraNode(NODE, agent, running, runtime.image, runtime.endpoint, runtime.cdi_dir, checkpoint,
                       restart=None, mps_record=mps_record)  # fmt: skip

        def restart() -> None:
            os.killpg(node.agent.process.pid, signal.SIGKILL)
            node.agent.process.wait(timeout=30)
            paths.cri_socket.unlink(missing_ok=True)  # left by the killed agent; the new one's means it is up
            node.agent = start()

        node.restart = restart
        yield node
    with contextlib.suppress(client.ApiException):
        core.delete_node(NODE)


def _leave_no_mps(control: Path, isolation: Path) -> None:
    """End every stand-in MPS server of `control` (the agent's daemons outlive it, as with the real driver) and
    unmount the shm folders the agent mounted under `isolation`, so the node's folder can go."""
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            if entry.name.isdigit() and str(control).encode() in cmdline and b"serve" in cmdline:
                os.kill(int(entry.name), signal.SIGKILL)
    for point in reversed(mounts_under(isolation)):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def _gpus(api: client.ApiClient) -> list[dict[str, Any]]:
    answer = kube_request(api, "GET", GPUS, query=[("labelSelector", f"{names.LABEL_NODE}={NODE}")])
    assert answer.status == 200, answer.body
    return sorted(answer.json()["items"], key=lambda g: g["spec"]["index"])


SLEEP = ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]


def _pod(name: str, template: str, image: str) -> dict[str, Any]:
    return {"metadata": {"name": name},
            "spec": {"hostNetwork": True, "terminationGracePeriodSeconds": 1,
                     "nodeSelector": {"kubernetes.io/hostname": NODE},
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
                     "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                                     "resources": {"claims": [{"name": "gpu"}]},
                                     "command": SLEEP}]}}  # fmt: skip


@pytest.fixture(scope="module")
def dra_card(api_client: client.ApiClient, product: None, dra_node: DraNode) -> tuple[dict[str, Any], dict[str, Any]]:
    """Card 0 of the node moved to DRA by the controller and published; card 1 stays ours."""
    gpus = _wait(f"the agent's 2 GPU objects of {NODE}", lambda: len(_gpus(api_client)) == 2 and _gpus(api_client),
                 dra_node)  # fmt: skip
    card, ours = gpus[0], gpus[1]
    patched = kube_request(api_client, "PATCH", f"{GPUS}/{card['metadata']['name']}",
                           body={"spec": {"owner": "DRA"}},
                           headers={"Content-Type": "application/merge-patch+json"})  # fmt: skip
    assert patched.status == 200, patched.body
    _wait("the controller to make card 0 DRA's (status.owner)", lambda: kube_request(
        api_client, "GET", f"{GPUS}/{card['metadata']['name']}").json().get("status", {}).get("owner") == "DRA",
        dra_node)  # fmt: skip
    slice_path = f"{RESOURCE}/resourceslices/{slice_content.slice_name(NODE)}"
    published = _wait("the node's ResourceSlice with card 0 only", lambda: (
        (answer := kube_request(api_client, "GET", slice_path)).status == 200 and
        [d["name"] for d in answer.json()["spec"]["devices"]] == ["gpu-0"] and answer.json()), dra_node)
    assert published["spec"]["nodeName"] == NODE
    _wait("kubelet to register the DRA driver", lambda: "registered DRA driver" in dra_node.agent.log.read_text(
        errors="replace"), dra_node)  # fmt: skip
    return card, ours


def _running(core: client.CoreV1Api, namespace: str, name: str, node: DraNode) -> Any:
    deadline = time.monotonic() + WITHIN_S
    while (pod := core.read_namespaced_pod(name, namespace)).status.phase != "Running":
        assert pod.status.phase == "Pending", pod.status
        assert time.monotonic() < deadline, (f"pod not Running: {pod.status}\n{node.kubelet.child.tail(30)}\n"
                                             f"{node.agent.tail(30)}")  # fmt: skip
        time.sleep(0.5)
    return pod


def _template(api: client.ApiClient, namespace: str, name: str, exactly: dict[str, Any]) -> None:
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
                "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}}  # fmt: skip
    made = kube_request(api, "POST", f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates", body=template)
    assert made.status == 201, made.body


def test_a_whole_card_claim_runs_on_its_card_and_survives_a_kill_of_the_agent(
    api_client: client.ApiClient, dra_node: DraNode, dra_card: tuple[dict[str, Any], dict[str, Any]], namespace: str
) -> None:
    card, ours = dra_card
    _template(api_client, namespace, "whole", {"deviceClassName": "gpu.elasticgpu.io"})
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(namespace, _pod("user", "whole", dra_node.image))
    pod = _running(core, namespace, "user", dra_node)
    assert pod.spec.node_name == NODE
    [status] = pod.status.resource_claim_statuses
    claim = kube_request(api_client, "GET", f"{RESOURCE}/namespaces/{namespace}/resourceclaims/"
                         f"{status.resource_claim_name}").json()  # fmt: skip
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"], result["device"]) == ("gpu.elasticgpu.io", NODE, "gpu-0")
    uid = claim["metadata"]["uid"]
    # The container has its card and nobody else's: what containerd made of the CDI devices kubelet asked.
    inside = container_env(dra_node.runtime_endpoint, namespace, "user")
    assert inside.get("NVIDIA_VISIBLE_DEVICES") == card["spec"]["uuid"], inside
    assert ours["spec"]["uuid"] not in json.dumps(_container_env(dra_node.runtime_endpoint, namespace, "user"))
    assert (dra_node.cdi_dir / claim_cdi.spec_file(uid)).exists()
    entries = json.loads(dra_node.checkpoint.read_text())["claims"]
    assert entries[uid]["state"] == "completed" and pod.metadata.uid in entries[uid]["pods"]

    # kill -9 between prepare and unprepare: the restarted agent answers kubelet's unprepare from its checkpoint.
    dra_node.restart()
    core.delete_namespaced_pod("user", namespace)
    _wait("the pod gone and its claim unprepared", lambda: (
        "user" not in [p.metadata.name for p in core.list_namespaced_pod(namespace).items]
        and uid not in json.loads(dra_node.checkpoint.read_text())["claims"]), dra_node)
    assert not (dra_node.cdi_dir / claim_cdi.spec_file(uid)).exists()
    assert plugin_serving.registration_socket(dra_node.kubelet.directory / "root").exists()
    # Every call of the driver (slices, claims) under deploy/agent.yaml's RBAC and the node-scope policies.
    refused = [line for line in dra_node.agent.log.read_text(errors="replace").splitlines() if "HTTP 403" in line]
    assert not refused, "the agent was refused under the chart's RBAC and policies:\n" + "\n".join(refused[:10])


def test_two_pods_share_a_card_through_consumable_capacity_and_a_missing_model_stays_pending(
    api_client: client.ApiClient, dra_node: DraNode, dra_card: tuple[dict[str, Any], dict[str, Any]], namespace: str
) -> None:
    card, _ = dra_card
    share = {"requests": {"cores": "30", "memory": "10Gi"}}
    _template(api_client, namespace, "slice", {"deviceClassName": "gpu.elasticgpu.io", "capacity": share})
    _template(api_client, namespace, "h100", {"deviceClassName": "gpu.elasticgpu.io", "selectors": [{"cel": {
        "expression": 'device.attributes["gpu.elasticgpu.io"].model.startsWith("H100")'}}]})  # fmt: skip
    core = client.CoreV1Api(api_client)
    for name in ("a", "b"):
        core.create_namespaced_pod(namespace, _pod(name, "slice", dra_node.image))
    core.create_namespaced_pod(namespace, _pod("wants-h100", "h100", dra_node.image))
    for name in ("a", "b"):
        _running(core, namespace, name, dra_node)
        inside = container_env(dra_node.runtime_endpoint, namespace, name)
        assert inside.get("NVIDIA_VISIBLE_DEVICES") == card["spec"]["uuid"], inside
        assert (inside.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), inside.get("CUDA_DEVICE_MEMORY_LIMIT_0")) == (
            "30", "10240m"), inside  # fmt: skip
    # Issue 48: the agent's ledger holds each pod's container as a row of its ResourceClaim (usage, metrics see it).
    ledger = sqlite3.connect(f"file:{dra_node.checkpoint.parent / NODE / 'ledger.db'}?mode=ro", uri=True)
    # Only this test's namespace: an earlier test's deleted pod keeps its open row until kubelet's container
    # garbage collection removes the stopped container (the ledger releases a row at RemoveContainer).
    assert sorted(row[0] for row in ledger.execute(
        "SELECT pod_name FROM allocations WHERE claim_kind = 'ResourceClaim' AND state != 'released'"
        " AND pod_namespace = ?", (namespace,))) == ["a", "b"]
    # The node has no H100: the scheduler says so on the pod, which stays Pending.
    reason = _wait("the scheduler's reason on the pod that asks an H100", lambda: next(
        (c.message for c in core.read_namespaced_pod("wants-h100", namespace).status.conditions or []
         if c.type == "PodScheduled" and c.status == "False" and c.message), None), dra_node)  # fmt: skip
    assert "claim" in reason.lower() or "device" in reason.lower(), reason
    assert core.read_namespaced_pod("wants-h100", namespace).status.phase == "Pending"
    for name in ("a", "b", "wants-h100"):
        core.delete_namespaced_pod(name, namespace)
    _wait("the pods gone and every claim unprepared", lambda: not core.list_namespaced_pod(namespace).items and not
          json.loads(dra_node.checkpoint.read_text())["claims"], dra_node)  # fmt: skip


MPS_CLASS = "gpu-mps.elasticgpu.io"


def test_slices_of_an_mps_device_class_share_the_card_s_mps_daemon(
    api_client: client.ApiClient, dra_node: DraNode, dra_card: tuple[dict[str, Any], dict[str, Any]], namespace: str
) -> None:
    """Issue 48: the DeviceClass's config says MPS (and a StopContainer policy); two pods each get a 30% / 10 GiB
    share of the card through consumable capacity, and run with the MPS env and pipe folder of the card's one
    daemon, which the agent started before their containers and stops once both are gone."""
    card, _ = dra_card
    uuid = card["spec"]["uuid"]
    parameters = {"apiVersion": "gpu.elasticgpu.io/v1", "kind": "Isolation", "mode": "MPS",
                  "overLimitAction": "StopContainer", "overLimitGraceSeconds": 30}  # fmt: skip
    klass = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": MPS_CLASS},
             "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.elasticgpu.io"'
                                                           " && device.allowMultipleAllocations == true"}}],
                      "config": [{"opaque": {"driver": "gpu.elasticgpu.io", "parameters": parameters}}]}}  # fmt: skip
    made = kube_request(api_client, "POST", f"{RESOURCE}/deviceclasses", body=klass)
    assert made.status == 201, made.body
    core = client.CoreV1Api(api_client)
    try:
        _template(api_client, namespace, "mps-slice", {"deviceClassName": MPS_CLASS,
                                                        "capacity": {"requests": {"cores": "30", "memory": "10Gi"}}})
        for name in ("mps-a", "mps-b"):
            core.create_namespaced_pod(namespace, _pod(name, "mps-slice", dra_node.image))
        daemons = set()
        for name in ("mps-a", "mps-b"):
            _running(core, namespace, name, dra_node)
            inside = container_env(dra_node.runtime_endpoint, namespace, name)
            assert inside.get("NVIDIA_VISIBLE_DEVICES") == uuid, inside
            assert (inside.get("CUDA_MPS_PIPE_DIRECTORY"), inside.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
                    inside.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")) == ("/run/nvidia-mps", "30", "0=10240M"), inside
            # The pipe folder the room mounts is the card's daemon's: its pid file is there.
            daemons.add(int(container_exec(dra_node.runtime_endpoint, namespace, name,
                                           ["cat", "/run/nvidia-mps/nvidia-cuda-mps-control.pid"])))  # fmt: skip
        (daemon,) = daemons  # one daemon per card, shared by both claims
        assert "nvidia-cuda-mps-control" in Path(f"/proc/{daemon}/cmdline").read_text(errors="replace")
        starts = [line for line in dra_node.mps_record.read_text().splitlines() if line.startswith("start ")]
        assert [line.split()[1] for line in starts] == [uuid], starts
        # The checkpoint kept the class's config for each claim: its mode and its over-limit policy.
        entries = json.loads(dra_node.checkpoint.read_text())["claims"].values()
        assert sorted((e["isolation"], e["over_limit_action"], e["over_limit_grace_s"]) for e in entries) == [
            ("MPS", "StopContainer", 30)] * 2
        for name in ("mps-a", "mps-b"):
            core.delete_namespaced_pod(name, namespace)
        _wait("the pods gone, their claims unprepared and the card's MPS daemon stopped", lambda: (
            not core.list_namespaced_pod(namespace).items and not json.loads(dra_node.checkpoint.read_text())["claims"]
            and f"quit {uuid}" in dra_node.mps_record.read_text()), dra_node)  # fmt: skip
    finally:
        kube_request(api_client, "DELETE", f"{RESOURCE}/deviceclasses/{MPS_CLASS}")
