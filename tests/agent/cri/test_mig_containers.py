"""MIG claims into containers, end to end: kubelet (our CRI client) -> proxy with the MIG hooks
around the claim hooks -> real containerd with CDI; the simulated backend's MIG card, a real
SQLite ledger. The instance is created before the claim's first container, the container sees
only it, and it is destroyed when the last holder is gone; an agent restart converges."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from elasticgpu.agent.cri.proxy import CriProxy, ProxySettings
from elasticgpu.agent.discovery.simulated import SimulatedBackend
from elasticgpu.agent.injecting import claim_hooks
from elasticgpu.agent.ledger import models, store
from elasticgpu.agent.mig import MigHooks, MigInstances
from tests.agent.cri.kubelet import Kubelet
from tests.agent.cri.node import CARDS, View, publish_cards, slice_claim
from tests.containerd_runtime import TestRuntime

NS = "team"


@dataclass
class MigNode:
    view: View
    ledger: store.LedgerStore
    backend: SimulatedBackend
    kubelet: Kubelet
    hooks: MigHooks


def _backend(containerd: TestRuntime) -> SimulatedBackend:
    card = {"uuid": CARDS[0].uuid, "model": "NVIDIA A100-SXM4-80GB", "memory": "80Gi", "minor": CARDS[0].index,
            "mig": True}
    return SimulatedBackend({"cards": [card]}, node_name="n1", device_dir=containerd.directory / "dev")


def _hooks(view: View, ledger: store.LedgerStore, backend: SimulatedBackend, containerd: TestRuntime) -> MigHooks:
    return MigHooks(inner=claim_hooks.ClaimHooks(view=view, ledger=ledger), view=view,
                    instances=MigInstances(store=ledger, backend=backend),
                    cards=lambda: backend.snapshot().cards, cdi_dir=containerd.cdi_dir)


@pytest.fixture
def mig_node(containerd: TestRuntime, proxy_socket: Path, tmp_path: Path) -> Iterator[MigNode]:
    publish_cards(containerd.cdi_dir, containerd.directory / "dev")
    view = View()
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    backend = _backend(containerd)
    hooks = _hooks(view, ledger, backend, containerd)
    settings = ProxySettings(listen=proxy_socket, upstream=str(containerd.socket))
    with CriProxy(settings, container_hooks=hooks) as proxy, Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
        assert proxy.reconciled.wait(10)
        yield MigNode(view=view, ledger=ledger, backend=backend, kubelet=k, hooks=hooks)
    hooks.inner.close()
    ledger.close()


def _mig_claim(name: str, user: str) -> object:
    return slice_claim(NS, name, user=user, cores=42, memory_mib=40960, partition=("3g.40gb", 4))


def test_a_mig_claims_container_gets_its_instance_and_only_it(mig_node: MigNode) -> None:
    k, card = mig_node.kubelet, CARDS[0].uuid
    mig_node.view.add(_mig_claim("mig", "trainer"))  # type: ignore[arg-type]
    pod = k.run_pod("trainer", NS, annotations={"egpuc.elasticgpu.io/main": "mig", "egpuc.elasticgpu.io/side": "mig"})
    container = k.create_container(pod, "main", envs={"NVIDIA_VISIBLE_DEVICES": "all"})
    k.start(container)
    [instance] = mig_node.backend.mig_instances(card)
    assert (instance.profile, instance.start) == ("3g.40gb", 4)
    env = k.env(container)
    assert env["NVIDIA_VISIBLE_DEVICES"] == instance.uuid
    assert not {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_DEVICE_SM_LIMIT"} & set(env)  # the instance is the limit
    code, out = k.exec(container, "sh", "-c", "ls /dev/nvidia-caps; ls /dev | grep nvidia")
    assert code == 0, out
    caps = sorted(Path(p).name for p in instance.device_paths)
    assert all(name in out.split() for name in caps) and "nvidia0" in out.split()
    [record] = mig_node.ledger.mig_records()
    assert (record.state, record.mig_uuid) == (models.MIG_CREATED, instance.uuid)
    # A second container of the same pod uses the same instance: created once, kept while one holds it.
    side = k.create_container(pod, "side", envs={})
    k.start(side)
    assert k.env(side)["NVIDIA_VISIBLE_DEVICES"] == instance.uuid
    assert len(mig_node.backend.mig_instances(card)) == 1
    k.remove_container(container)
    assert [i.uuid for i in mig_node.backend.mig_instances(card)] == [instance.uuid]
    k.remove_container(side)  # the last holder: the instance goes
    assert mig_node.backend.mig_instances(card) == []
    assert mig_node.ledger.mig_records() == []


def test_nvml_refusing_refuses_the_container_and_keeps_no_row(mig_node: MigNode) -> None:
    import grpc

    k, card = mig_node.kubelet, CARDS[0].uuid
    mig_node.backend.create_mig_instance(card, profile="1g.10gb", start=5)  # an admin's instance in the way
    mig_node.view.add(_mig_claim("mig", "trainer"))  # type: ignore[arg-type]
    pod = k.run_pod("trainer", NS, annotations={"egpuc.elasticgpu.io/main": "mig"})
    with pytest.raises(grpc.RpcError) as refused:
        k.create_container(pod, "main", envs={})
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "3g.40gb at slice 4" in str(refused.value.details()) and "taken" in str(refused.value.details())
    mig_node.hooks.inner.flush()
    assert mig_node.ledger.open_allocations() == [] and mig_node.ledger.mig_records() == []
    assert [(i.profile, i.start) for i in mig_node.backend.mig_instances(card)] == [("1g.10gb", 5)]
