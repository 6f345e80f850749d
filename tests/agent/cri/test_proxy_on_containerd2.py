"""The CRI proxy's core scenarios on containerd 2.x (2.1 from Debian sid, testruntime/build.sh with
ELASTICGPU_TESTRUNTIME_CONTAINERD=2): kubelet (our CRI client) -> proxy with claim hooks -> containerd 2
with CDI (its config version 3, NRI off). The rest of tests/agent/cri runs on 1.7; tests/agent/nri runs
every NRI scenario on both."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from elasticgpu.agent.cri.proxy import CriProxy, ProxySettings
from elasticgpu.agent.injecting import claim_hooks
from elasticgpu.agent.ledger import store
from tests.agent.cri.kubelet import Kubelet
from tests.agent.cri.node import CARDS, View, publish_cards, slice_claim, whole_claim
from tests.containerd_runtime import RuntimeUnavailable, TestRuntime, remove_all_pods, running_containerd

NS = "team"
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def containerd2() -> Iterator[TestRuntime]:
    """A private containerd 2.x for this module (skips naming why when it cannot be had here)."""
    with contextlib.ExitStack() as stack:
        try:
            runtime = stack.enter_context(running_containerd(containerd="2"))
        except RuntimeUnavailable as e:
            pytest.skip(f"no test container runtime (containerd 2): {e}")
        yield runtime


@pytest.fixture
def node(containerd2: TestRuntime, tmp_path: Path) -> Iterator[tuple[View, Kubelet, store.LedgerStore]]:
    publish_cards(containerd2.cdi_dir, containerd2.directory / "dev")
    view = View()
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    hooks = claim_hooks.ClaimHooks(view=view, ledger=ledger)
    socket = containerd2.directory / f"proxy-{uuid.uuid4().hex[:8]}.sock"
    settings = ProxySettings(listen=socket, upstream=str(containerd2.socket))
    try:
        with CriProxy(settings, container_hooks=hooks) as proxy, Kubelet(f"unix://{socket}", containerd2.image) as k:
            assert proxy.reconciled.wait(10)
            yield view, k, ledger
            hooks.flush()
    finally:
        hooks.close()
        ledger.close()
        remove_all_pods(containerd2)
        for spec in containerd2.cdi_dir.iterdir():
            spec.unlink()


def uses(claim: str) -> dict[str, str]:
    return {"egpuc.elasticgpu.io/main": claim}


def devices(kubelet: Kubelet, container_id: str) -> list[str]:
    code, out = kubelet.exec(container_id, "sh", "-c", "ls /dev | grep nvidia; true")
    assert code == 0, out
    return sorted(out.split())


def test_it_is_containerd_2(node: tuple[View, Kubelet, store.LedgerStore]) -> None:
    _, k, _ = node
    version = k.runtime.Version(k.pb.VersionRequest(), timeout=10)
    assert (version.runtime_name, version.runtime_version.lstrip("v")[:2]) == ("containerd", "2."), version


def test_slice_claim_through_the_proxy(node: tuple[View, Kubelet, store.LedgerStore]) -> None:
    view, k, ledger = node
    view.add(slice_claim(NS, "slice", user="trainer"))
    pod = k.run_pod("trainer", NS, annotations=uses("slice"))
    container_id = k.create_container(pod, "main", envs={"NVIDIA_VISIBLE_DEVICES": "all"})
    k.start(container_id)
    env = k.env(container_id)
    assert env["NVIDIA_VISIBLE_DEVICES"] == CARDS[0].uuid
    assert (env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], env["CUDA_DEVICE_MEMORY_LIMIT_0"]) == ("30", "10240m")
    # containerd 2's CDI resolves the proxy's CDI device into device nodes.
    assert devices(k, container_id) == ["nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidiactl"]
    status = k.runtime.ContainerStatus(k.pb.ContainerStatusRequest(container_id=container_id), timeout=10)
    assert status.status.annotations["elasticgpu.io/claim"] == f"{NS}/slice"
    assert [(a.state, a.container_id) for a in ledger.open_allocations()] == [("created", container_id)]


def test_whole_card_and_plain_containers(node: tuple[View, Kubelet, store.LedgerStore]) -> None:
    view, k, _ = node
    view.add(whole_claim(NS, "card", user="renderer"))
    card = k.create_container(k.run_pod("renderer", NS, annotations=uses("card")), "main")
    k.start(card)
    assert devices(k, card) == ["nvidia-uvm", "nvidia-uvm-tools", "nvidia1", "nvidiactl"]
    plain = k.create_container(k.run_pod("plain", NS), "main", envs={"NVIDIA_VISIBLE_DEVICES": "all"})
    k.start(plain)
    assert k.env(plain)["NVIDIA_VISIBLE_DEVICES"] == "void" and devices(k, plain) == []


def test_refused_claim_through_the_proxy(node: tuple[View, Kubelet, store.LedgerStore]) -> None:
    _, k, ledger = node
    pod = k.run_pod("refused", NS, annotations=uses("nothing"))
    with pytest.raises(grpc.RpcError) as refused:
        k.create_container(pod, "main")
    assert "does not exist" in (refused.value.details() or "")
    assert k.container_ids() == set() and ledger.open_allocations() == []
