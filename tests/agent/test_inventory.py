"""The agent end to end against the API server: GPU objects, node labels, heartbeat, XIDs, vanished cards."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client

from elasticgpu.agent.discovery import simulated
from elasticgpu.api import GPU, names
from tests.agent.conftest import RunningAgent, wait_for
from tests.agent.objects import DESCRIPTION, GPUS, condition, node_gpus
from tests.kube_cluster import kube_request


def test_gpu_objects_labels_health_and_recovery(
    api_client: client.ApiClient, node_name: str, start_agent: Callable[..., RunningAgent]
) -> None:
    agent = start_agent(node_name, DESCRIPTION, "--recovery-quiet-s", "8")
    uuids = [simulated.simulated_uuid(node_name, i) for i in range(2)]
    gpu_names = [names.gpu_object_name(u) for u in uuids]

    def published() -> dict[str, dict[str, Any]] | None:
        assert agent.process.poll() is None, agent.log()
        gpus = node_gpus(api_client, node_name)
        ready = set(gpus) == set(gpu_names) and all(condition(g, "Heartbeat") for g in gpus.values())
        return gpus if ready else None

    gpus = wait_for("both GPU objects with a heartbeat", published)
    first = GPU.model_validate(gpus[gpu_names[0]])  # valid for our own models too
    assert (first.spec.uuid, first.spec.index, first.spec.memory, first.spec.numa) == (uuids[0], 0, 81920, 0)
    assert first.spec.node_name == node_name and first.spec.links == [uuids[1]]
    assert first.status.health == "Healthy"
    # Owned by its Node (issue 23, item 3): a cluster's garbage collector deletes the cards of a deleted Node.
    node_uid = client.CoreV1Api(api_client).read_node(node_name).metadata.uid
    assert [(r["apiVersion"], r["kind"], r["name"], r["uid"]) for r in first.metadata.owner_references] == [
        ("v1", "Node", node_name, node_uid)]
    # What `kubectl get pgpu` shows in its MEMORY column: 80Gi, as claims and ElasticGPUs show memory.
    assert first.status.capacity == {names.RESOURCE_CORE: 100, names.RESOURCE_MEMORY: "80Gi"}
    table = kube_request(api_client, "GET", f"{GPUS}/{gpu_names[0]}",
                         headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})  # as kubectl get asks
    assert table.status == 200, table.body
    columns = [c["name"] for c in table.json()["columnDefinitions"]]
    row = dict(zip(columns, table.json()["rows"][0]["cells"], strict=True))
    assert (row["Memory"], row["Node"], row["Health"]) == ("80Gi", node_name, "Healthy")
    managers = {m["manager"] for m in gpus[gpu_names[0]]["metadata"]["managedFields"]}
    assert managers == {"elasticgpu-agent"}

    labels = wait_for("node labels", lambda: (client.CoreV1Api(api_client).read_node(node_name).metadata.labels
                                              or {}).get("nvidia.com/gpu.count") and
                      client.CoreV1Api(api_client).read_node(node_name).metadata.labels)
    assert labels["nvidia.com/gpu.present"] == "true" and labels["nvidia.com/gpu.count"] == "2"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB" and labels["nvidia.com/gpu.memory"] == "81920"

    # The controller's part of the status (a reservation, its own condition) is kept by the agent's writes.
    obj = node_gpus(api_client, node_name)[gpu_names[0]]
    obj["status"]["allocations"] = [{"elasticGPU": "egpu-test", "cores": 30, "memory": 1024}]
    obj["status"]["conditions"].append({"type": "Schedulable", "status": "True", "reason": "Controller",
                                        "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"})
    answer = kube_request(api_client, "PUT", f"{GPUS}/{gpu_names[0]}/status", body=obj)
    assert answer.status == 200, answer.body

    # The heartbeat moves on (interval 2 s), and the controller's fields stay.
    beat = condition(obj, "Heartbeat")
    assert beat is not None

    def beat_moved() -> bool:
        now = node_gpus(api_client, node_name)[gpu_names[0]]
        moved = condition(now, "Heartbeat")
        return moved is not None and moved["lastTransitionTime"] > beat["lastTransitionTime"]

    wait_for("a newer heartbeat", beat_moved, timeout=20)
    kept = node_gpus(api_client, node_name)[gpu_names[0]]
    assert kept["status"]["allocations"][0]["elasticGPU"] == "egpu-test"
    assert condition(kept, "Schedulable") is not None

    # A transient XID (94, contained ECC) makes the card Unhealthy at once; after the quiet period (8 s) it
    # recovers. (One that needs a reset waits for it: tests/agent/test_health.py.)
    simulated.inject(agent.inject_dir, {"xid": {"card": 0, "code": 94, "message": "contained"}})
    sick = wait_for("Unhealthy after XID 94", lambda: (g := node_gpus(api_client, node_name)[gpu_names[0]])
                    ["status"].get("health") == "Unhealthy" and g, timeout=20)
    healthy = condition(sick, "Healthy")
    assert healthy is not None and healthy["status"] == "False" and healthy["reason"] == "Xid94"
    assert "contained" in healthy["message"]
    assert node_gpus(api_client, node_name)[gpu_names[1]]["status"]["health"] == "Healthy"
    recovered = wait_for("recovery after the quiet period",
                         lambda: (g := node_gpus(api_client, node_name)[gpu_names[0]])["status"].get("health")
                         == "Healthy" and g, timeout=30)
    assert condition(recovered, "Healthy")["reason"] == "Recovered"  # type: ignore[index]

    # Each change of health was told by one Event about the GPU (`kubectl describe pgpu`).
    def gpu_events() -> list[tuple[str, str]]:
        found = client.CoreV1Api(api_client).list_namespaced_event(
            "default", field_selector=f"involvedObject.name={gpu_names[0]}").items
        return sorted((e.type, e.reason) for e in found)

    wait_for("Events", lambda: gpu_events() == [("Normal", "CardHealthy"), ("Warning", "CardXid94")], timeout=20)

    # An application XID is recorded, not fatal.
    simulated.inject(agent.inject_dir, {"xid": {"card": 1, "code": 13}})
    noted = wait_for("ApplicationXid condition",
                     lambda: condition(node_gpus(api_client, node_name)[gpu_names[1]], "ApplicationXid"), timeout=20)
    assert noted["reason"] == "Xid13"
    assert node_gpus(api_client, node_name)[gpu_names[1]]["status"]["health"] == "Healthy"

    # A vanished card is Unhealthy with reason Vanished, never deleted; it comes back Healthy.
    simulated.inject(agent.inject_dir, {"vanish": {"card": 0}})
    gone = wait_for("Vanished", lambda: (c := condition(node_gpus(api_client, node_name)[gpu_names[0]], "Healthy"))
                    and c["reason"] == "Vanished" and c, timeout=20)
    assert gone["status"] == "False"
    assert set(node_gpus(api_client, node_name)) == set(gpu_names)
    wait_for("node label count 1", lambda: client.CoreV1Api(api_client).read_node(node_name).metadata.labels
             .get("nvidia.com/gpu.count") == "1", timeout=20)
    simulated.inject(agent.inject_dir, {"appear": {"card": 0}})
    wait_for("back Healthy", lambda: node_gpus(api_client, node_name)[gpu_names[0]]["status"].get("health")
             == "Healthy", timeout=20)

    # A GPU object deleted by someone is published again.
    assert kube_request(api_client, "DELETE", f"{GPUS}/{gpu_names[1]}").status == 200
    wait_for("republished", lambda: gpu_names[1] in node_gpus(api_client, node_name), timeout=20)

    agent.process.send_signal(signal.SIGTERM)
    assert agent.process.wait(timeout=15) == 0, agent.log()
    assert "Traceback" not in agent.log()


def test_steady_state_writes_only_the_heartbeat(
    api_client: client.ApiClient, node_name: str, start_agent: Callable[..., RunningAgent]
) -> None:
    agent = start_agent(node_name, DESCRIPTION)
    wait_for("GPU objects", lambda: len(gpus := node_gpus(api_client, node_name)) == 2 and all(
        condition(g, "Heartbeat") for g in gpus.values()))
    listed = kube_request(api_client, "GET", GPUS, query=[("labelSelector", f"{names.LABEL_NODE}={node_name}")])
    version = listed.json()["metadata"]["resourceVersion"]
    # Watch for 6 s: 20 passes (every 0.3 s), a heartbeat due every 2 s (its time kept in whole seconds, so
    # a due heartbeat may come after 1-2 s): each card is written 1-6 times, never once per pass.
    events = client.CustomObjectsApi(api_client).list_cluster_custom_object(
        names.GROUP, names.VERSION, names.PLURAL_GPU, label_selector=f"{names.LABEL_NODE}={node_name}",
        watch=True, resource_version=version, timeout_seconds=6, _preload_content=False,
    )
    modified: dict[str, int] = {}
    for line in events.stream(decode_content=True):
        for text in line.decode().splitlines():
            if text.strip():
                event = json.loads(text)
                name = event["object"]["metadata"]["name"]
                modified[name] = modified.get(name, 0) + (event["type"] == "MODIFIED")
    assert len(modified) == 2 and all(1 <= n <= 6 for n in modified.values()), modified
    assert agent.process.poll() is None


def test_a_restarted_agent_keeps_an_unhealthy_card_unhealthy(
    api_client: client.ApiClient, node_name: str, start_agent: Callable[..., RunningAgent]
) -> None:
    first = start_agent(node_name, DESCRIPTION, "--recovery-quiet-s", "120")
    name = names.gpu_object_name(simulated.simulated_uuid(node_name, 0))
    wait_for("GPU object", lambda: name in node_gpus(api_client, node_name))
    simulated.inject(first.inject_dir, {"xid": {"card": 0, "code": 48}})
    # .get: the object exists a moment before the agent writes its status
    wait_for("Unhealthy", lambda: (node_gpus(api_client, node_name)[name].get("status") or {}).get("health")
             == "Unhealthy")
    first.process.send_signal(signal.SIGTERM)
    assert first.process.wait(timeout=15) == 0
    beat = condition(node_gpus(api_client, node_name)[name], "Heartbeat")
    assert beat is not None

    second = start_agent(node_name, DESCRIPTION, "--recovery-quiet-s", "120")

    def new_heartbeat() -> dict[str, Any] | None:
        assert second.process.poll() is None, second.log()
        obj = node_gpus(api_client, node_name)[name]
        now = condition(obj, "Heartbeat")
        return obj if now and now["lastTransitionTime"] > beat["lastTransitionTime"] else None

    obj = wait_for("the second agent's heartbeat", new_heartbeat, timeout=30)
    healthy = condition(obj, "Healthy")
    assert obj["status"]["health"] == "Unhealthy" and healthy is not None and healthy["reason"] == "Xid48"


def test_sees_only_its_own_node_and_puts_back_removed_labels(
    api_client: client.ApiClient, kube_cluster: Any, crds_installed: list[str], node_name: str, tmp_path: Any
) -> None:
    import threading

    from elasticgpu.agent import health, inventory, kube
    from elasticgpu.agent.settings import InventorySettings
    from tests.kube_cluster import server_side_apply

    # Another node's card, written by someone else.
    other_uuid = f"GPU-{uuid_hex()}"
    other = {"apiVersion": names.API_VERSION, "kind": names.KIND_GPU,
             "metadata": {"name": other_uuid.lower(), "labels": {names.LABEL_NODE: "some-other-node"}},
             "spec": {"index": 0, "uuid": other_uuid, "memory": 1024, "nodeName": "some-other-node"}}
    before = server_side_apply(api_client, f"{GPUS}/{other_uuid.lower()}", other)["metadata"]["resourceVersion"]

    backend = simulated.SimulatedBackend(DESCRIPTION, node_name=node_name, device_dir=tmp_path / "dev")
    agent_kube = kube.AgentKube(kube.load_api_client(str(kube_cluster.kubeconfig), None), node_name=node_name,
                                field_manager="elasticgpu-agent")
    publisher = inventory.Inventory(kube=agent_kube, backend=backend,
                                    health=health.HealthTracker(recovery_quiet_s=60),
                                    settings=InventorySettings(node_labels_check_s=0), watch_timeout_s=5)
    stop = threading.Event()
    watcher = threading.Thread(target=publisher.watch, args=(stop,), daemon=True)
    watcher.start()
    try:
        publisher.reconcile()
        own = {names.gpu_object_name(simulated.simulated_uuid(node_name, i)) for i in range(2)}
        wait_for("the watch to deliver our two cards", lambda: set(publisher.objects()) == own, timeout=20)
        time.sleep(0.5)
        assert set(publisher.objects()) == own  # the other node's card never reached this agent
        after = kube_request(api_client, "GET", f"{GPUS}/{other_uuid.lower()}").json()
        assert after["metadata"]["resourceVersion"] == before

        core = client.CoreV1Api(api_client)
        core.patch_node(node_name, {"metadata": {"labels": {"nvidia.com/gpu.count": None}}})
        assert "nvidia.com/gpu.count" not in (core.read_node(node_name).metadata.labels or {})
        publisher.reconcile()
        assert core.read_node(node_name).metadata.labels["nvidia.com/gpu.count"] == "2"
    finally:
        stop.set()
        watcher.join(timeout=10)
        agent_kube.close()
        kube_request(api_client, "DELETE", f"{GPUS}/{other_uuid.lower()}")


def uuid_hex() -> str:
    import uuid

    return str(uuid.uuid4())
