"""Issue 44 on the NRI front, on real containerd 1.7 and 2.x: what a tenant can do to the NRI path, and what
the front does about it.

- a key named twice (the image's ENV and the pod's env): NRI replaces one entry and the runtime keeps the
  last, so the front refuses a container whose last entry is not the agent's value (item 1);
- our CDI devices asked for without a claim: the runtime added them before NRI, and NRI cannot take a
  device out, so the front refuses the container (item 8; tests/agent/nri/test_both_fronts.py holds the
  proxy's checks on both fronts);
- containers made while no plugin was registered: an unclaimed one that can reach a card is stopped at
  the synchronize, privileged and `void` ones are left (item 2); a stop that fails is tried again until
  the runtime's channel answers (item 9);
- a Synchronize past ttrpc's 4 MiB (another tenant's large annotations) is taken in parts and the
  ledger is settled against the whole list (item 3);
- a slow reconcile does not kill the plugin (answered at once); a lost stop or remove event is
  settled by the periodic resync (found by reading).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from elasticgpu.agent.injecting import gated, hooks, injection
from elasticgpu.agent.ledger import store
from elasticgpu.agent.nri import NriFront
from tests.agent.cri.images import import_variant
from tests.agent.cri.kubelet import Kubelet, Pod
from tests.agent.cri.node import CARDS, View, publish_cards, slice_claim, whole_claim
from tests.agent.nri.test_nri_claims import (
    Agent,
    NriNode,
    devices,
    nri_node,
    spec_annotations,
    start_agent,
    uses,
    wait_for,
)
from tests.containerd_runtime import TestRuntime, sandbox_config

NS = "team"
__all__ = ["nri_node"]  # a fixture
pytestmark = pytest.mark.timeout(240)


def spec_env(kubelet: Kubelet, container_id: str) -> list[str]:
    """The env entries of the container's OCI spec, in order (what the NVIDIA hook reads: the last of a key)."""
    status = kubelet.runtime.ContainerStatus(
        kubelet.pb.ContainerStatusRequest(container_id=container_id, verbose=True), timeout=10)
    env: list[str] = json.loads(status.info["info"])["runtimeSpec"]["process"]["env"]
    return env


def entries(kubelet: Kubelet, container_id: str, key: str) -> list[str]:
    return [e.split("=", 1)[1] for e in spec_env(kubelet, container_id) if e.split("=", 1)[0] == key]


def imported_cuda_image(runtime: TestRuntime) -> str:
    """The busybox image with a CUDA image's NVIDIA_VISIBLE_DEVICES=all, once the CRI sees it (containerd 2.x's
    CRI image store learns of a `ctr` import from an event, a moment later)."""
    name = import_variant(runtime)
    with Kubelet(runtime.endpoint, runtime.image) as k:
        assert wait_for(lambda: k.images.ImageStatus(k.pb.ImageStatusRequest(image=k.pb.ImageSpec(image=name)),
                                                     timeout=10).HasField("image"), timeout_s=30), name
    return name


@pytest.fixture
def cuda_image(nri_containerd: TestRuntime) -> str:
    """The busybox image with a CUDA image's NVIDIA_VISIBLE_DEVICES=all."""
    return imported_cuda_image(nri_containerd)


# --- item 1: a key named twice ---


def test_unclaimed_container_naming_visible_devices_twice_is_refused(nri_node: NriNode, cuda_image: str) -> None:
    """Image ENV `all` + pod env `all`: before, the runtime kept `all` (every card through the NVIDIA hook)."""
    k = nri_node.kubelet
    pod = k.run_pod("twice", NS)
    with pytest.raises(grpc.RpcError) as refused:
        k.create_container(pod, "main", image=cuda_image, envs={"NVIDIA_VISIBLE_DEVICES": "all"})
    details = refused.value.details() or ""
    assert "names NVIDIA_VISIBLE_DEVICES 2 times" in details, details
    assert "remove NVIDIA_VISIBLE_DEVICES from the container's env" in details
    assert k.container_ids() == set()
    assert [reason for _, reason, _ in nri_node.view.warnings] == ["NotAdjustableThroughNri"]
    # Once only (the image's), the agent's value replaces it: exactly one entry, `void`.
    alone = k.create_container(pod, "alone", image=cuda_image)
    assert entries(k, alone, "NVIDIA_VISIBLE_DEVICES") == ["void"]
    # The pod asks for no card itself (`none`, as NVIDIA documents for CPU pods): no card either way, created.
    none = k.create_container(pod, "none", image=cuda_image, envs={"NVIDIA_VISIBLE_DEVICES": "none"})
    assert entries(k, none, "NVIDIA_VISIBLE_DEVICES") == ["none"]


def test_claim_container_naming_visible_devices_twice_is_refused(nri_node: NriNode, cuda_image: str) -> None:
    """Before, the claim's card list was replaced by the tenant's second entry (`all`)."""
    k = nri_node.kubelet
    nri_node.view.add(whole_claim(NS, "card", user="renderer"))
    pod = k.run_pod("renderer", NS, annotations=uses("card"))
    with pytest.raises(grpc.RpcError) as refused:
        k.create_container(pod, "main", image=cuda_image, envs={"NVIDIA_VISIBLE_DEVICES": "all"})
    assert "names NVIDIA_VISIBLE_DEVICES 2 times" in (refused.value.details() or "")
    assert nri_node.rows() == []  # the row prepared for it was undone
    container_id = k.create_container(pod, "main", image=cuda_image)  # the image's only: replaced
    assert entries(k, container_id, "NVIDIA_VISIBLE_DEVICES") == [CARDS[1].uuid]


def test_claim_container_whose_env_sets_a_limit_key_is_refused(nri_node: NriNode) -> None:
    """A whole card's container must not carry an MPS limit (the ledger rebuild reads it); NRI cannot remove one."""
    k = nri_node.kubelet
    nri_node.view.add(whole_claim(NS, "card", user="renderer"))
    pod = k.run_pod("renderer", NS, annotations=uses("card"))
    with pytest.raises(grpc.RpcError) as refused:
        k.create_container(pod, "main", envs={"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "1"})
    assert "sets CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in (refused.value.details() or "")
    assert nri_node.rows() == []


# --- item 8: our CDI devices without a claim ---


@pytest.mark.parametrize("form", ["field", "annotation"])
def test_our_cdi_devices_without_a_claim_are_refused(nri_node: NriNode, form: str) -> None:
    """Before, the container ran with /dev/nvidia1 and its device-cgroup rule."""
    k = nri_node.kubelet
    device = f"elasticgpu.io/gpu={CARDS[1].uuid}"
    pod = k.run_pod("sneaky", NS)
    asked: dict[str, Any] = ({"cdi_devices": [device]} if form == "field" else
                             {"annotations": {"cdi.k8s.io/sneaky": device}})
    with pytest.raises(grpc.RpcError) as refused:
        k.create_container(pod, "main", **asked)
    details = refused.value.details() or ""
    assert device in details and "NRI does not let a plugin take a device out" in details, details
    assert k.container_ids() == set()


def test_a_claim_container_asking_for_another_card_is_refused(nri_node: NriNode) -> None:
    k = nri_node.kubelet
    nri_node.view.add(slice_claim(NS, "slice", user="trainer"))
    pod = k.run_pod("trainer", NS, annotations=uses("slice"))
    other = f"elasticgpu.io/gpu={CARDS[1].uuid}"
    with pytest.raises(grpc.RpcError) as refused:
        k.create_container(pod, "main", cdi_devices=[other])
    assert f"{other} that its ElasticGPUClaim {NS}/slice does not hold" in (refused.value.details() or "")
    assert nri_node.rows() == []
    # Its own card through CDI as well is what it gets anyway: created.
    own = k.create_container(pod, "main", cdi_devices=[f"elasticgpu.io/gpu={CARDS[0].uuid}"])
    k.start(own)
    assert devices(k, own) == ["nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidiactl"]


# --- items 2 and 9: what the runtime made while no plugin was registered ---


class Offline:
    """The agent's NRI side, started later in the test (containers are created untouched before)."""

    def __init__(self, containerd: TestRuntime, plugin: str, tmp_path: Path, view: View) -> None:
        self.containerd, self.plugin, self.tmp_path, self.view = containerd, plugin, tmp_path, view
        self.ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
        self.core = gated.GatedHooks(view=view, ledger=lambda: self.ledger, settings=injection.InjectionSettings())
        self.agent: Agent | None = None

    def start(self, **front: Any) -> Agent:
        self.agent = start_agent(self.containerd, self.plugin, self.core, self.view, self.tmp_path / "agent.sock",
                                 **front)
        return self.agent

    def close(self) -> None:
        if self.agent is not None:
            self.agent.close()
        self.core.close()
        self.ledger.close()


@pytest.fixture
def offline(nri_containerd: TestRuntime, nri_plugin: str, tmp_path: Path) -> Iterator[Offline]:
    publish_cards(nri_containerd.cdi_dir, nri_containerd.directory / "dev")
    node = Offline(nri_containerd, nri_plugin, tmp_path, View())
    try:
        yield node
    finally:
        node.close()


def running(k: Kubelet) -> dict[str, int]:
    return {c.id: c.state for c in k.runtime.ListContainers(k.pb.ListContainersRequest(), timeout=10).containers}


def test_unclaimed_container_with_every_card_made_while_no_plugin_is_stopped(
    offline: Offline, nri_containerd: TestRuntime, cuda_image: str
) -> None:
    """Before, only claim containers were stopped: the image's `all` kept every card for the container's life."""
    gpu_namespace = "gpu-tools"
    offline.view.gpu_access[gpu_namespace] = True
    with Kubelet(nri_containerd.endpoint, nri_containerd.image) as k:
        pod = k.run_pod("cuda", NS)
        greedy = k.create_container(pod, "greedy", image=cuda_image)  # no plugin: NVIDIA_VISIBLE_DEVICES=all
        plain = k.create_container(pod, "plain")  # busybox: no NVIDIA env, no card
        asked_none = k.create_container(pod, "void", image=cuda_image, envs={"NVIDIA_VISIBLE_DEVICES": "void"})
        system = k.run_pod("cni", "kube-system", privileged=True)
        privileged = k.create_container(system, "agent", image=cuda_image, privileged=True)
        tools = k.create_container(k.run_pod("dcgm", gpu_namespace), "exporter", image=cuda_image)
        for container_id in (greedy, plain, asked_none, privileged, tools):
            k.start(container_id)
        assert entries(k, greedy, "NVIDIA_VISIBLE_DEVICES") == ["all"]
        agent = offline.start()
        assert wait_for(lambda: agent.front.evicted == [greedy], timeout_s=30), agent.front.evicted
        states = running(k)
        assert states[greedy] == k.pb.CONTAINER_EXITED
        assert {states[c] for c in (plain, asked_none, privileged, tools)} == {k.pb.CONTAINER_RUNNING}
        assert [reason for _, reason, _ in offline.view.warnings] == ["UnclaimedContainerWithCards"]
        # kubelet creates it again, through the plugin now: `void`.
        k.runtime.RemoveContainer(k.pb.RemoveContainerRequest(container_id=greedy), timeout=30)
        again = k.create_container(pod, "greedy", image=cuda_image)
        assert entries(k, again, "NVIDIA_VISIBLE_DEVICES") == ["void"]


def test_a_stop_that_fails_is_tried_again_until_the_runtime_answers(
    offline: Offline, nri_containerd: TestRuntime
) -> None:
    """The agent starting: its CRI channel is not open when the synchronize finds a claim container made while
    it was down. Before, that one stop failed and the container ran with the image's env until the next
    synchronize (never, while the plugin stays registered)."""
    offline.view.add(slice_claim(NS, "slice", user="early"))
    attempts: list[float] = []

    def evict(container: hooks.RuntimeContainer, why: str) -> None:
        attempts.append(time.monotonic())
        if len(attempts) < 3:
            raise ConnectionError("the agent's CRI channel is not open yet")
        with Kubelet(nri_containerd.endpoint, nri_containerd.image) as k:
            k.runtime.StopContainer(k.pb.StopContainerRequest(container_id=container.id, timeout=2), timeout=30)

    with Kubelet(nri_containerd.endpoint, nri_containerd.image) as k:
        claimed = k.create_container(k.run_pod("early", NS, annotations=uses("slice")), "main")
        k.start(claimed)
        agent = offline.start(evict=evict)
        assert wait_for(lambda: agent.front.evicted == [claimed], timeout_s=30), attempts
        assert len(attempts) == 3
        assert running(k)[claimed] == k.pb.CONTAINER_EXITED


# --- item 3: a Synchronize past ttrpc's 4 MiB ---


class CountingFront(NriFront):
    """The front, counting the synchronizes the plugin relays."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.asked = 0

    def handle(self, message: Any) -> dict[str, Any]:
        if message.get("op") == "synchronize":
            self.asked += 1
        return super().handle(message)


@pytest.fixture
def counted_node(nri_containerd: TestRuntime, nri_plugin: str, tmp_path: Path) -> Iterator[NriNode]:
    publish_cards(nri_containerd.cdi_dir, nri_containerd.directory / "dev")
    view = View()
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    core = gated.GatedHooks(view=view, ledger=lambda: ledger, settings=injection.InjectionSettings())
    agent = start_agent(nri_containerd, nri_plugin, core, view, tmp_path / "agent.sock", front_class=CountingFront)
    try:
        with Kubelet(nri_containerd.endpoint, nri_containerd.image) as k:
            yield NriNode(view=view, ledger=ledger, kubelet=k, core=core, front=agent.front, plugin=agent.plugin)
    finally:
        agent.close()
        core.close()
        ledger.close()


def test_a_synchronize_past_4_mib_is_taken_whole(counted_node: NriNode, nri_containerd: TestRuntime) -> None:
    """Another tenant's 20 pods of 250 KB of annotations each push the node's Synchronize past ttrpc's 4 MiB.
    The runtime splits it (containerd 2.x; containerd/nri#111); before, the plugin (NRI v0.6.1's stub) took the
    first part as the whole list, the agent released the ledger row of a claim container that still runs, and
    the runtime closed the plugin at every registration from then on: NRI failed open for good."""
    nri_node = counted_node
    front = nri_node.front
    assert isinstance(front, CountingFront)
    k = nri_node.kubelet
    nri_node.view.add(slice_claim(NS, "slice", user="trainer"))
    pod = k.run_pod("trainer", NS, annotations=uses("slice"))
    container_id = k.create_container(pod, "main")
    k.start(container_id)
    assert nri_node.rows() == [("created", container_id, "trainer", "slice")]
    big: list[str] = []
    try:
        for i in range(20):
            config = sandbox_config(name=f"bulky-{i}", namespace="other", uid=str(uuid.uuid4()),
                                    annotations={"example.com/blob": "x" * 250_000})
            big.append(k.runtime.RunPodSandbox(k.pb.RunPodSandboxRequest(config=config), timeout=60).pod_sandbox_id)
            # Each with its container, as a tenant's pods have: containerd's split (NRI up to v0.12) shrinks the
            # containers per part by the same factor as the pods, and a single container would shrink to none
            # per part: the runtime then sends empty parts until its deadline (an upstream bug of its own).
            k.create_container(Pod(id=big[-1], config=config), "app")
        if nri_containerd.version == "1.7":
            pytest.skip("containerd 1.7's NRI (v0.6) cannot split a Synchronize at all (containerd/nri#111 came with "
                        "NRI v0.8, containerd 2.0): there the plugin cannot register past 4 MiB; docs/security.md")
        before = front.asked
        process = nri_node.plugin.process
        assert process is not None
        process.kill()  # the plugin registers again: the runtime sends its whole state
        assert wait_for(lambda: front.asked > before, timeout_s=60), "no synchronize reached the agent"
        time.sleep(1)  # settled off the answer's path
        assert nri_node.rows() == [("created", container_id, "trainer", "slice")]
        time.sleep(3)
        assert nri_node.plugin.starts == 2  # registered, not closed by the runtime and started again
        assert wait_for(lambda: nri_node.front.synchronized.is_set())
        # Registered: a new claim container still goes through the plugin.
        nri_node.view.add(slice_claim(NS, "other-slice", user="second"))
        second = k.create_container(k.run_pod("second", NS, annotations=uses("other-slice")), "main")
        k.start(second)
        assert k.env(second)["NVIDIA_VISIBLE_DEVICES"] == CARDS[0].uuid
    finally:
        for sandbox in big:
            k.runtime.StopPodSandbox(k.pb.StopPodSandboxRequest(pod_sandbox_id=sandbox), timeout=30)
            k.runtime.RemovePodSandbox(k.pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox), timeout=30)


# --- found by reading: a slow synchronize; lost events ---


class SlowHooks(gated.GatedHooks):
    """The core's hooks whose reconcile takes 4 s (MPS daemons stopped, folders removed on a loaded node)."""

    def reconcile(self, containers: Any, *, starting: bool) -> None:
        time.sleep(4)
        super().reconcile(containers, starting=starting)


def test_a_slow_reconcile_does_not_kill_the_plugin(nri_containerd: TestRuntime, nri_plugin: str,
                                                    tmp_path: Path) -> None:
    """The runtime gives the whole Synchronize 2 s, the plugin waits 1.5 s for the agent: before, a reconcile
    longer than that ended the plugin at every registration (exit, restart, again)."""
    publish_cards(nri_containerd.cdi_dir, nri_containerd.directory / "dev")
    view = View()
    view.add(slice_claim(NS, "slice", user="trainer"))
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    core = SlowHooks(view=view, ledger=lambda: ledger, settings=injection.InjectionSettings())
    agent = start_agent(nri_containerd, nri_plugin, core, view, tmp_path / "agent.sock", synchronized_s=30)
    try:
        time.sleep(3)  # past the plugin's and the runtime's deadlines
        assert agent.plugin.starts == 1
        with Kubelet(nri_containerd.endpoint, nri_containerd.image) as k:
            container_id = k.create_container(k.run_pod("trainer", NS, annotations=uses("slice")), "main")
            k.start(container_id)
            assert k.env(container_id)["NVIDIA_VISIBLE_DEVICES"] == CARDS[0].uuid
    finally:
        agent.close()
        core.close()
        ledger.close()


class LosingFront(NriFront):
    """A front that never hears of stops and removals (events lost: the plugin restarted in between, a write lost)."""

    def handle(self, message: Any) -> dict[str, Any]:
        if message.get("op") in ("stop", "remove"):
            return {}
        return super().handle(message)


def test_lost_stop_and_remove_events_are_settled_by_the_resync(nri_containerd: TestRuntime, nri_plugin: str,
                                                                tmp_path: Path) -> None:
    """Before, NRI mode had no periodic reconcile: the row stayed open and the card counted until the next
    registration of the plugin."""
    publish_cards(nri_containerd.cdi_dir, nri_containerd.directory / "dev")
    view = View()
    view.add(slice_claim(NS, "slice", user="trainer"))
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    core = gated.GatedHooks(view=view, ledger=lambda: ledger, settings=injection.InjectionSettings())
    agent = start_agent(nri_containerd, nri_plugin, core, view, tmp_path / "agent.sock", front_class=LosingFront)

    def rows() -> list[tuple[str, str | None]]:
        assert core.inner is not None
        core.inner.flush()
        return [(a.state, a.container_id) for a in ledger.open_allocations()]

    try:
        with Kubelet(nri_containerd.endpoint, nri_containerd.image) as k:
            def listed() -> list[hooks.RuntimeContainer]:  # as the agent's CRI channel lists them
                return [hooks.RuntimeContainer(id=c.id, name=c.metadata.name, labels=dict(c.labels),
                                               annotations=dict(c.annotations),
                                               exited=c.state == k.pb.CONTAINER_EXITED)
                        for c in k.runtime.ListContainers(k.pb.ListContainersRequest(), timeout=10).containers]

            container_id = k.create_container(k.run_pod("trainer", NS, annotations=uses("slice")), "main")
            k.start(container_id)
            agent.front.resync(listed())  # a resync while it runs: nothing changes
            assert rows() == [("created", container_id)]
            k.runtime.StopContainer(k.pb.StopContainerRequest(container_id=container_id, timeout=2), timeout=30)
            agent.front.resync(listed())
            assert agent.front.list_containers()[0].exited  # it holds no card any more
            k.runtime.RemoveContainer(k.pb.RemoveContainerRequest(container_id=container_id), timeout=30)
            assert rows() == [("created", container_id)]  # the events were lost
            agent.front.resync(listed())
            assert rows() == []
    finally:
        agent.close()
        core.close()
        ledger.close()


def test_claim_annotation_spec_left_as_before(nri_node: NriNode) -> None:
    """The refusals above are NRI's limits only: a plain claim container is created as before."""
    k = nri_node.kubelet
    nri_node.view.add(slice_claim(NS, "slice", user="trainer"))
    container_id = k.create_container(k.run_pod("trainer", NS, annotations=uses("slice")), "main",
                                      envs={"NVIDIA_VISIBLE_DEVICES": "all"})
    assert entries(k, container_id, "NVIDIA_VISIBLE_DEVICES") == [CARDS[0].uuid]
    assert spec_annotations(k, container_id)["elasticgpu.io/claim"] == f"{NS}/slice"


class SlowCreateFront(NriFront):
    """A front that answers every CreateContainer past the plugin's 1.5 s (an agent stuck on its ledger)."""

    def handle(self, message: Any) -> dict[str, Any]:
        if message.get("op") == "create":
            time.sleep(2.5)
        return super().handle(message)


def test_while_the_agent_does_not_answer_the_plugin_refuses_a_key_named_twice(
    nri_containerd: TestRuntime, nri_plugin: str, tmp_path: Path
) -> None:
    """The plugin's own answer for an unclaimed container (NVIDIA_VISIBLE_DEVICES=void) has the same limit as the
    agent's: before, a CUDA image's `all` named again in the pod's env stayed `all` while the agent was stuck."""
    publish_cards(nri_containerd.cdi_dir, nri_containerd.directory / "dev")
    view = View()
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    core = gated.GatedHooks(view=view, ledger=lambda: ledger, settings=injection.InjectionSettings())
    agent = start_agent(nri_containerd, nri_plugin, core, view, tmp_path / "agent.sock", front_class=SlowCreateFront)
    try:
        image = imported_cuda_image(nri_containerd)
        with Kubelet(nri_containerd.endpoint, nri_containerd.image) as k:
            pod = k.run_pod("stuck", NS)
            with pytest.raises(grpc.RpcError) as refused:
                k.create_container(pod, "twice", image=image, envs={"NVIDIA_VISIBLE_DEVICES": "all"})
            details = refused.value.details() or ""
            assert "names NVIDIA_VISIBLE_DEVICES 2 times" in details and "did not answer" in details, details
            once = k.create_container(pod, "once", image=image)  # the plugin's own `void` replaces the image's
            assert entries(k, once, "NVIDIA_VISIBLE_DEVICES") == ["void"]
    finally:
        agent.close()
        core.close()
        ledger.close()
