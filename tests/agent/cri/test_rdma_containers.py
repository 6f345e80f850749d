"""A claim's RDMA NICs reach its container through real containerd (issue 27): the CRI hook adds
the CDI device `elasticgpu.io/rdma=<nic>`, the runtime reads the agent's RDMA spec and creates
/dev/infiniband/uverbsN and rdma_cm in the container (stand-ins of /dev/null here)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from elasticgpu.agent import rdma
from elasticgpu.agent.cri.proxy import CriProxy, ProxySettings
from elasticgpu.agent.discovery.simulated import make_stand_in_device
from elasticgpu.agent.injecting import claim_hooks
from elasticgpu.agent.ledger import store
from elasticgpu.agent.rdma import spec_file
from tests.agent.cri.kubelet import Kubelet
from tests.agent.cri.node import CARDS, NODE, View, publish_cards, whole_claim
from tests.containerd_runtime import TestRuntime

NS = "team"


@pytest.fixture
def kubelet(containerd: TestRuntime, proxy_socket: Path, tmp_path: Path) -> Iterator[tuple[View, Kubelet]]:
    publish_cards(containerd.cdi_dir, containerd.directory / "dev")
    dev = containerd.directory / "dev" / "infiniband"
    nodes = (("/dev/infiniband/uverbs0", str(dev / "uverbs0")), ("/dev/infiniband/rdma_cm", str(dev / "rdma_cm")))
    for _, host in nodes:
        make_stand_in_device(Path(host))
    spec_file.write_spec(containerd.cdi_dir, [rdma.NicDevices(name="mlx5_0", nodes=nodes)])
    view = View()
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    hooks = claim_hooks.ClaimHooks(view=view, ledger=ledger, nics=rdma.NodeNics(lambda: ["mlx5_0"], node=NODE))
    settings = ProxySettings(listen=proxy_socket, upstream=str(containerd.socket))
    with CriProxy(settings, container_hooks=hooks) as proxy, Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
        assert proxy.reconciled.wait(10)
        yield view, k
    hooks.close()
    ledger.close()


def test_a_claims_nic_devices_are_in_its_container(kubelet: tuple[View, Kubelet]) -> None:
    view, k = kubelet
    view.add(replace(whole_claim(NS, "train", user="trainer"), nics=("mlx5_0",)))
    view.add(replace(whole_claim(NS, "plain", user="other"), gpus=(CARDS[0].uuid,)))  # the other card
    pod = k.run_pod("trainer", NS, annotations={"egpuc.elasticgpu.io/main": "train"})
    container_id = k.create_container(pod, "main")
    k.start(container_id)
    code, out = k.exec(container_id, "sh", "-c", "ls /dev/infiniband; true")
    assert code == 0 and sorted(out.split()) == ["rdma_cm", "uverbs0"], out
    other = k.run_pod("other", NS, annotations={"egpuc.elasticgpu.io/main": "plain"})
    plain_id = k.create_container(other, "main")
    k.start(plain_id)
    code, out = k.exec(plain_id, "sh", "-c", "ls /dev/infiniband 2>&1; true")
    assert "uverbs0" not in out  # a claim without NICs gets none
