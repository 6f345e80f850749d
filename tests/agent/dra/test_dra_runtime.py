"""A DRA slice's container in a real containerd (issue 48): kubelet (our CRI client) names the CDI ids the
driver answered at prepare, the proxy's claim hooks (with the driver's real checkpoint) give it its
DeviceClass's isolation room and a ledger row; what the container gets is read back from inside it. The MPS
daemon is a stand-in control binary at the driver-root path (as in tests/agent/cri/test_isolation.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from elasticgpu.agent.cri.proxy import CriProxy, ProxySettings
from elasticgpu.agent.dra import checkpoint, claim_cdi
from elasticgpu.agent.injecting import claim_hooks
from elasticgpu.agent.ledger import models, store
from tests.agent.cri.conftest import containerd, containerd_session, proxy_socket  # noqa: F401 (fixtures)
from tests.agent.cri.isolation_node import IsolationNode, wait_until
from tests.agent.cri.kubelet import Kubelet
from tests.agent.cri.node import CARDS, View, publish_cards
from tests.agent.nri.conftest import nri_containerd, nri_containerd_session, nri_plugin  # noqa: F401 (fixtures)
from tests.agent.nri.test_nri_claims import start_agent
from tests.containerd_runtime import TestRuntime

CARD = CARDS[0].uuid
UID = "4f0c9b1e-dra0-4a8e-9d1c-000000000001"
POD_UID = "pod-dra-1"


@dataclass
class Node:
    kubelet: Kubelet
    hooks: claim_hooks.ClaimHooks
    ledger: store.LedgerStore
    isolation: IsolationNode


def prepared(runtime: TestRuntime, tmp_path: Path) -> checkpoint.Checkpoint:
    """The card's CDI spec, and claim team/rc prepared for pod POD_UID (a 30% slice, mode MPS) as the driver
    leaves it: its checkpoint entry and its own CDI spec."""
    publish_cards(runtime.cdi_dir, runtime.directory / "dev")
    cp = checkpoint.Checkpoint(tmp_path / "dra.json")
    device = checkpoint.PreparedDevice(requests=("gpu",), pool="node-a", device="gpu-0", uuid=CARD,
                                       cdi_ids=(claim_cdi.card_id(CARD), claim_cdi.device_id(UID)), cores=30,
                                       memory_mib=10240)  # fmt: skip
    env = claim_cdi.env([device], card_memory_mib={CARD: CARDS[0].memory_mib}, isolation="MPS")
    cp.put(checkpoint.ClaimEntry(uid=UID, namespace="team", name="rc", state=checkpoint.COMPLETED, devices=(device,),
                                 pods=(POD_UID,), env=tuple(env), isolation="MPS"))  # fmt: skip
    claim_cdi.write(runtime.cdi_dir, UID, env)  # what prepare wrote
    return cp


@pytest.fixture
def node(containerd: TestRuntime, proxy_socket: Path, tmp_path: Path) -> Iterator[Node]:  # noqa: F811
    cp = prepared(containerd, tmp_path)
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    iso = IsolationNode(tmp_path / "iso")
    hooks = claim_hooks.ClaimHooks(view=View(), ledger=ledger, rooms=iso.rooms, dra_claims=cp.claims_of_pod)
    try:
        with CriProxy(ProxySettings(listen=proxy_socket, upstream=str(containerd.socket)),
                      container_hooks=hooks) as proxy, Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
            assert proxy.reconciled.wait(10)
            yield Node(kubelet=k, hooks=hooks, ledger=ledger, isolation=iso)
    finally:
        hooks.close()
        ledger.close()
        iso.close()


@pytest.fixture
def nri_node(nri_containerd: TestRuntime, nri_plugin: str, tmp_path: Path) -> Iterator[Node]:  # noqa: F811
    """The same through the NRI front (kubelet on containerd's own socket, the plugin relaying to the core)."""
    cp = prepared(nri_containerd, tmp_path)
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    iso = IsolationNode(tmp_path / "iso")
    view = View()
    hooks = claim_hooks.ClaimHooks(view=view, ledger=ledger, rooms=iso.rooms, dra_claims=cp.claims_of_pod)
    agent = start_agent(nri_containerd, nri_plugin, hooks, view, tmp_path / "agent.sock")
    try:
        with Kubelet(nri_containerd.endpoint, nri_containerd.image) as k:
            yield Node(kubelet=k, hooks=hooks, ledger=ledger, isolation=iso)
    finally:
        agent.close()
        hooks.close()
        ledger.close()
        iso.close()


@pytest.mark.timeout(180)
def test_a_dra_slice_gets_mps_and_a_ledger_row_released_on_removal(node: Node) -> None:
    check_dra_slice(node)


@pytest.mark.timeout(180)
def test_the_same_through_nri(nri_node: Node) -> None:
    check_dra_slice(nri_node)


def released_all(node: Node) -> bool:
    node.hooks.flush()
    return node.ledger.open_allocations() == []


def check_dra_slice(node: Node) -> None:
    k = node.kubelet
    pod = k.run_pod("trainer", "team", uid=POD_UID)
    dra = k.create_container(pod, "main", cdi_devices=[claim_cdi.card_id(CARD), claim_cdi.device_id(UID)],
                             envs={"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"})  # fmt: skip
    k.start(dra)
    env = k.env(dra)
    assert env["NVIDIA_VISIBLE_DEVICES"] == CARD  # from the claim's CDI spec, not void
    assert (env["CUDA_MPS_PIPE_DIRECTORY"], env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"],
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]) == ("/run/nvidia-mps", "30", "0=10240M")  # fmt: skip
    code, out = k.exec(dra, "cat", "/run/nvidia-mps/nvidia-cuda-mps-control.pid")
    assert code == 0 and int(out) == node.isolation.daemons.pid(CARD)
    node.hooks.flush()
    row = node.ledger.allocation_for_container(dra)
    assert row is not None and (row.state, row.claim_kind, row.claim_key) == (
        models.CREATED, models.KIND_DRA, ("team", "resourceclaim/rc"))

    # Another container of the pod, without devices, comes and goes: the isolation sync runs and the card's
    # daemon stays, as the DRA container uses it (its annotations say so).
    plain = k.create_container(pod, "sidecar")
    k.remove_container(plain)
    node.hooks.flush()
    assert node.isolation.quits() == [] and len(node.isolation.servers()) == 1

    k.remove_container(dra)
    node.hooks.flush()
    wait_until("the row released", lambda: released_all(node))
    released = node.ledger.allocation_for_container(dra)
    assert released is not None and released.state == models.RELEASED
    wait_until("the daemon stopped", lambda: node.isolation.servers() == [])
    assert node.isolation.quits() == [CARD]
