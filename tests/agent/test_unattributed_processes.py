"""A GPU process that no claim's container holds raises a Warning Event about its card: once per
process, rate-limited for the node. The simulated backend reports the processes, a procfs of the
test's own making says where they run, the Events land on the test API server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from elasticgpu.agent import discovery, health, inventory, kube, usage
from elasticgpu.agent.discovery import simulated
from elasticgpu.agent.ledger import store
from elasticgpu.agent.settings import InventorySettings, LedgerSettings, UsageSettings
from elasticgpu.api import names
from tests.agent.objects import DESCRIPTION

CLAIMED = "a" * 64  # the claim's container
PRIVILEGED = "b" * 64  # a container that reached the card without a claim
POD = "7c4f6a52-8a63-4a1e-9a55-3d1f0e7b9c11"


class Proc:
    """A procfs with the processes the test says: /proc/<pid>/stat (start time) and cgroup."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def process(self, pid: int, *, started: int, cgroup: str) -> int:
        folder = self.root / str(pid)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "stat").write_text(f"{pid} (python3) S 1 {' '.join(['0'] * 17)} {started} 0 0\n")
        (folder / "cgroup").write_text(cgroup + "\n")
        return pid


@pytest.fixture
def node(
    api_client: client.ApiClient, crds_installed: list[str], namespace: str, tmp_path: Path
) -> Iterator[dict[str, Any]]:
    simulation = tmp_path / "sim.yaml"
    simulation.write_text(yaml.safe_dump(DESCRIPTION))
    backend = discovery.open_backend("simulated", node_name="unattributed-node", simulation_file=simulation,
                                     device_dir=tmp_path / "devices", inject_dir=tmp_path / "inject")  # fmt: skip
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    agent_kube = kube.AgentKube(api_client, node_name="unattributed-node", field_manager="elasticgpu-agent")
    cards = inventory.Inventory(kube=agent_kube, backend=backend, health=health.HealthTracker(recovery_quiet_s=300),
                                settings=InventorySettings(events_namespace=namespace))  # fmt: skip
    cards.snapshot = backend.snapshot()
    clock = [1000.0]
    loop = usage.UsageLoop(
        backend=backend, ledger=ledger, kube=agent_kube, inventory=cards,
        settings=UsageSettings(proc_root=str(tmp_path / "proc")), ledger_settings=LedgerSettings(),
        unattributed_events_per_minute=3, clock=lambda: clock[0],
    )  # fmt: skip
    yield {"loop": loop, "ledger": ledger, "proc": Proc(tmp_path / "proc"), "inject": tmp_path / "inject",
           "clock": clock, "uuid": simulated.simulated_uuid("unattributed-node", 0)}  # fmt: skip
    ledger.close()
    backend.close()


def warnings(api_client: client.ApiClient, namespace: str) -> list[Any]:
    events = client.CoreV1Api(api_client).list_namespaced_event(namespace).items
    return sorted((e for e in events if e.reason == "UnattributedGPUProcess"), key=lambda e: e.metadata.name)


def test_a_process_no_claim_holds_is_told_once(
    api_client: client.ApiClient, namespace: str, node: dict[str, Any]
) -> None:
    loop, proc, inject, uuid = node["loop"], node["proc"], node["inject"], node["uuid"]
    row = node["ledger"].record_started(
        pod_uid=POD, pod_namespace=namespace, pod_name="trainer", container_name="main", claim_namespace=namespace,
        claim_name="train", elastic_gpu="egpu-train", gpu_uuids=[uuid], cores=30, memory_mib=10240,
    )  # fmt: skip
    node["ledger"].mark_created(row, CLAIMED)
    claimed = proc.process(101, started=5, cgroup=f"0::/kubepods/besteffort/pod{POD}/{CLAIMED}")
    privileged = proc.process(102, started=6, cgroup=f"0::/kubepods/besteffort/pod{POD}/{PRIVILEGED}")
    host = proc.process(103, started=7, cgroup="0::/system.slice/render.service")
    for pid in (claimed, privileged, host):
        simulated.inject(inject, {"process": {"card": 0, "pid": pid, "memory": 512, "sm": 10}})
    loop.sample_once()

    told = warnings(api_client, namespace)
    assert len(told) == 2, [e.message for e in told]
    assert all(e.type == "Warning" and e.involved_object.kind == names.KIND_GPU for e in told)
    assert {e.involved_object.name for e in told} == {names.gpu_object_name(uuid)}
    by_pid = {int(e.message.split()[1]): e.message for e in told}
    assert set(by_pid) == {privileged, host}
    assert f"container {PRIVILEGED}" in by_pid[privileged] and f"card {uuid} (index 0)" in by_pid[privileged]
    assert "/system.slice/render.service" in by_pid[host] and "host" in by_pid[host]
    assert set(loop.unattributed) == {privileged, host}

    # Once per process: the next passes tell nothing new.
    loop.sample_once()
    loop.sample_once()
    assert len(warnings(api_client, namespace)) == 2
    # The pid is reused by another process (another start time): that one is told too.
    proc.process(host, started=70, cgroup="0::/user.slice/user-0.slice/session-1.scope")
    loop.sample_once()
    assert len(warnings(api_client, namespace)) == 3

    # Rate limit: 3 a minute for the node. A fourth process waits for the next minute.
    late = proc.process(104, started=8, cgroup="0::/user.slice")
    simulated.inject(inject, {"process": {"card": 1, "pid": late, "memory": 256}})
    loop.sample_once()
    assert len(warnings(api_client, namespace)) == 3 and late in loop.unattributed
    node["clock"][0] += 61
    loop.sample_once()
    told = warnings(api_client, namespace)
    assert len(told) == 4
    assert any(e.message.startswith(f"process {late} ") and "(index 1)" in e.message for e in told)
