"""The node side of a claim resize (issue 17, docs/resize-node.md), on the real containerd.

A claim container started through the proxy gets its claim's limits file mounted read-only at
/run/elasticgpu; when the GPU allocation changes as the controller changes it (a `limit` for a
shrink under way, larger cores/memory for an expand), the file inside the running container
changes, the ledger records the size asked and the size applied, and the GPU's runningClaims
entry says `applied`. A container created without the file reports nothing applied."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from elasticgpu.agent import inventory
from elasticgpu.agent.cri.proxy import CriProxy, ProxySettings
from elasticgpu.agent.discovery import simulated
from elasticgpu.agent.injecting import cdi, claim_hooks, limits_file
from elasticgpu.agent.injecting.injection import CardInfo
from elasticgpu.agent.ledger import store
from elasticgpu.api import names
from tests.agent.conftest import wait_for
from tests.agent.cri.kubelet import Kubelet, Pod
from tests.agent.cri.node import View, slice_claim, stand_ins
from tests.agent.objects import GPUS, node_gpus
from tests.agent.publishing_inventory import publishing_inventory
from tests.containerd_runtime import TestRuntime
from tests.kube_cluster import kube_request

NS = "team"


@pytest.fixture
def agent_inventory(
    api_client: client.ApiClient, crds_installed: list[str], node_name: str, tmp_path: Path
) -> Iterator[tuple[inventory.Inventory, store.LedgerStore, limits_file.LimitsFiles]]:
    """Inventory (with its running-claims publisher keeping the limits files) of a simulated node."""
    files = limits_file.LimitsFiles(tmp_path / "limits")

    def wire(publisher: inventory.Inventory) -> None:
        assert publisher.holders is not None
        publisher.holders.limits = files  # as the agent's start-up wires it

    with publishing_inventory(api_client, node_name, tmp_path, wire) as (publisher, ledger):
        yield publisher, ledger, files


def set_allocation(api_client: client.ApiClient, node: str, gpu: str, *allocations: dict[str, Any]) -> None:
    """Write the card's reservations as the controller does (status.allocations, with the resourceVersion)."""
    obj = node_gpus(api_client, node)[gpu]
    obj["status"]["allocations"] = list(allocations)
    assert kube_request(api_client, "PUT", f"{GPUS}/{gpu}/status", body=obj).status == 200


def entry(api_client: client.ApiClient, node: str, gpu: str) -> dict[str, Any] | None:
    claims = ((node_gpus(api_client, node).get(gpu) or {}).get("status") or {}).get("runningClaims") or []
    return next((c for c in claims if (c["namespace"], c["name"]) == (NS, "train")), None)


def file_in(k: Kubelet, container_id: str) -> dict[str, Any] | None:
    code, out = k.exec(container_id, "cat", limits_file.CONTAINER_FILE)
    return json.loads(out) if code == 0 else None


def start_node(containerd: TestRuntime, node_name: str, api_client: client.ApiClient) -> tuple[list[str], View]:
    uuids = [simulated.simulated_uuid(node_name, i) for i in range(2)]
    gpus = [names.gpu_object_name(u) for u in uuids]
    wait_for("both GPU objects", lambda: set(node_gpus(api_client, node_name)) == set(gpus))
    cards, control = stand_ins(containerd.directory / "dev")
    cdi.write_spec(containerd.cdi_dir, [replace(c, uuid=u) for c, u in zip(cards, uuids, strict=True)], control)
    view = View(node_name=node_name, cards={u.lower(): CardInfo(uuid=u, index=i, memory_mib=81920)
                                            for i, u in enumerate(uuids)})  # fmt: skip
    view.add(slice_claim(NS, "train", user="trainer", node_name=node_name, gpus=(uuids[0],)))
    return gpus, view


def run_trainer(k: Kubelet) -> tuple[Pod, str]:
    pod = k.run_pod("trainer", NS, annotations={"egpuc.elasticgpu.io/main": "train"})
    container_id = k.create_container(pod, "main")
    k.start(container_id)
    return pod, container_id


def test_a_resize_reaches_the_running_container(
    api_client: client.ApiClient, node_name: str, containerd: TestRuntime, proxy_socket: Path,
    agent_inventory: tuple[inventory.Inventory, store.LedgerStore, limits_file.LimitsFiles],
) -> None:
    _, ledger, files = agent_inventory
    gpus, view = start_node(containerd, node_name, api_client)
    set_allocation(api_client, node_name, gpus[0], {"elasticGPU": "egpu-train", "cores": 30, "memory": 10240})
    hooks = claim_hooks.ClaimHooks(view=view, ledger=ledger, limits=files)
    settings = ProxySettings(listen=proxy_socket, upstream=str(containerd.socket))
    with CriProxy(settings, container_hooks=hooks) as proxy, Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
        assert proxy.reconciled.wait(10)
        pod, container_id = run_trainer(k)
        assert k.env(container_id)[limits_file.ENV_LIMITS_FILE] == "/run/elasticgpu/limits.json"
        assert file_in(k, container_id) == {"claim": f"{NS}/train", "cores": 30, "memoryMiB": 10240, "generation": 1}
        wait_for("applied 30%/10240 in runningClaims",
                 lambda: (entry(api_client, node_name, gpus[0]) or {}).get("applied") == {"cores": 30, "memory": 10240},
                 timeout=10)  # fmt: skip
        # The container cannot change its own limits: the folder is mounted read-only.
        code, _ = k.exec(container_id, "sh", "-c", f"echo {{}} > {limits_file.CONTAINER_FILE}")
        assert code != 0

        # A shrink under way: the controller sets a limit below the reservation and waits for `applied`.
        set_allocation(api_client, node_name, gpus[0], {"elasticGPU": "egpu-train", "cores": 30, "memory": 10240,
                                                        "limit": {"cores": 20, "memory": 4096}})  # fmt: skip
        wait_for("the new limit in the running container's file",
                 lambda: (file_in(k, container_id) or {}).get("cores") == 20, timeout=10)  # fmt: skip
        assert file_in(k, container_id) == {"claim": f"{NS}/train", "cores": 20, "memoryMiB": 4096, "generation": 2}
        code, out = k.exec(container_id, "cat", f"{limits_file.CONTAINER_DIR}/{limits_file.ENV_NAME}")
        assert code == 0 and "ELASTICGPU_MEMORY_MIB=4096\n" in out and "CUDA_DEVICE_SM_LIMIT=20\n" in out
        wait_for("applied 20%/4096 in runningClaims",
                 lambda: (entry(api_client, node_name, gpus[0]) or {}).get("applied") == {"cores": 20, "memory": 4096},
                 timeout=10)  # fmt: skip
        (row,) = ledger.open_allocations()
        # The ledger: the size the container was created with, the size asked and the size applied.
        assert (row.cores, row.memory_mib, row.requested, row.applied) == (30, 10240, (20, 4096), (20, 4096))

        # An expand: the controller raised the reservation itself (no limit).
        set_allocation(api_client, node_name, gpus[0], {"elasticGPU": "egpu-train", "cores": 50, "memory": 20480})
        wait_for("the expanded size in the running container's file",
                 lambda: (file_in(k, container_id) or {}).get("cores") == 50, timeout=10)  # fmt: skip
        wait_for("applied 50%/20480 in runningClaims",
                 lambda: (entry(api_client, node_name, gpus[0]) or {}).get("applied") == {"cores": 50, "memory": 20480},
                 timeout=10)  # fmt: skip
        (row,) = ledger.open_allocations()
        assert (row.requested, row.applied) == ((50, 20480), (50, 20480))

        k.remove_pod(pod)
        wait_for("the claim's limits folder removed with its last container",
                 lambda: not files.folder(NS, "train").exists(), timeout=10)  # fmt: skip
    hooks.close()


def test_a_container_without_the_file_reports_nothing_applied(
    api_client: client.ApiClient, node_name: str, containerd: TestRuntime, proxy_socket: Path,
    agent_inventory: tuple[inventory.Inventory, store.LedgerStore, limits_file.LimitsFiles],
) -> None:
    """A container created before this feature (no limits file mounted) keeps its size until it restarts:
    runningClaims has no `applied`, so the controller keeps the resize pending; the ledger still records
    the size asked."""
    _, ledger, files = agent_inventory
    gpus, view = start_node(containerd, node_name, api_client)
    set_allocation(api_client, node_name, gpus[0], {"elasticGPU": "egpu-train", "cores": 30, "memory": 10240})
    hooks = claim_hooks.ClaimHooks(view=view, ledger=ledger)  # the agent before the limits file
    settings = ProxySettings(listen=proxy_socket, upstream=str(containerd.socket))
    with CriProxy(settings, container_hooks=hooks) as proxy, Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
        assert proxy.reconciled.wait(10)
        _, container_id = run_trainer(k)
        assert file_in(k, container_id) is None
        set_allocation(api_client, node_name, gpus[0], {"elasticGPU": "egpu-train", "cores": 30, "memory": 10240,
                                                        "limit": {"cores": 20, "memory": 4096}})  # fmt: skip
        wait_for("the size asked recorded", lambda: ledger.open_allocations()[0].requested == (20, 4096), timeout=10)
        published = wait_for("the claim in runningClaims", lambda: entry(api_client, node_name, gpus[0]), timeout=10)
        assert "applied" not in published
        assert ledger.open_allocations()[0].applied is None
        assert not files.folder(NS, "train").exists()  # no container reads one: none is written
    hooks.close()


def test_after_a_shrink_the_freed_part_serves_another_claim(
    api_client: client.ApiClient, node_name: str, containerd: TestRuntime, proxy_socket: Path,
    agent_inventory: tuple[inventory.Inventory, store.LedgerStore, limits_file.LimitsFiles],
) -> None:
    """The node's own check of a card's holders counts a shrunk claim at its new size: the controller gave
    the freed part to another claim, whose container must start beside the running one."""
    _, ledger, files = agent_inventory
    gpus, view = start_node(containerd, node_name, api_client)
    uuid = simulated.simulated_uuid(node_name, 0)
    view.add(slice_claim(NS, "other", user="second", node_name=node_name, gpus=(uuid,), cores=80, memory_mib=8192))
    train = {"elasticGPU": "egpu-train", "cores": 30, "memory": 10240}
    set_allocation(api_client, node_name, gpus[0], train)
    hooks = claim_hooks.ClaimHooks(view=view, ledger=ledger, limits=files)
    settings = ProxySettings(listen=proxy_socket, upstream=str(containerd.socket))
    with CriProxy(settings, container_hooks=hooks) as proxy, Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
        assert proxy.reconciled.wait(10)
        run_trainer(k)
        # The shrink as the controller makes it: the limit first, then (once applied) the smaller reservation
        # and the freed part bound to another claim.
        set_allocation(api_client, node_name, gpus[0], {**train, "limit": {"cores": 20, "memory": 4096}})
        wait_for("applied 20%/4096", lambda: (entry(api_client, node_name, gpus[0]) or {}).get("applied") == {
            "cores": 20, "memory": 4096}, timeout=10)  # fmt: skip
        set_allocation(api_client, node_name, gpus[0], {"elasticGPU": "egpu-train", "cores": 20, "memory": 4096},
                       {"elasticGPU": "egpu-other", "cores": 80, "memory": 8192})  # fmt: skip
        second = k.run_pod("second", NS, annotations={"egpuc.elasticgpu.io/main": "other"})
        k.start(k.create_container(second, "main"))  # 20 + 80 fit the card; 30 + 80 would not
        assert sorted(row.claim_name for row in ledger.open_allocations()) == ["other", "train"]
    hooks.close()
