"""The agent reports the DRA claims it holds on each card (issue 48): a claim the driver prepares appears in its
GPU's `status.preparedClaims` on the test API server, stays while a container of it can still run after kubelet
unprepared it (a force-deleted pod), and goes once both are gone. The real checkpoint, the real SQLite ledger,
the agent's inventory and holders publisher; `status.runningClaims` and the controller's fields are untouched."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from elasticgpu.agent import inventory
from elasticgpu.agent.discovery import simulated
from elasticgpu.agent.dra import checkpoint, preparing
from elasticgpu.agent.ledger import models, store
from elasticgpu.api import dra_names, names
from tests.agent.conftest import wait_for
from tests.agent.objects import GPUS, node_gpus
from tests.agent.publishing_inventory import publishing_inventory
from tests.kube_cluster import kube_request

CLAIM = {"namespace": "ml", "name": "job-0-gpu", "uid": "uid-job-0"}


class Node:
    def __init__(self, publisher: inventory.Inventory, ledger: store.LedgerStore, store_: checkpoint.Checkpoint):
        self.publisher, self.ledger, self.checkpoint = publisher, ledger, store_


@pytest.fixture
def node(api_client: client.ApiClient, crds_installed: list[str], node_name: str, tmp_path: Path) -> Iterator[Node]:
    """A simulated node's inventory with its holders publisher wired to a DRA checkpoint, as the agent's start-up
    wires it (before the publisher's first pass)."""
    cp = checkpoint.Checkpoint(tmp_path / "dra.json")

    def wire(publisher: inventory.Inventory) -> None:
        assert publisher.holders is not None
        holders = publisher.holders
        holders.prepared = lambda: cp.entries().values()
        cp.on_change(holders.wake.set)

    with publishing_inventory(api_client, node_name, tmp_path, wire) as (publisher, ledger):
        yield Node(publisher, ledger, cp)


def _status(api_client: client.ApiClient, node_name: str, gpu: str) -> dict[str, Any]:
    return dict(node_gpus(api_client, node_name)[gpu].get("status") or {})


def _to_dra(api_client: client.ApiClient, gpu: str) -> None:
    """The platform team's move and the controller's flip of card `gpu` to DRA (prepare refuses other cards)."""
    patch = {"Content-Type": "application/merge-patch+json"}
    answer = kube_request(api_client, "PATCH", f"{GPUS}/{gpu}", body={"spec": {"owner": "DRA"}}, headers=patch)
    assert answer.status == 200, answer.body
    answer = kube_request(api_client, "PATCH", f"{GPUS}/{gpu}/status", body={"status": {"owner": "DRA"}},
                          headers=patch)
    assert answer.status == 200, answer.body


def test_prepared_claims_follow_prepare_unprepare_and_the_claim_s_containers(
    api_client: client.ApiClient, node_name: str, node: Node, tmp_path: Path
) -> None:
    uuids = [simulated.simulated_uuid(node_name, i) for i in range(2)]
    gpus = [names.gpu_object_name(u) for u in uuids]
    wait_for("both GPU objects", lambda: set(node_gpus(api_client, node_name)) == set(gpus))
    _to_dra(api_client, gpus[0])
    resource_claim = {
        "metadata": {"namespace": CLAIM["namespace"], "name": CLAIM["name"], "uid": CLAIM["uid"]},
        "status": {"allocation": {"devices": {"results": [{
            "request": "gpu", "driver": dra_names.DRIVER_NAME, "pool": dra_names.pool_name(node_name),
            "device": dra_names.device_name(0)}]}},
            "reservedFor": [{"resource": "pods", "name": "job-0", "uid": "pod-uid-0"}]},
    }  # fmt: skip
    preparer = preparing.Preparer(
        node=node_name, read_claim=lambda namespace, name: resource_claim,
        list_gpus=lambda: list(node_gpus(api_client, node_name).values()), store=node.checkpoint,
        cdi_dir=tmp_path / "cdi",
    )  # fmt: skip
    ref = preparing.ClaimRef(**CLAIM)
    preparer.prepare(ref)
    wait_for("the prepared claim in card 0's status.preparedClaims",
             lambda: _status(api_client, node_name, gpus[0]).get("preparedClaims") == [CLAIM])
    assert not _status(api_client, node_name, gpus[1]).get("preparedClaims"), "only the card the claim got"
    assert not _status(api_client, node_name, gpus[0]).get("runningClaims"), "a ResourceClaim is not ours"

    # Its container (the node hook's ledger row), then kubelet unprepares it while the container still stops.
    row = node.ledger.record_started(
        pod_uid="pod-uid-0", pod_namespace="ml", pod_name="job-0", container_name="main",
        claim_namespace=CLAIM["namespace"], claim_name=CLAIM["name"], elastic_gpu=CLAIM["uid"],
        gpu_uuids=[uuids[0]], cores=100, memory_mib=0, claim_kind=models.KIND_DRA)  # fmt: skip
    node.ledger.mark_created(row, "c-job-0")
    preparer.unprepare(ref)
    assert node.checkpoint.entries() == {}
    assert node.publisher.holders is not None
    node.publisher.holders.publish_once()  # a pass that surely saw the unprepare (the thread's may race it)
    assert _status(api_client, node_name, gpus[0]).get("preparedClaims") == [CLAIM], \
        "a container of the claim can still run: the card is still DRA's"

    node.ledger.mark_released("c-job-0")
    wait_for("card 0's status.preparedClaims empty",
             lambda: not _status(api_client, node_name, gpus[0]).get("preparedClaims"))
    assert _status(api_client, node_name, gpus[0]).get("owner") == "DRA", "the controller's field untouched"
