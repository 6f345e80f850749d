"""The rest of the CRI proxy's scenarios on the NRI front, on containerd 1.7 and 2.x (issue 34 item 3): the
isolation modes' environment and mounts (HAMi-core, MPS), a MIG instance, a claim's RDMA NICs, and a
refusal's Warning Event. The same stand-ins as tests/agent/cri (isolation_node.py, the simulated backend's
MIG card, the RDMA CDI spec over stand-in devices); the core's hooks are the proxy tests' hooks, reached
through the NRI plugin and NriFront instead of the proxy: the adjustment carries the edit's env and mounts,
and our CDI devices resolved into device nodes (NRI takes no CDI names)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import pytest

from elasticgpu.agent import rdma
from elasticgpu.agent.discovery.simulated import SimulatedBackend, make_stand_in_device
from elasticgpu.agent.injecting import claim_hooks, gated, hooks, injection
from elasticgpu.agent.ledger import models, store
from elasticgpu.agent.mig import MigHooks, MigInstances
from elasticgpu.agent.rdma import spec_file
from tests.agent.cri.isolation_node import SHM_FILE, IsolationNode, wait_until
from tests.agent.cri.kubelet import Kubelet
from tests.agent.cri.node import CARDS, NODE, View, publish_cards, slice_claim, whole_claim
from tests.agent.nri.test_nri_claims import devices, start_agent, uses
from tests.containerd_runtime import TestRuntime

NS = "team"
CARD = CARDS[0].uuid
pytestmark = pytest.mark.timeout(180)


@dataclass
class Node:
    view: View
    kubelet: Kubelet
    ledger: store.LedgerStore
    flush: object  # the core's flush (queued ledger writes done)


@contextlib.contextmanager
def nri_node(containerd: TestRuntime, plugin: str, tmp_path: Path, core: hooks.ContainerHooks, view: View,
             ledger: store.LedgerStore) -> Iterator[Node]:
    """The agent's NRI side over `core`, and a kubelet on containerd's own socket."""
    agent = start_agent(containerd, plugin, core, view, tmp_path / "agent.sock")
    try:
        with Kubelet(containerd.endpoint, containerd.image) as k:
            yield Node(view=view, kubelet=k, ledger=ledger, flush=getattr(core, "flush", lambda: None))
    finally:
        agent.close()


def sh(node: Node, container_id: str, script: str) -> tuple[int, str]:
    return node.kubelet.exec(container_id, "sh", "-c", script)


def run(node: Node, pod_name: str, claim: str, *, mode: str, **changes: object) -> str:
    """A running pod `pod_name` whose container uses a Bound slice claim `claim` of isolation `mode`; its id."""
    node.view.add(slice_claim(NS, claim, user=pod_name, isolation=mode, **changes))
    pod = node.kubelet.run_pod(pod_name, NS, annotations=uses(claim))
    container_id = node.kubelet.create_container(pod, "main")
    node.kubelet.start(container_id)
    return container_id


@pytest.fixture
def isolation_node(nri_containerd: TestRuntime, nri_plugin: str,
                   tmp_path: Path) -> Iterator[tuple[Node, IsolationNode]]:
    publish_cards(nri_containerd.cdi_dir, nri_containerd.directory / "dev")
    view = View()
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    iso = IsolationNode(tmp_path / "node")
    core = claim_hooks.ClaimHooks(view=view, ledger=ledger, rooms=iso.rooms)
    try:
        with nri_node(nri_containerd, nri_plugin, tmp_path, core, view, ledger) as node:
            yield node, iso
    finally:
        core.close()
        ledger.close()
        iso.close()


def test_hami_core_environment_and_read_only_mounts(isolation_node: tuple[Node, IsolationNode]) -> None:
    node, iso = isolation_node
    first = run(node, "trainer", "train", mode="HAMiCore")
    env = node.kubelet.env(first)
    assert (env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_SM_LIMIT_0"], env["CUDA_DEVICE_SM_LIMIT"]) == (
        "10240m", "30", "30")
    assert env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == "/tmp/vgpu/vgpu.cache"
    assert not any(key.startswith("CUDA_MPS") for key in env)
    assert sh(node, first, "cat /etc/ld.so.preload") == (0, "/usr/local/vgpu/libvgpu.so\n")
    assert sh(node, first, "cat /usr/local/vgpu/libvgpu.so") == (0, "stand-in for HAMi-core's libvgpu.so\n")
    # NRI's mounts are read-only as the proxy's are: the container cannot unload or change the limiter.
    assert sh(node, first, "echo > /etc/ld.so.preload")[0] != 0
    assert sh(node, first, "echo > /usr/local/vgpu/libvgpu.so")[0] != 0
    assert sh(node, first, "echo first > /tmp/vgpu/vgpu.cache")[0] == 0
    second = run(node, "other", "other", mode="HAMiCore", memory_mib=2048)
    assert node.kubelet.env(second)["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2048m"
    assert sh(node, second, "cat /tmp/vgpu/vgpu.cache")[0] != 0  # a cache of its own
    caches = iso.state / "hami-core/cache"
    assert len(list(caches.iterdir())) == 2
    node.kubelet.remove_container(second)  # NRI's RemoveContainer reaches the core: its cache goes
    wait_until("the second cache removed", lambda: len(list(caches.iterdir())) == 1)
    assert sh(node, first, "cat /tmp/vgpu/vgpu.cache") == (0, "first\n")


def test_mps_pipe_folder_shared_memory_and_limits(isolation_node: tuple[Node, IsolationNode]) -> None:
    node, iso = isolation_node
    first = run(node, "a", "a", mode="MPS")
    env = node.kubelet.env(first)
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia-mps"
    assert (env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]) == ("30", "0=10240M")
    assert not any(key.startswith("CUDA_DEVICE_") for key in env)
    assert iso.starts() == [CARD]
    code, out = sh(node, first, "cat /run/nvidia-mps/nvidia-cuda-mps-control.pid")
    assert code == 0 and int(out) == iso.daemons.pid(CARD)
    assert sh(node, first, "test -e /etc/ld.so.preload")[0] != 0
    # The card's daemon's /dev/shm is the container's /dev/shm (NRI's mount replaces the runtime's).
    shm = iso.daemons.folder(CARD) / "shm"
    wait_until("the stand-in server wrote into its /dev/shm", lambda: (shm / SHM_FILE).exists())
    assert sh(node, first, f"cat /dev/shm/{SHM_FILE}") == (0, f"{CARD}\n")
    assert sh(node, first, "echo client > /dev/shm/from-client")[0] == 0
    assert (shm / "from-client").read_text() == "client\n"
    second = run(node, "b", "b", mode="MPS", memory_mib=2048)
    assert node.kubelet.env(second)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M"
    assert sh(node, second, "cat /dev/shm/from-client") == (0, "client\n")
    assert iso.starts() == [CARD]  # one daemon per card
    # No MPS container of the card left: the daemon stops (the NRI remove events reach the core).
    for container_id in (first, second):
        node.kubelet.remove_container(container_id)
    wait_until("the card's daemon stopped", lambda: iso.daemons.pid(CARD) is None and not shm.exists())


def test_whole_card_gets_no_mode(isolation_node: tuple[Node, IsolationNode]) -> None:
    node, _ = isolation_node
    node.view.add(whole_claim(NS, "card", user="renderer"))
    container_id = node.kubelet.create_container(node.kubelet.run_pod("renderer", NS, annotations=uses("card")), "main")
    node.kubelet.start(container_id)
    env = node.kubelet.env(container_id)
    assert not any(key.startswith(("CUDA_MPS", "CUDA_DEVICE")) for key in env)
    assert sh(node, container_id, "test -e /etc/ld.so.preload || test -e /run/nvidia-mps")[0] != 0


@pytest.fixture
def mig_node(nri_containerd: TestRuntime, nri_plugin: str, tmp_path: Path) -> Iterator[tuple[Node, SimulatedBackend]]:
    publish_cards(nri_containerd.cdi_dir, nri_containerd.directory / "dev")
    view = View()
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    card = {"uuid": CARD, "model": "NVIDIA A100-SXM4-80GB", "memory": "80Gi", "minor": CARDS[0].index, "mig": True}
    backend = SimulatedBackend({"cards": [card]}, node_name="n1", device_dir=nri_containerd.directory / "dev")
    core = MigHooks(inner=claim_hooks.ClaimHooks(view=view, ledger=ledger), view=view,
                    instances=MigInstances(store=ledger, backend=backend),
                    cards=lambda: backend.snapshot().cards, cdi_dir=nri_containerd.cdi_dir)
    try:
        with nri_node(nri_containerd, nri_plugin, tmp_path, core, view, ledger) as node:
            node.flush = core.inner.flush
            yield node, backend
    finally:
        core.inner.close()
        ledger.close()


def test_a_mig_claims_container_gets_its_instance_and_only_it(mig_node: tuple[Node, SimulatedBackend]) -> None:
    node, backend = mig_node
    k = node.kubelet
    node.view.add(slice_claim(NS, "mig", user="trainer", cores=42, memory_mib=40960, partition=("3g.40gb", 4)))
    pod = k.run_pod("trainer", NS, annotations={"egpuc.elasticgpu.io/main": "mig", "egpuc.elasticgpu.io/side": "mig"})
    container = k.create_container(pod, "main", envs={"NVIDIA_VISIBLE_DEVICES": "all"})
    k.start(container)
    [instance] = backend.mig_instances(CARD)
    assert (instance.profile, instance.start) == ("3g.40gb", 4)
    env = k.env(container)
    assert env["NVIDIA_VISIBLE_DEVICES"] == instance.uuid
    assert not {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_DEVICE_SM_LIMIT"} & set(env)
    # The instance's capability nodes, resolved from its CDI spec into NRI device nodes.
    code, out = sh(node, container, "ls /dev/nvidia-caps; ls /dev | grep nvidia")
    assert code == 0, out
    caps = sorted(Path(p).name for p in instance.device_paths)
    assert caps and all(name in out.split() for name in caps) and "nvidia0" in out.split(), out
    [record] = node.ledger.mig_records()
    assert (record.state, record.mig_uuid) == (models.MIG_CREATED, instance.uuid)
    side = k.create_container(pod, "side")
    k.start(side)
    assert k.env(side)["NVIDIA_VISIBLE_DEVICES"] == instance.uuid and len(backend.mig_instances(CARD)) == 1
    k.remove_container(container)
    assert [i.uuid for i in backend.mig_instances(CARD)] == [instance.uuid]
    k.remove_container(side)  # the last holder: the instance goes
    wait_until("the instance destroyed", lambda: backend.mig_instances(CARD) == [])
    assert node.ledger.mig_records() == []


def test_a_mig_instance_that_cannot_be_made_refuses_the_container(mig_node: tuple[Node, SimulatedBackend]) -> None:
    node, backend = mig_node
    backend.create_mig_instance(CARD, profile="1g.10gb", start=5)  # an admin's instance in the way
    node.view.add(slice_claim(NS, "mig", user="trainer", cores=42, memory_mib=40960, partition=("3g.40gb", 4)))
    pod = node.kubelet.run_pod("trainer", NS, annotations={"egpuc.elasticgpu.io/main": "mig"})
    with pytest.raises(grpc.RpcError) as refused:
        node.kubelet.create_container(pod, "main")
    details = str(refused.value.details())
    assert "3g.40gb at slice 4" in details and "taken" in details, details
    assert node.kubelet.container_ids() == set()
    node.flush()  # type: ignore[operator]
    assert node.ledger.open_allocations() == [] and node.ledger.mig_records() == []


@pytest.fixture
def rdma_node(nri_containerd: TestRuntime, nri_plugin: str, tmp_path: Path) -> Iterator[Node]:
    publish_cards(nri_containerd.cdi_dir, nri_containerd.directory / "dev")
    dev = nri_containerd.directory / "dev" / "infiniband"
    nodes = (("/dev/infiniband/uverbs0", str(dev / "uverbs0")), ("/dev/infiniband/rdma_cm", str(dev / "rdma_cm")))
    for _, host in nodes:
        make_stand_in_device(Path(host))
    spec_file.write_spec(nri_containerd.cdi_dir, [rdma.NicDevices(name="mlx5_0", nodes=nodes)])
    view = View()
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    core = claim_hooks.ClaimHooks(view=view, ledger=ledger, nics=rdma.NodeNics(lambda: ["mlx5_0"], node=NODE))
    try:
        with nri_node(nri_containerd, nri_plugin, tmp_path, core, view, ledger) as node:
            yield node
    finally:
        core.close()
        ledger.close()


def test_a_claims_nic_devices_are_in_its_container(rdma_node: Node) -> None:
    node, k = rdma_node, rdma_node.kubelet
    node.view.add(replace(whole_claim(NS, "train", user="trainer"), nics=("mlx5_0",)))
    node.view.add(replace(whole_claim(NS, "plain", user="other"), gpus=(CARD,)))
    container_id = k.create_container(k.run_pod("trainer", NS, annotations=uses("train")), "main")
    k.start(container_id)
    code, out = sh(node, container_id, "ls /dev/infiniband; true")
    assert code == 0 and sorted(out.split()) == ["rdma_cm", "uverbs0"], out
    assert devices(k, container_id) == ["nvidia-uvm", "nvidia-uvm-tools", "nvidia1", "nvidiactl"]
    plain_id = k.create_container(k.run_pod("other", NS, annotations=uses("plain")), "main")
    k.start(plain_id)
    _, out = sh(node, plain_id, "ls /dev/infiniband 2>&1; true")
    assert "uverbs0" not in out  # a claim without NICs gets none


def test_a_privileged_container_without_claim_is_refused_with_an_event_when_the_admin_asks(
    nri_containerd: TestRuntime, nri_plugin: str, tmp_path: Path
) -> None:
    """The other refusal with an Event (beside PrivilegedWithClaim, tests/agent/nri/test_nri_claims.py): a
    node whose admin refuses privileged containers without a claim (refuse_privileged), through NRI: the
    runtime fails the CreateContainer with the core's words and the pod gets the Warning Event; a labelled
    namespace's privileged container passes."""
    publish_cards(nri_containerd.cdi_dir, nri_containerd.directory / "dev")
    view = View()
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    core = gated.GatedHooks(view=view, ledger=lambda: ledger,
                            settings=injection.InjectionSettings(refuse_privileged=True))
    try:
        with nri_node(nri_containerd, nri_plugin, tmp_path, core, view, ledger) as node:
            k = node.kubelet
            with pytest.raises(grpc.RpcError) as refused:
                k.create_container(k.run_pod("tool", NS, privileged=True), "main", privileged=True)
            details = str(refused.value.details())
            assert "privileged and uses no ElasticGPUClaim" in details, details
            assert injection.NODE_GPU_ACCESS_LABEL in details
            assert k.container_ids() == set()
            assert [(pod.name, reason) for pod, reason, _ in view.warnings] == [("tool", injection.PRIVILEGED_REASON)]
            view.gpu_access["gpu-operator"] = True
            labelled = k.create_container(k.run_pod("validator", "gpu-operator", privileged=True), "main",
                                          privileged=True, envs={"NVIDIA_VISIBLE_DEVICES": "all"})
            k.start(labelled)
            assert k.env(labelled)["NVIDIA_VISIBLE_DEVICES"] == "all"
            assert len(view.warnings) == 1
    finally:
        core.close()
        ledger.close()


def test_our_nic_devices_without_a_claim_are_refused(rdma_node: Node) -> None:
    """Issue 44 item 8: the runtime resolved the NIC's CDI device before NRI, and NRI cannot take it out."""
    k = rdma_node.kubelet
    with pytest.raises(grpc.RpcError) as refused:
        k.create_container(k.run_pod("sneaky", NS), "main", cdi_devices=[f"{rdma.CDI_KIND}=mlx5_0"])
    details = refused.value.details() or ""
    assert f"{rdma.CDI_KIND}=mlx5_0 without an ElasticGPUClaim" in details, details
    assert k.container_ids() == set()
