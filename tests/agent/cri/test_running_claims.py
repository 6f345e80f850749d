"""The agent publishes who runs on each card: a claim container started through the proxy on the
real containerd appears in its GPU's `status.runningClaims` on the test API server, and goes when
the container is removed; the controller's `status.allocations` is never touched."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from elasticgpu.agent import inventory
from elasticgpu.agent.cri.proxy import CriProxy, ProxySettings
from elasticgpu.agent.discovery import simulated
from elasticgpu.agent.injecting import cdi, claim_hooks
from elasticgpu.agent.injecting.injection import CardInfo
from elasticgpu.agent.ledger import store
from elasticgpu.api import names
from tests.agent.conftest import wait_for
from tests.agent.cri.kubelet import Kubelet
from tests.agent.cri.node import View, slice_claim, stand_ins
from tests.agent.objects import GPUS, node_gpus
from tests.agent.publishing_inventory import publishing_inventory
from tests.containerd_runtime import TestRuntime
from tests.kube_cluster import kube_request

NS = "team"


@pytest.fixture
def agent_inventory(
    api_client: client.ApiClient, crds_installed: list[str], node_name: str, tmp_path: Path
) -> Iterator[tuple[inventory.Inventory, store.LedgerStore]]:
    """Inventory (with its running-claims publisher) of a simulated node, against the test API server."""
    with publishing_inventory(api_client, node_name, tmp_path) as inventory_and_ledger:
        yield inventory_and_ledger


def running(api_client: client.ApiClient, node: str, gpu: str) -> list[dict[str, Any]] | None:
    obj = node_gpus(api_client, node).get(gpu)
    return None if obj is None else list((obj.get("status") or {}).get("runningClaims") or [])


def test_running_claims_follow_the_claim_containers(
    api_client: client.ApiClient, node_name: str, containerd: TestRuntime, proxy_socket: Path,
    agent_inventory: tuple[inventory.Inventory, store.LedgerStore],
) -> None:
    publisher, ledger = agent_inventory
    assert publisher.holders is not None
    uuids = [simulated.simulated_uuid(node_name, i) for i in range(2)]
    gpus = [names.gpu_object_name(u) for u in uuids]
    wait_for("both GPU objects", lambda: set(node_gpus(api_client, node_name)) == set(gpus))
    # The controller reserved 30% of card 0 for the claim: its commit point, which the agent must keep.
    obj = node_gpus(api_client, node_name)[gpus[0]]
    reservation = [{"elasticGPU": "egpu-train", "cores": 30, "memory": 10240}]
    obj["status"]["allocations"] = reservation
    assert kube_request(api_client, "PUT", f"{GPUS}/{gpus[0]}/status", body=obj).status == 200

    # The CRI side of the same node: the simulated cards in the CDI spec and the view.
    cards, control = stand_ins(containerd.directory / "dev")
    cdi.write_spec(containerd.cdi_dir, [replace(c, uuid=u) for c, u in zip(cards, uuids, strict=True)], control)
    view = View(node_name=node_name, cards={u.lower(): CardInfo(uuid=u, index=i, memory_mib=81920)
                                            for i, u in enumerate(uuids)})  # fmt: skip
    view.add(slice_claim(NS, "train", user="trainer", node_name=node_name, gpus=(uuids[0],)))
    hooks = claim_hooks.ClaimHooks(view=view, ledger=ledger)
    settings = ProxySettings(listen=proxy_socket, upstream=str(containerd.socket))
    with CriProxy(settings, container_hooks=hooks) as proxy, Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
        assert proxy.reconciled.wait(10)
        pod = k.run_pod("trainer", NS, annotations={"egpuc.elasticgpu.io/main": "train",
                                                  "egpuc.elasticgpu.io/helper": "train"})
        container_id = k.create_container(pod, "main")
        k.start(container_id)
        entries = wait_for("the claim in card 0's runningClaims", lambda: running(api_client, node_name, gpus[0]),
                           timeout=10)  # fmt: skip
        started = ledger.open_allocations()[0].started_at
        assert entries == [{"namespace": NS, "name": "train", "pods": [f"{NS}/trainer"],
                            "since": started.strftime("%Y-%m-%dT%H:%M:%SZ")}]  # fmt: skip
        assert running(api_client, node_name, gpus[1]) == []
        # A second container of the same pod and claim: still one entry, written once.
        writes = publisher.holders.writes
        k.start(k.create_container(pod, "helper"))
        hooks.flush()
        assert publisher.holders.publish_once() == 0 and publisher.holders.writes == writes

        k.remove_pod(pod)
        wait_for("card 0's runningClaims empty", lambda: running(api_client, node_name, gpus[0]) == [], timeout=10)
    hooks.close()
    kept = node_gpus(api_client, node_name)[gpus[0]]["status"]
    assert kept["allocations"] == reservation  # the agent never wrote the controller's field


def test_an_exited_container_is_not_a_running_claim(
    api_client: client.ApiClient, node_name: str, containerd: TestRuntime, proxy_socket: Path,
    agent_inventory: tuple[inventory.Inventory, store.LedgerStore],
) -> None:
    """A Job's container that finished (its pod Succeeded, not deleted) holds no card (issue 23, item 4):
    the card check already let the next claim in; the published runningClaims must agree, or the
    controller keeps the deleted claim's reservation for as long as the pod object stays."""
    publisher, ledger = agent_inventory
    assert publisher.holders is not None
    uuid = simulated.simulated_uuid(node_name, 0)
    gpu = names.gpu_object_name(uuid)
    wait_for("the GPU object", lambda: gpu in node_gpus(api_client, node_name))
    cards, control = stand_ins(containerd.directory / "dev")
    cdi.write_spec(containerd.cdi_dir, [replace(cards[0], uuid=uuid)], control)
    view = View(node_name=node_name, cards={uuid.lower(): CardInfo(uuid=uuid, index=0, memory_mib=81920)})
    view.add(slice_claim(NS, "job", user="job", node_name=node_name, gpus=(uuid,)))
    hooks = claim_hooks.ClaimHooks(view=view, ledger=ledger)
    settings = ProxySettings(listen=proxy_socket, upstream=str(containerd.socket))
    with CriProxy(settings, container_hooks=hooks) as proxy, Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
        assert proxy.reconciled.wait(10)
        publisher.holders.list_containers = proxy.list_containers  # what the agent wires (running.py)
        pod = k.run_pod("job", NS, annotations={"egpuc.elasticgpu.io/main": "job"})
        container_id = k.create_container(pod, "main")
        k.start(container_id)
        hooks.flush()
        publisher.holders.publish_once()
        assert [e["name"] for e in running(api_client, node_name, gpu) or []] == ["job"]
        # The container exits (the Job is done); kubelet keeps it until the pod is deleted.
        k.runtime.StopContainer(k.pb.StopContainerRequest(container_id=container_id, timeout=5), timeout=30)
        assert container_id in k.container_ids()
        publisher.holders.publish_once()
        assert running(api_client, node_name, gpu) == [], "an exited container is published as running"
        assert len(ledger.open_allocations()) == 1, "its ledger row stays open until the container is removed"
    hooks.close()
