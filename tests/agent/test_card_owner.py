"""The agent and who owns a card (issue 48, docs/dra.md): spec.owner is the platform team's. A new card's
object gets its Node's default (label elasticgpu.io/gpu-owner); the agent's later spec writes keep what
the platform team set, and a pass that finds the spec as discovered writes nothing."""

from __future__ import annotations

import threading
from typing import Any

from kubernetes import client

from elasticgpu.agent import health, inventory, kube
from elasticgpu.agent.discovery import simulated
from elasticgpu.agent.settings import InventorySettings
from elasticgpu.api import names
from tests.agent.conftest import wait_for
from tests.agent.objects import DESCRIPTION, GPUS, node_gpus
from tests.kube_cluster import kube_request


def test_a_new_card_takes_its_nodes_default_and_the_agent_keeps_the_platform_teams_owner(
    api_client: client.ApiClient, kube_cluster: Any, crds_installed: list[str], node_name: str, tmp_path: Any
) -> None:
    core = client.CoreV1Api(api_client)
    core.patch_node(node_name, {"metadata": {"labels": {names.LABEL_GPU_OWNER: names.OWNER_DRA}}})
    backend = simulated.SimulatedBackend(DESCRIPTION, node_name=node_name, device_dir=tmp_path / "dev")
    agent_kube = kube.AgentKube(kube.load_api_client(str(kube_cluster.kubeconfig), None), node_name=node_name,
                                field_manager="elasticgpu-agent")
    publisher = inventory.Inventory(kube=agent_kube, backend=backend,
                                    health=health.HealthTracker(recovery_quiet_s=60),
                                    settings=InventorySettings(node_labels_check_s=0), watch_timeout_s=5)
    stop = threading.Event()
    watcher = threading.Thread(target=publisher.watch, args=(stop,), daemon=True)
    watcher.start()
    first, second = (names.gpu_object_name(simulated.simulated_uuid(node_name, i)) for i in range(2))
    try:
        publisher.reconcile()
        gpus = node_gpus(api_client, node_name)
        assert {g["spec"]["owner"] for g in gpus.values()} == {names.OWNER_DRA}, "the Node's default"
        assert len(gpus) == 2
        wait_for("the watch to deliver both cards", lambda: set(publisher.objects()) == {first, second}, timeout=20)

        # The platform team moves one card back, and someone tampers with its discovered spec: the agent
        # puts the spec back and keeps the owner the platform team set.
        patched = kube_request(api_client, "PATCH", f"{GPUS}/{first}",
                               body={"spec": {"owner": names.OWNER_ELASTIC_GPU, "model": "tampered"}},
                               headers={"Content-Type": "application/merge-patch+json"})
        assert patched.status == 200, patched.body
        wait_for("the watch to deliver the patch",
                 lambda: (publisher.objects().get(first) or {}).get("spec", {}).get("model") == "tampered", timeout=20)
        publisher.reconcile()
        gpus = node_gpus(api_client, node_name)
        assert gpus[first]["spec"]["model"] == "NVIDIA A100-SXM4-80GB", "the agent's own fields put back"
        assert gpus[first]["spec"]["owner"] == names.OWNER_ELASTIC_GPU, "the platform team's owner kept"
        assert gpus[second]["spec"]["owner"] == names.OWNER_DRA

        # The Node's label moves nothing already there, and a pass with nothing to change writes no spec.
        core.patch_node(node_name, {"metadata": {"labels": {names.LABEL_GPU_OWNER: names.OWNER_ELASTIC_GPU}}})
        wait_for("the watch to deliver the agent's write",
                 lambda: (publisher.objects().get(first) or {}).get("spec", {}).get("model") != "tampered", timeout=20)
        applies = dict(agent_kube.writes)
        publisher.reconcile()
        publisher.reconcile()
        assert agent_kube.writes.get("gpu_apply") == applies.get("gpu_apply"), "no apply when the spec is as found"
        assert agent_kube.writes.get("gpu_create") == applies.get("gpu_create") == 2
        gpus = node_gpus(api_client, node_name)
        assert (gpus[first]["spec"]["owner"], gpus[second]["spec"]["owner"]) == (names.OWNER_ELASTIC_GPU,
                                                                                  names.OWNER_DRA)
    finally:
        stop.set()
        watcher.join(timeout=10)
        agent_kube.close()
        for name in (first, second):
            kube_request(api_client, "DELETE", f"{GPUS}/{name}")
