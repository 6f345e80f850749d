"""A simulated node's card inventory, publishing (GPU objects and their holders) against the test API
server from a thread, with its ledger: the set-up of the tests of what the agent reports per card."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import yaml
from kubernetes import client

from elasticgpu.agent import discovery, health, inventory, kube
from elasticgpu.agent.ledger import store
from elasticgpu.agent.settings import InventorySettings
from tests.agent.objects import DESCRIPTION


@contextlib.contextmanager
def publishing_inventory(
    api_client: client.ApiClient, node_name: str, tmp_path: Path,
    wire: Callable[[inventory.Inventory], None] = lambda publisher: None,
) -> Iterator[tuple[inventory.Inventory, store.LedgerStore]]:  # fmt: skip
    """The inventory and its ledger; `wire` runs before the publisher's first pass, as the agent's start-up
    wires what the holders read (limits files, the DRA checkpoint)."""
    simulation = tmp_path / "sim.yaml"
    simulation.write_text(yaml.safe_dump(DESCRIPTION))
    backend = discovery.open_backend("simulated", node_name=node_name, simulation_file=simulation,
                                     device_dir=tmp_path / "devices", inject_dir=tmp_path / "inject")  # fmt: skip
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    agent_kube = kube.AgentKube(api_client, node_name=node_name, field_manager="elasticgpu-agent")
    publisher = inventory.Inventory(
        kube=agent_kube, backend=backend, health=health.HealthTracker(recovery_quiet_s=300),
        settings=InventorySettings(heartbeat_interval_s=2, rediscover_interval_s=0.3), ledger=ledger,
    )  # fmt: skip
    wire(publisher)
    stop = threading.Event()
    thread = threading.Thread(target=publisher.run, args=(stop,), name="test-inventory", daemon=True)
    thread.start()
    try:
        yield publisher, ledger
    finally:
        stop.set()
        publisher.wake.set()
        thread.join(timeout=15)
        ledger.close()
        backend.close()
