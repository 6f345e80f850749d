"""The permissions in deploy/ cover every request the controller and the agent make, and grant
them to the ServiceAccounts their manifests run as.

The test API server authorizes everything, so each component runs here through a recording
proxy (tests/faults/proxy.py with no faults) while it does its whole job: the controller as a
cluster-wide process with leader election binding claims dynamically and statically, gating
pods, creating and deleting inline claims, placing WaitForFirstConsumer claims, failing to place
one (pod condition and Event), releasing with both reclaim policies; the agent as a process
publishing its simulated cards, labelling its node, going Unhealthy on an injected XID, and,
in-process, every call of its API client (the CRI hook's claim reads, usage writes). Every
request seen must be one the manifests' RBAC rules allow (tests/deploy/rbac.py); a permission
missing from a manifest fails here instead of as a 403 loop in a real cluster.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from elasticgpu.agent import kube as agent_api
from elasticgpu.api import names
from elasticgpu.controller import errors
from tests.binding import objects as o
from tests.binding.processes import ControllerProcesses
from tests.deploy.rbac import Permissions, request_of
from tests.faults.proxy import FaultProxy, fault_proxy
from tests.kube_cluster import TestCluster
from tests.pods.claim_world import World, kube, world
from tests.pods.conftest import pod_update_policies

__all__ = ["kube", "pod_update_policies", "world"]  # fixtures

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
SYSTEM = "elasticgpu-system"


def wait_for(check: Callable[[], Any], what: str, *, timeout_s: float = 120.0, logs: Callable[[], str] = str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{logs()}")
        time.sleep(0.2)


def _resources(proxy: FaultProxy) -> set[tuple[str, str]]:
    """(verb, resource) of every resource request the proxy saw."""
    found = set()
    for verb, path in proxy.seen:
        request = request_of(verb, path)
        if request is not None:
            found.add((request.verb, request.resource))
    return found


@pytest.fixture
def system_namespace(api_client: client.ApiClient) -> Iterator[str]:
    """The namespace of deploy/'s manifests, with no leader Lease left by an earlier test."""
    core = client.CoreV1Api(api_client)
    with contextlib.suppress(ApiException):
        core.create_namespace({"metadata": {"name": SYSTEM}})
    leases = client.CoordinationV1Api(api_client)
    with contextlib.suppress(ApiException):
        leases.delete_namespaced_lease("elasticgpu-controller", SYSTEM)
    yield SYSTEM
    with contextlib.suppress(ApiException):
        leases.delete_namespaced_lease("elasticgpu-controller", SYSTEM)


def _phase(world: World, name: str) -> str | None:
    with contextlib.suppress(Exception):
        return str((world.get_claim(name).get("status") or {}).get("phase"))
    return None


def _gate_lifted(world: World, pod: str) -> bool:
    gates = [g["name"] for g in world.get_pod(pod)["spec"].get("schedulingGates") or []]
    return names.SCHEDULING_GATE not in gates


def _gpu_gone(world: World, name: str) -> bool:
    try:
        world.kube.get_gpu(name)
    except errors.NotFound:
        return True
    return False


def _claim_gone(world: World, name: str) -> bool:
    try:
        world.get_claim(name)
    except Exception:
        return True
    return False


def test_the_controller_needs_no_permission_its_manifest_lacks(
    world: World, kube_cluster: TestCluster, system_namespace: str, tmp_path: Path
) -> None:
    p = world.prefix
    model = f"T{p}"
    node = world.node(f"{p}-n")
    gpus = [world.gpu(o.gpu(f"gpu-{p}-{i}", node=node, index=i, model=model))["metadata"]["name"] for i in range(2)]
    now = world.klass(o.klass(f"{p}-now", parameters={"gpuModel": model}, reclaim="Delete"))["metadata"]["name"]
    keep = world.klass(o.klass(f"{p}-keep", parameters={"gpuModel": model}, reclaim="Retain"))["metadata"]["name"]
    later = world.klass(o.klass(f"{p}-later", parameters={"gpuModel": model}, mode="WaitForFirstConsumer")
                        )["metadata"]["name"]  # fmt: skip
    static = world.egpu(o.share_egpu(f"{p}-static", gpus[1], cores=20, memory="1Gi", class_name=now))

    with fault_proxy(kube_cluster, directory=tmp_path) as (proxy, kubeconfig):
        procs = ControllerProcesses(
            kubeconfig, None, tmp_path, env={"POD_NAMESPACE": system_namespace, "ELASTICGPU_NODE_GONE_GRACE_S": "0"},
            flags=["--health-port", "0"],
        )  # leader election on, as deployed
        try:
            procs.start()
            world.claim(o.claim("dyn", cores=20, memory="1Gi", class_name=now))
            world.claim(o.claim("kept", cores=20, memory="1Gi", class_name=keep))
            world.claim(o.claim("by-name", cores=20, memory="1Gi", egpu=static["metadata"]["name"]))
            for claim in ("dyn", "kept", "by-name"):
                wait_for(lambda c=claim: _phase(world, c) == "Bound", f"claim {claim} Bound", logs=procs.logs)

            world.pod("uses", claims={"main": "dyn"})
            world.pod("inline", inline={"main": f"gpu-core=10,gpu-memory=1Gi,class={now}"})
            world.pod("waits", inline={"main": f"gpu-core=10,gpu-memory=1Gi,class={later}"}, cpu="1")
            world.pod("never", inline={"main": f"gpu-core=10,gpu-memory=1Gi,class={later}"}, cpu="64")
            for pod in ("uses", "inline", "waits"):
                wait_for(lambda pod=pod: _gate_lifted(world, pod), f"gate of pod {pod} lifted", logs=procs.logs)
            wait_for(lambda: (world.claims_ready("never") or {}).get("status") == "False",
                     "pod never: ClaimsReady=False", logs=procs.logs)  # fmt: skip

            world.delete_pod("inline")
            wait_for(lambda: _claim_gone(world, "inline-main"), "inline claim deleted with its pod", logs=procs.logs)
            world.delete_pod("uses")
            world.kube.delete_claim(world.namespace, "dyn")
            world.kube.delete_claim(world.namespace, "kept")
            for claim in ("dyn", "kept"):
                wait_for(lambda c=claim: _claim_gone(world, c), f"claim {claim} released and gone", logs=procs.logs)
            # A deleted Node: its GPU object is garbage-collected after a live read of the Node.
            gone = world.node(f"{p}-gone")
            world.gpu(o.gpu(f"gpu-{p}-gone", node=gone, model=model))
            world.core.delete_node(gone)
            wait_for(lambda: _gpu_gone(world, f"gpu-{p}-gone"), "GPU of a deleted node deleted", logs=procs.logs)
        finally:
            procs.close()

    permissions = Permissions.of([DEPLOY / "controller.yaml"], SYSTEM, "elasticgpu-controller")
    denied = permissions.denied(proxy.seen)
    assert not denied, "deploy/controller.yaml lacks permissions for:\n" + "\n".join(denied)
    # The run did what it claims: these requests were all made (and so were checked above).
    made = _resources(proxy)
    expected = {
        ("watch", "elasticgpuclaims"), ("create", "elasticgpus"), ("patch", "elasticgpuclaims/status"),
        ("update", "gpus/status"), ("patch", "pods"), ("patch", "pods/status"), ("create", "elasticgpuclaims"),
        ("delete", "elasticgpuclaims"), ("create", "events"), ("create", "leases"), ("list", "nodes"),
        ("get", "nodes"), ("delete", "gpus"),
    }  # fmt: skip
    assert expected <= made, (sorted(expected - made), sorted(made))


def test_the_agent_needs_no_permission_its_manifest_lacks(
    world: World, kube_cluster: TestCluster, tmp_path: Path
) -> None:
    node = world.node(f"{world.prefix}-agent")
    simulation = tmp_path / "cards.yaml"
    simulation.write_text(yaml.safe_dump({"cards": [{"model": f"T{world.prefix}", "memory": "16Gi"}]}))
    inject = tmp_path / "inject"
    inject.mkdir()
    with fault_proxy(kube_cluster, directory=tmp_path) as (proxy, kubeconfig):
        log = tmp_path / "agent.log"
        with log.open("wb") as out:
            agent = subprocess.Popen(
                [sys.executable, "-m", "elasticgpu.agent", "run", "--backend", "simulated",
                 "--simulation", str(simulation), "--inject-dir", str(inject),
                 "--device-dir", str(tmp_path / "dev"), "--node-name", node, "--kubeconfig", str(kubeconfig),
                 "--ledger-url", f"sqlite:///{tmp_path / 'ledger.db'}", "--cri-proxy", "false",
                 "--metrics-port", "0", "--heartbeat-interval-s", "1", "--node-labels-check-s", "1",
                 "--events-namespace", world.namespace],
                stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
            )  # fmt: skip
        agent_log = log.read_text
        try:
            gpu_name = wait_for(lambda: next(iter(
                g["metadata"]["name"] for g in world.kube.list_collection(world.kube.collection_path("gpu"))[0]
                if (g["metadata"].get("labels") or {}).get(names.LABEL_NODE) == node), None),
                "the agent's GPU object", logs=agent_log)  # fmt: skip
            world._gpus.append(gpu_name)  # removed by the world's cleanup
            wait_for(lambda: (world.core.read_node(node).metadata.labels or {}).get("nvidia.com/gpu.present"),
                     "GPU Feature Discovery labels on the node", logs=agent_log)  # fmt: skip
            (inject / "xid.json").write_text(
                json.dumps({"xid": {"card": 0, "code": 79, "message": "fell off the bus"}})
            )
            wait_for(lambda: any(c.get("type") == "Healthy" and c.get("status") == "False"
                                 for c in (world.kube.get_gpu(gpu_name).get("status") or {}).get("conditions") or []),
                     "the card Unhealthy after XID 79", logs=agent_log)  # fmt: skip
        finally:
            agent.kill()
            agent.wait(15)

        # Every call of the agent's API client, in-process, through the same proxy: the CRI hook's
        # reads by name and the usage writes happen only with containers and processes.
        claim = world.claim(o.claim("measured", cores=10, memory="1Gi"))
        egpu = world.egpu(o.share_egpu(f"{world.prefix}-read", gpu_name, cores=10, memory="1Gi"))
        agent_kube = agent_api.AgentKube(agent_api.load_api_client(str(kubeconfig), None), node_name=node,
                                         field_manager="elasticgpu-agent")  # fmt: skip
        try:
            gpu = agent_kube.read_gpu(gpu_name)
            calls: dict[str, Callable[[], object]] = {
                "probe": agent_kube.probe,
                "list_gpus": agent_kube.list_gpus,
                "watch_gpus": lambda: next(iter(agent_kube.watch_gpus(gpu["metadata"]["resourceVersion"], timeout_s=1)),
                                           None),
                "read_gpu": lambda: agent_kube.read_gpu(gpu_name),
                "apply_gpu": lambda: agent_kube.apply_gpu(gpu_name, labels=gpu["metadata"]["labels"], spec=gpu["spec"]),
                # A new card's object with its Node's default owner (issue 48), removed by the world's cleanup.
                "create_gpu": lambda: world._gpus.append(agent_kube.create_gpu(
                    f"{gpu_name}-created", labels=gpu["metadata"]["labels"],
                    spec={**gpu["spec"], "uuid": f"{gpu_name}-CREATED", "owner": "DRA"})["metadata"]["name"]),
                "patch_gpu_status": lambda: agent_kube.patch_gpu_status(
                    gpu_name, resource_version=agent_kube.read_gpu(gpu_name)["metadata"]["resourceVersion"],
                    status={"usage": {}}),
                "patch_gpu_holders": lambda: agent_kube.patch_gpu_holders(
                    gpu_name, {"runningClaims": [], "preparedClaims": []}),
                "read_claim": lambda: agent_kube.read_claim(world.namespace, "measured"),
                "read_elastic_gpu": lambda: agent_kube.read_elastic_gpu(egpu["metadata"]["name"]),
                "patch_claim_status": lambda: agent_kube.patch_claim_status(
                    world.namespace, "measured", resource_version=claim["metadata"]["resourceVersion"],
                    status={"usage": {}}),
                "create_event": lambda: agent_kube.create_event(
                    namespace=world.namespace, involved={"apiVersion": "v1", "kind": "Node", "name": node},
                    type_="Normal", reason="Checked", message="rbac test", now="2026-12-03T00:00:00Z"),
                "read_node": agent_kube.read_node,
                "read_namespace": lambda: agent_kube.read_namespace(world.namespace),
                "patch_node_labels": lambda: agent_kube.patch_node_labels({"elasticgpu.io/rbac-test": None}),
            }  # fmt: skip
            for call in calls.values():
                call()
        finally:
            agent_kube.close()
            with contextlib.suppress(Exception):
                world.kube.delete_elastic_gpu(egpu["metadata"]["name"])

    # A new method of the agent's API client must be added above (and to the manifest).
    # The DRA calls (resource.k8s.io, which the fixture server does not serve) run under the same manifest and the
    # agent's Node-bound token on Kubernetes' own API server: tests/realcluster/test_dra_kubelet.py finds no 403.
    dra = {"apply_resource_slice", "delete_resource_slice", "read_resource_claim", "read_resource_slice"}
    public = {name for name, member in inspect.getmembers(agent_api.AgentKube, inspect.isfunction)
              if not name.startswith("_") and name not in ("close", "node_selector") and name not in dra}  # fmt: skip
    assert public == set(calls), f"AgentKube methods not exercised here: {sorted(public - set(calls))}"
    permissions = Permissions.of([DEPLOY / "agent.yaml"], SYSTEM, "elasticgpu-agent")
    denied = permissions.denied(proxy.seen)
    assert not denied, "deploy/agent.yaml lacks permissions for:\n" + "\n".join(denied)
    made = _resources(proxy)
    expected = {
        ("patch", "gpus"),
        ("watch", "gpus"),
        ("patch", "gpus/status"),
        ("patch", "nodes"),
        ("create", "events"),
        ("get", "elasticgpuclaims"),
        ("patch", "elasticgpuclaims/status"),
        ("get", "namespaces"),
    }
    assert expected <= made, (sorted(expected - made), sorted(made))
