"""Claims reach containers through NRI, on a real containerd 1.7 with NRI switched on and on containerd 2.x,
where it is on by default (each test runs on both: tests/agent/nri/conftest.py) (issue 34).

The CRI client talks to containerd's own socket (no proxy): the agent's NRI plugin (nri-plugin/,
a child of the test, as of the agent) relays each CreateContainer to the NRI front, which asks the
same injection core the CRI proxy asks. The same scenarios as tests/agent/cri/test_claims.py.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from elasticgpu.agent.injecting import gated, hooks, injection
from elasticgpu.agent.ledger import store
from elasticgpu.agent.nri import FrontServer, NriFront, PluginProcess, PluginSettings
from tests import spawning
from tests.agent.cri.kubelet import Kubelet
from tests.agent.cri.node import CARDS, View, publish_cards, slice_claim, whole_claim
from tests.containerd_runtime import REPO_ROOT, TestRuntime

NS = "team"
pytestmark = pytest.mark.timeout(180)


@dataclass
class NriNode:
    view: View
    ledger: store.LedgerStore
    kubelet: Kubelet
    core: gated.GatedHooks
    front: NriFront
    plugin: PluginProcess

    def rows(self) -> list[tuple[str, str | None, str, str]]:
        assert self.core.inner is not None
        self.core.inner.flush()
        return [(a.state, a.container_id, a.pod_name, a.claim_name) for a in self.ledger.open_allocations()]


@dataclass
class Agent:
    """The NRI side of an agent in this test process: front, socket, plugin child."""

    front: NriFront
    server: FrontServer
    plugin: PluginProcess
    stop: threading.Event
    thread: threading.Thread

    def close(self) -> None:
        self.stop.set()
        self.thread.join(15)
        self.server.close()


def start_agent(containerd: TestRuntime, plugin: str, core: hooks.ContainerHooks, view: View, socket: Path, *,
                evict: Any = None, front_class: type[NriFront] = NriFront, synchronized_s: float = 20) -> Agent:
    front = front_class(hooks=core, view=view, cdi_dir=containerd.cdi_dir, evict=evict or _evict(containerd))
    server = FrontServer(front, socket).start()
    assert containerd.nri_socket is not None
    process = PluginProcess(PluginSettings(binary=plugin, nri_socket=containerd.nri_socket, agent_socket=socket))
    stop = threading.Event()
    thread = threading.Thread(target=process.run, args=(stop,), daemon=True)
    thread.start()
    assert front.synchronized.wait(synchronized_s), "the plugin did not register (containerd.log says why)"
    return Agent(front=front, server=server, plugin=process, stop=stop, thread=thread)


def _evict(containerd: TestRuntime):
    def evict(container: hooks.RuntimeContainer, why: str) -> None:
        with Kubelet(containerd.endpoint, containerd.image) as k:
            k.runtime.StopContainer(k.pb.StopContainerRequest(container_id=container.id, timeout=2), timeout=30)
    return evict


@pytest.fixture
def nri_node(nri_containerd: TestRuntime, nri_plugin: str, tmp_path: Path) -> Iterator[NriNode]:
    publish_cards(nri_containerd.cdi_dir, nri_containerd.directory / "dev")
    view = View()
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    core = gated.GatedHooks(view=view, ledger=lambda: ledger, settings=injection.InjectionSettings())
    agent = start_agent(nri_containerd, nri_plugin, core, view, tmp_path / "agent.sock")
    try:
        with Kubelet(nri_containerd.endpoint, nri_containerd.image) as k:
            yield NriNode(view=view, ledger=ledger, kubelet=k, core=core, front=agent.front, plugin=agent.plugin)
    finally:
        agent.close()
        core.close()
        ledger.close()


def uses(claim: str, container: str = "main") -> dict[str, str]:
    return {f"egpuc.elasticgpu.io/{container}": claim}


def spec_annotations(kubelet: Kubelet, container_id: str) -> dict[str, str]:
    """The annotations of the container's OCI spec (the runtime's verbose status)."""
    status = kubelet.runtime.ContainerStatus(
        kubelet.pb.ContainerStatusRequest(container_id=container_id, verbose=True), timeout=10)
    annotations: dict[str, str] = json.loads(status.info["info"])["runtimeSpec"]["annotations"]
    return annotations


def devices(kubelet: Kubelet, container_id: str) -> list[str]:
    code, out = kubelet.exec(container_id, "sh", "-c", "ls /dev | grep nvidia; true")
    assert code == 0, out
    return sorted(out.split())


def test_the_runtime_is_the_containerd_the_test_names(nri_node: NriNode, nri_containerd: TestRuntime) -> None:
    """The parametrization runs two different containerds, not one twice."""
    version = nri_node.kubelet.runtime.Version(nri_node.kubelet.pb.VersionRequest(), timeout=10)
    assert version.runtime_name == "containerd"
    expected = {"1.7": "1.7.", "2": "2."}[nri_containerd.version]
    assert version.runtime_version.lstrip("v").startswith(expected), version.runtime_version


def test_slice_claim(nri_node: NriNode) -> None:
    k = nri_node.kubelet
    nri_node.view.add(slice_claim(NS, "slice", user="trainer"))
    pod = k.run_pod("trainer", NS, annotations=uses("slice"))
    container_id = k.create_container(pod, "main", envs={"NVIDIA_VISIBLE_DEVICES": "all"})
    k.start(container_id)
    env = k.env(container_id)
    assert env["NVIDIA_VISIBLE_DEVICES"] == CARDS[0].uuid
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "10240m"
    # Device nodes with their cgroup rules, not only environment (Koordinator #2809).
    assert devices(k, container_id) == ["nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidiactl"]
    # The device cgroup lets it open its card: the stand-in's major has no driver here (ENXIO), where a
    # node the cgroup does not allow says EPERM.
    _, out = k.exec(container_id, "sh", "-c", "head -c 1 /dev/nvidia0")
    assert "No such device or address" in out, out
    assert spec_annotations(k, container_id)["elasticgpu.io/claim"] == f"{NS}/slice"
    assert nri_node.rows() == [("created", container_id, "trainer", "slice")]
    k.remove_container(container_id)
    assert wait_for(lambda: nri_node.rows() == [])


def test_whole_card_claim(nri_node: NriNode) -> None:
    k = nri_node.kubelet
    nri_node.view.add(whole_claim(NS, "card", user="renderer"))
    pod = k.run_pod("renderer", NS, annotations=uses("card"))
    container_id = k.create_container(pod, "main")
    k.start(container_id)
    env = k.env(container_id)
    assert env["NVIDIA_VISIBLE_DEVICES"] == CARDS[1].uuid
    assert not any(key.startswith(("CUDA_MPS", "CUDA_DEVICE")) for key in env)
    assert devices(k, container_id) == ["nvidia-uvm", "nvidia-uvm-tools", "nvidia1", "nvidiactl"]


def test_container_without_claim_gets_no_gpu(nri_node: NriNode) -> None:
    k = nri_node.kubelet
    pod = k.run_pod("plain", NS)
    container_id = k.create_container(pod, "main", envs={"NVIDIA_VISIBLE_DEVICES": "all"},
                                      annotations={"elasticgpu.io/claim": f"{NS}/forged"})
    k.start(container_id)
    assert k.env(container_id)["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert devices(k, container_id) == []
    # Only the agent may say which claim: NRI edits the OCI spec's annotations (what the runtime and
    # NRI's Synchronize report; the CRI status keeps kubelet's request as it was).
    assert "elasticgpu.io/claim" not in spec_annotations(k, container_id)
    assert nri_node.rows() == []


@pytest.mark.parametrize(
    ("case", "annotations", "claim", "words"),
    [
        ("other node", uses("far"), slice_claim(NS, "far", user="refused", node_name="node-b"), "on node node-b"),
        ("missing", uses("nothing"), None, "does not exist"),
        ("serves another pod", uses("taken"), slice_claim(NS, "taken", user="owner"), "serves pod team/owner"),
    ],
)
def test_refused_claims(nri_node: NriNode, case: str, annotations: dict[str, str], claim, words: str) -> None:
    k = nri_node.kubelet
    if claim is not None:
        nri_node.view.add(claim)
    pod = k.run_pod("refused", NS, annotations=annotations)
    with pytest.raises(grpc.RpcError) as refused:
        k.create_container(pod, "main")
    assert words in (refused.value.details() or ""), case  # the core's words, as through the proxy
    assert k.container_ids() == set()
    assert nri_node.rows() == []


def test_privileged_claim_container_is_refused_with_an_event(nri_node: NriNode) -> None:
    k = nri_node.kubelet
    nri_node.view.add(slice_claim(NS, "slice", user="root"))
    with pytest.raises(grpc.RpcError) as refused:
        k.create_container(k.run_pod("root", NS, annotations=uses("slice"), privileged=True), "main",
                           privileged=True)
    assert "is privileged and uses ElasticGPUClaim" in (refused.value.details() or "")
    assert [reason for _, reason, _ in nri_node.view.warnings] == ["PrivilegedWithClaim"]


def wait_for(check, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return bool(check())


def test_ledger_rebuilt_from_synchronize(nri_containerd: TestRuntime, nri_plugin: str, tmp_path: Path) -> None:
    """A ledger lost (moved aside as corrupt) is rebuilt from the containers NRI's Synchronize lists,
    their cards and limits read from the environment the agent gave them."""
    publish_cards(nri_containerd.cdi_dir, nri_containerd.directory / "dev")
    view = View()
    view.add(slice_claim(NS, "slice", user="trainer"))
    first_ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'first.db'}")
    core = gated.GatedHooks(view=view, ledger=lambda: first_ledger, settings=injection.InjectionSettings())
    agent = start_agent(nri_containerd, nri_plugin, core, view, tmp_path / "agent.sock")
    with Kubelet(nri_containerd.endpoint, nri_containerd.image) as k:
        pod = k.run_pod("trainer", NS, annotations=uses("slice"))
        container_id = k.create_container(pod, "main")
        k.start(container_id)
    agent.close()
    core.close()
    first_ledger.close()
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'new.db'}")  # the agent's ledger, new and empty
    rebuilt: list[bool] = []
    core = gated.GatedHooks(view=view, ledger=lambda: ledger, settings=injection.InjectionSettings(),
                            owed_rebuild=lambda: not rebuilt, rebuilt=lambda: rebuilt.append(True))
    agent = start_agent(nri_containerd, nri_plugin, core, view, tmp_path / "agent2.sock")
    try:
        assert rebuilt == [True]
        rows = [(a.state, a.container_id, a.claim_name, a.gpu_uuids, a.cores, a.memory_mib)
                for a in ledger.open_allocations()]
        assert rows == [("created", container_id, "slice", (CARDS[0].uuid,), 30, 10240)]
        # The rebuilt row holds the claim: another pod is kept out as before.
        with Kubelet(nri_containerd.endpoint, nri_containerd.image) as k:
            view.add(slice_claim(NS, "slice", user="intruder"))
            with pytest.raises(grpc.RpcError) as refused:
                k.create_container(k.run_pod("intruder", NS, annotations=uses("slice")), "main")
            assert "still in use by pod team/trainer" in (refused.value.details() or "")
    finally:
        agent.close()
        core.close()
        ledger.close()


def test_claim_container_created_while_no_plugin_is_stopped_at_synchronize(
    nri_containerd: TestRuntime, nri_plugin: str, tmp_path: Path
) -> None:
    """NRI fails open: with no plugin registered the runtime creates a claim container untouched. The
    next plugin's Synchronize finds it (no elasticgpu.io/claim annotation) and stops it with an Event;
    an unclaimed container is left alone."""
    publish_cards(nri_containerd.cdi_dir, nri_containerd.directory / "dev")
    view = View()
    view.add(slice_claim(NS, "slice", user="early"))
    with Kubelet(nri_containerd.endpoint, nri_containerd.image) as k:
        pod = k.run_pod("early", NS, annotations=uses("slice"))
        claimed = k.create_container(pod, "main")  # no plugin: created untouched, no card
        plain = k.create_container(pod, "sidecar")
        k.start(claimed)
        k.start(plain)
        assert k.env(claimed).get("NVIDIA_VISIBLE_DEVICES") != CARDS[0].uuid
        ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
        core = gated.GatedHooks(view=view, ledger=lambda: ledger, settings=injection.InjectionSettings())
        agent = start_agent(nri_containerd, nri_plugin, core, view, tmp_path / "agent.sock")
        try:
            assert wait_for(lambda: agent.front.evicted == [claimed])
            states = {c.id: c.state for c in k.runtime.ListContainers(k.pb.ListContainersRequest()).containers}
            assert states == {claimed: k.pb.CONTAINER_EXITED, plain: k.pb.CONTAINER_RUNNING}
            assert [reason for _, reason, _ in view.warnings] == ["ClaimContainerWithoutCards"]
            # kubelet creates it again, now through the plugin, with its card.
            k.runtime.RemoveContainer(k.pb.RemoveContainerRequest(container_id=claimed), timeout=30)
            again = k.create_container(pod, "main")
            k.start(again)
            assert k.env(again)["NVIDIA_VISIBLE_DEVICES"] == CARDS[0].uuid
        finally:
            agent.close()
            core.close()
            ledger.close()


def _agent_process(containerd: TestRuntime, plugin: str, tmp_path: Path, view: View, crash_at: str = ""):
    view_file = tmp_path / "view.json"
    view_file.write_text(view.to_json())
    assert containerd.nri_socket is not None
    proc = spawning.spawn(
        [sys.executable, "-m", "tests.agent.nri.agent_process", str(containerd.nri_socket),
         str(tmp_path / "agent.sock"), plugin, f"sqlite:///{tmp_path / 'ledger.db'}", str(view_file),
         str(containerd.cdi_dir), crash_at],
        stdout=subprocess.PIPE, cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    assert ready and proc.stdout.readline().strip() == b"synchronized"
    return proc


def test_kill_9_of_the_agent_in_the_middle_of_a_create(nri_containerd: TestRuntime, nri_plugin: str,
                                                        tmp_path: Path) -> None:
    """The agent dies (SIGKILL) after recording the row `started`, before it answers: the plugin has no
    answer for a claim container and fails the creation (it must not run without its card), then exits
    with its parent. The next agent's Synchronize rolls the row back; kubelet's retry gets the card."""
    publish_cards(nri_containerd.cdi_dir, nri_containerd.directory / "dev")
    view = View()
    view.add(slice_claim(NS, "slice", user="trainer"))
    proc = _agent_process(nri_containerd, nri_plugin, tmp_path, view, crash_at="started")
    with Kubelet(nri_containerd.endpoint, nri_containerd.image) as k:
        pod = k.run_pod("trainer", NS, annotations=uses("slice"))
        with pytest.raises(grpc.RpcError) as refused:
            k.create_container(pod, "main")
        assert "did not answer" in (refused.value.details() or "")
        assert proc.wait(10) == -signal.SIGKILL
        assert k.container_ids() == set()
        ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
        # NRI names the container before it exists: its row is `created` at once, with that id
        assert [a.state for a in ledger.open_allocations()] == ["created"]
        ledger.close()
        proc = _agent_process(nri_containerd, nri_plugin, tmp_path, view)
        try:
            ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
            assert ledger.open_allocations() == []  # released by the start-up synchronize (no such container)
            ledger.close()
            container_id = k.create_container(pod, "main")
            k.start(container_id)
            assert k.env(container_id)["NVIDIA_VISIBLE_DEVICES"] == CARDS[0].uuid
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(20)
