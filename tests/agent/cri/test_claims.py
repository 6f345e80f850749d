"""Claims into containers, end to end: kubelet (our CRI client) -> proxy with claim hooks -> real
containerd with CDI; the ledger is a real SQLite file; a kill -9 of the agent is repaired."""

from __future__ import annotations

import select
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from elasticgpu.agent import errors
from elasticgpu.agent.cri import translating
from elasticgpu.agent.cri.proxy import CriProxy, ProxySettings
from elasticgpu.agent.injecting import claim_hooks
from elasticgpu.agent.injecting.hooks import RuntimeContainer
from elasticgpu.agent.injecting.injection import CardInfo
from elasticgpu.agent.ledger import store
from tests import spawning
from tests.agent.cri.kubelet import Kubelet
from tests.agent.cri.node import CARDS, View, publish_cards, serving, slice_claim, whole_claim
from tests.containerd_runtime import REPO_ROOT, TestRuntime

NS = "team"


@dataclass
class GpuNode:
    view: View
    ledger: store.LedgerStore
    ledger_url: str
    kubelet: Kubelet
    proxy: CriProxy
    hooks: claim_hooks.ClaimHooks

    def rows(self) -> list[tuple[str, str | None, str, str]]:
        """Open ledger rows: (state, container id, pod name, claim name), once queued writes are done."""
        self.hooks.flush()
        return [(a.state, a.container_id, a.pod_name, a.claim_name) for a in self.ledger.open_allocations()]


@pytest.fixture
def gpu_node(containerd: TestRuntime, proxy_socket: Path, tmp_path: Path) -> Iterator[GpuNode]:
    publish_cards(containerd.cdi_dir, containerd.directory / "dev")
    view = View()
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = store.LedgerStore.open(url)
    hooks = claim_hooks.ClaimHooks(view=view, ledger=ledger)
    settings = ProxySettings(listen=proxy_socket, upstream=str(containerd.socket))
    with CriProxy(settings, container_hooks=hooks) as proxy, Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
        assert proxy.reconciled.wait(10)
        yield GpuNode(view=view, ledger=ledger, ledger_url=url, kubelet=k, proxy=proxy, hooks=hooks)
    hooks.close()
    ledger.close()


def uses(claim: str, container: str = "main") -> dict[str, str]:
    return {f"egpuc.elasticgpu.io/{container}": claim}


def devices(kubelet: Kubelet, container_id: str) -> list[str]:
    code, out = kubelet.exec(container_id, "sh", "-c", "ls /dev | grep nvidia; true")
    assert code == 0, out
    return sorted(out.split())


def test_slice_claim(gpu_node: GpuNode) -> None:
    k = gpu_node.kubelet
    gpu_node.view.add(slice_claim(NS, "slice", user="trainer"))
    pod = k.run_pod("trainer", NS, annotations=uses("slice"))
    container_id = k.create_container(pod, "main", envs={"NVIDIA_VISIBLE_DEVICES": "all"})
    k.start(container_id)
    env = k.env(container_id)
    assert env["NVIDIA_VISIBLE_DEVICES"] == CARDS[0].uuid
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "10240m"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert devices(k, container_id) == ["nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidiactl"]
    status = k.runtime.ContainerStatus(k.pb.ContainerStatusRequest(container_id=container_id), timeout=10)
    assert status.status.annotations["elasticgpu.io/claim"] == f"{NS}/slice"
    assert gpu_node.rows() == [("created", container_id, "trainer", "slice")]
    k.remove_container(container_id)
    assert gpu_node.rows() == []
    released = gpu_node.ledger.allocation_for_container(container_id)
    assert released is not None and released.state == "released"


def test_whole_card_claim(gpu_node: GpuNode) -> None:
    k = gpu_node.kubelet
    gpu_node.view.add(whole_claim(NS, "card", user="renderer"))
    pod = k.run_pod("renderer", NS, annotations=uses("card"))
    container_id = k.create_container(pod, "main")
    k.start(container_id)
    env = k.env(container_id)
    assert env["NVIDIA_VISIBLE_DEVICES"] == CARDS[1].uuid
    assert not any(key.startswith(("CUDA_MPS", "CUDA_DEVICE")) for key in env)
    assert devices(k, container_id) == ["nvidia-uvm", "nvidia-uvm-tools", "nvidia1", "nvidiactl"]


def test_two_containers_share_a_claim_and_other_pods_wait(gpu_node: GpuNode) -> None:
    k = gpu_node.kubelet
    shared = gpu_node.view.add(slice_claim(NS, "shared", user="pair"))
    pod = k.run_pod("pair", NS, annotations={**uses("shared", "main"), **uses("shared", "helper")})
    first, second = k.create_container(pod, "main"), k.create_container(pod, "helper")
    for container_id in (first, second):
        k.start(container_id)
        assert k.env(container_id)["NVIDIA_VISIBLE_DEVICES"] == CARDS[0].uuid
    intruder = k.run_pod("intruder", NS, annotations=uses("shared"))
    with pytest.raises(grpc.RpcError) as refused:
        k.create_container(intruder, "main")
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"serves pod {NS}/pair (status.users)" in (refused.value.details() or "")
    # The pair is deleted and the controller hands the claim to the intruder, but the pair's
    # containers still run here: the ledger keeps the intruder out until they are gone.
    gpu_node.view.add(serving(shared, "intruder"))
    with pytest.raises(grpc.RpcError) as refused:
        k.create_container(intruder, "main")
    assert f"still in use by pod {NS}/pair" in (refused.value.details() or "")
    # kubelet removes the sandbox, which takes its containers along (no RemoveContainer each).
    k.runtime.StopPodSandbox(k.pb.StopPodSandboxRequest(pod_sandbox_id=pod.id), timeout=30)
    k.runtime.RemovePodSandbox(k.pb.RemovePodSandboxRequest(pod_sandbox_id=pod.id), timeout=30)
    assert gpu_node.rows() == []
    container_id = k.create_container(intruder, "main")
    assert gpu_node.rows() == [("created", container_id, "intruder", "shared")]


def test_a_stopped_holder_does_not_block(gpu_node: GpuNode) -> None:
    k = gpu_node.kubelet
    handover = gpu_node.view.add(slice_claim(NS, "handover", user="old"))
    old = k.run_pod("old", NS, annotations=uses("handover"))
    old_id = k.create_container(old, "main")
    k.start(old_id)
    k.runtime.StopContainer(k.pb.StopContainerRequest(container_id=old_id, timeout=5), timeout=30)
    gpu_node.view.add(serving(handover, "new"))  # the controller saw the old pod end
    new = k.run_pod("new", NS, annotations=uses("handover"))
    k.start(k.create_container(new, "main"))


def test_container_without_claim_gets_no_gpu(gpu_node: GpuNode) -> None:
    k = gpu_node.kubelet
    gpu_node.view.add(slice_claim(NS, "slice", user="mixed"))
    pod = k.run_pod("mixed", NS, annotations=uses("slice", "main"))
    sidecar = k.create_container(
        pod,
        "sidecar",
        envs={"NVIDIA_VISIBLE_DEVICES": "all"},
        cdi_devices=[f"elasticgpu.io/gpu={CARDS[1].uuid}"],
        annotations={"cdi.k8s.io/sneaky": f"elasticgpu.io/gpu={CARDS[0].uuid}"},
    )
    k.start(sidecar)
    assert k.env(sidecar)["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert devices(k, sidecar) == []
    assert gpu_node.rows() == []


@pytest.mark.parametrize(
    ("case", "annotations", "claim", "words"),
    [
        (
            "not bound yet",
            uses("later"),
            slice_claim(NS, "later", phase="Pending", node_name=None, gpus=()),
            "not Bound",
        ),
        ("other node", uses("far"), slice_claim(NS, "far", user="refused", node_name="node-b"), "on node node-b"),
        ("other namespace", uses("elsewhere/theirs"), slice_claim("elsewhere", "theirs"), "another namespace"),
        ("missing", uses("nothing"), None, "does not exist"),
        ("serves another pod", uses("taken"), slice_claim(NS, "taken", user="owner"), "serves pod team/owner"),
    ],
)
def test_refused_claims(gpu_node: GpuNode, case: str, annotations: dict[str, str], claim, words: str) -> None:
    k = gpu_node.kubelet
    if claim is not None:
        gpu_node.view.add(claim)
    pod = k.run_pod("refused", NS, annotations=annotations)
    with pytest.raises(grpc.RpcError) as refused:
        k.create_container(pod, "main")
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, case
    assert words in (refused.value.details() or "")
    assert k.container_ids() == set()
    assert gpu_node.rows() == []


def test_agent_not_ready_refuses_claims_only(gpu_node: GpuNode) -> None:
    k = gpu_node.kubelet
    gpu_node.view.add(slice_claim(NS, "slice", user="early"))
    gpu_node.view.reason = "claims not listed yet"
    pod = k.run_pod("early", NS, annotations=uses("slice"))
    with pytest.raises(grpc.RpcError) as refused:
        k.create_container(pod, "main")
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    k.start(k.create_container(pod, "sidecar"))  # no claim: passes
    gpu_node.view.reason = None
    k.start(k.create_container(pod, "main"))  # kubelet's retry passes once the view is ready


# --- kill -9 of the agent -------------------------------------------------------------------


_AGENTS: list[subprocess.Popen[str]] = []
AGENT_START_TIMEOUT_S = 30.0


@pytest.fixture(autouse=True)
def _no_agent_left() -> Iterator[None]:
    """Agent processes a test started are gone after it, whatever happened in it."""
    yield
    while _AGENTS:
        proc = _AGENTS.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def start_agent(
    containerd: TestRuntime, listen: Path, ledger_url: str, view: View, tmp: Path, crash_at: str = ""
) -> subprocess.Popen[str]:
    """The proxy with claim hooks as its own process (tests/agent/cri/agent_process.py), once
    it has reconciled; it dies with the test process."""
    view_file = tmp / "view.json"
    view_file.write_text(view.to_json())
    proc = spawning.spawn(
        [sys.executable, "-m", "tests.agent.cri.agent_process", str(listen), str(containerd.socket), ledger_url,
         str(view_file), crash_at],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    _AGENTS.append(proc)
    assert proc.stdout is not None
    waiting = select.poll()  # not select.select: it refuses descriptors past 1024 (a long test process)
    waiting.register(proc.stdout, select.POLLIN)
    assert waiting.poll(AGENT_START_TIMEOUT_S * 1000), \
        f"agent process did not reconcile within {AGENT_START_TIMEOUT_S:.0f}s"
    line = proc.stdout.readline()
    assert line.strip() == "reconciled", f"agent did not start: {line!r}"
    return proc


def eventually_rows(ledger: store.LedgerStore, expected: list[tuple[str, str]], timeout: float = 10.0) -> bool:
    """True once the open rows are `expected` ((state, container id) each); the agent writes
    `created` and `released` rows just after answering, so the test polls, with a deadline."""
    deadline = time.monotonic() + timeout
    while True:
        rows = [(a.state, str(a.container_id)) for a in ledger.open_allocations()]
        if rows == expected:
            return True
        if time.monotonic() > deadline:
            print(f"ledger rows {rows}, expected {expected}")
            return False
        time.sleep(0.05)


def stop_agent(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    proc.wait(15)


@pytest.mark.parametrize("crash_at", ["started", "created"])
def test_kill_9_between_ledger_and_runtime_is_reconciled(
    containerd: TestRuntime, proxy_socket: Path, tmp_path: Path, crash_at: str
) -> None:
    publish_cards(containerd.cdi_dir, containerd.directory / "dev")
    view = View()
    view.add(slice_claim(NS, "slice", user="victim"))
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    agent = start_agent(containerd, proxy_socket, url, view, tmp_path, crash_at)
    with Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
        pod = k.run_pod("victim", NS, annotations=uses("slice"))
        with pytest.raises(grpc.RpcError) as lost:
            k.create_container(pod, "main")  # the agent dies under this call
        assert lost.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)
        assert agent.wait(10) == -9
    ledger = store.LedgerStore.open(url)
    try:
        assert [a.state for a in ledger.open_allocations()] == ["started"]  # what the crash left
        agent = start_agent(containerd, proxy_socket, url, view, tmp_path)  # restart: reconciles first
        try:
            with Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
                runtime_ids = k.container_ids()
                rows = [(a.state, a.container_id) for a in ledger.open_allocations()]
                if crash_at == "started":
                    # The runtime never saw the call: the row is rolled back, no container.
                    assert runtime_ids == set() and rows == []
                else:
                    # The runtime made it: the row is completed with that container's id.
                    assert len(runtime_ids) == 1 and rows == [("created", next(iter(runtime_ids)))]
                    k.remove_container(next(iter(runtime_ids)))
                    assert eventually_rows(ledger, [])
                # kubelet's retry gets the claim: nothing stale holds it.
                container_id = k.create_container(pod, "main")
                assert eventually_rows(ledger, [("created", container_id)])
        finally:
            stop_agent(agent)
    finally:
        ledger.close()


def test_container_removed_while_agent_down_is_released(
    containerd: TestRuntime, proxy_socket: Path, tmp_path: Path
) -> None:
    publish_cards(containerd.cdi_dir, containerd.directory / "dev")
    view = View()
    view.add(slice_claim(NS, "slice", user="orphan"))
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    agent = start_agent(containerd, proxy_socket, url, view, tmp_path)
    with Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
        pod = k.run_pod("orphan", NS, annotations=uses("slice"))
        container_id = k.create_container(pod, "main")
    stop_agent(agent)
    with Kubelet(containerd.endpoint, containerd.image) as direct:  # kubelet pointed back at containerd
        direct.remove_container(container_id)
    ledger = store.LedgerStore.open(url)
    try:
        assert [a.container_id for a in ledger.open_allocations()] == [container_id]
        agent = start_agent(containerd, proxy_socket, url, view, tmp_path)
        assert eventually_rows(ledger, [])
        stop_agent(agent)
    finally:
        ledger.close()


class BrokenLedger(store.LedgerStore):
    """A real ledger whose disk fails on the next record_started (as a full disk would)."""

    def record_started(self, **kwargs: object) -> int:  # type: ignore[override]
        raise errors.LedgerError("disk I/O error")


def test_unwritable_ledger_refuses_claims_as_retryable(
    containerd: TestRuntime, proxy_socket: Path, tmp_path: Path
) -> None:
    publish_cards(containerd.cdi_dir, containerd.directory / "dev")
    view = View()
    view.add(slice_claim(NS, "slice", user="unlucky"))
    ledger = BrokenLedger.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    hooks = claim_hooks.ClaimHooks(view=view, ledger=ledger)
    settings = ProxySettings(listen=proxy_socket, upstream=str(containerd.socket))
    with CriProxy(settings, container_hooks=hooks) as proxy, Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
        assert proxy.reconciled.wait(10)
        pod = k.run_pod("unlucky", NS, annotations=uses("slice"))
        with pytest.raises(grpc.RpcError) as refused:
            k.create_container(pod, "main")
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "cannot write its ledger" in (refused.value.details() or "")
        assert k.container_ids() == set()  # no GPU without its record
        k.start(k.create_container(pod, "sidecar"))  # no claim: not the ledger's business
    hooks.close()
    ledger.close()


@pytest.mark.parametrize("runtime_made_it", [True, False])
def test_unanswered_create_is_settled_later(containerd: TestRuntime, tmp_path: Path, runtime_made_it: bool) -> None:
    """CreateContainer ended without the runtime's answer (kubelet's deadline): the row stays
    `started` and holds the claim, then a reconcile completes it or rolls it back."""
    from tests.containerd_runtime import container_config, sandbox_config

    publish_cards(containerd.cdi_dir, containerd.directory / "dev")
    view = View()
    view.add(slice_claim(NS, "slice", user="slow"))
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    hooks = claim_hooks.ClaimHooks(view=view, ledger=ledger, settle_after_s=0.0)
    with Kubelet(containerd.endpoint, containerd.image) as direct:  # the runtime, without proxy
        def listed() -> list[RuntimeContainer]:
            return [translating.runtime_container(c)
                    for c in direct.runtime.ListContainers(direct.pb.ListContainersRequest()).containers]

        hooks.attach_runtime(listed)
        hooks.reconcile([], starting=True)
        sandbox = sandbox_config(name="slow", namespace=NS, uid="uid-slow", annotations=uses("slice"))
        sandbox_id = direct.runtime.RunPodSandbox(direct.pb.RunPodSandboxRequest(config=sandbox)).pod_sandbox_id
        request = direct.pb.CreateContainerRequest(
            pod_sandbox_id=sandbox_id,
            config=container_config(name="main", image=containerd.image, sandbox=sandbox),
            sandbox_config=sandbox,
        )
        prepared = hooks.prepare_create(translating.container_request(request))
        assert translating.apply(prepared.edit, request)
        made = direct.runtime.CreateContainer(request).container_id if runtime_made_it else None
        hooks.create_failed(prepared, grpc.StatusCode.DEADLINE_EXCEEDED)
        assert [a.state for a in ledger.open_allocations()] == ["started"]  # still holds the claim
        hooks.reconcile(listed(), starting=False)
        rows = [(a.state, a.container_id) for a in ledger.open_allocations()]
        assert rows == ([("created", made)] if runtime_made_it else [])
        # A refusal by the runtime itself (an answer) rolls back at once.
        prepared = hooks.prepare_create(translating.container_request(request))
        hooks.create_failed(prepared, grpc.StatusCode.UNKNOWN)
        assert [(a.state, a.container_id) for a in ledger.open_allocations()] == rows
    hooks.close()
    ledger.close()


def test_concurrent_pods_each_get_their_own_claim(gpu_node: GpuNode) -> None:
    """kubelet starts pods in parallel: every claim container gets its claim, the ledger holds
    exactly one row per claim container, sidecars get nothing."""
    from concurrent.futures import ThreadPoolExecutor

    k = gpu_node.kubelet
    pods = [f"worker-{i}" for i in range(8)]

    def card_of(name: str) -> CardInfo:
        return CARDS[int(name.rsplit("-", 1)[1]) % 2]

    for name in pods:
        # Four claims per card: 25% each, so that the card holds them all (the agent checks the sum).
        gpu_node.view.add(slice_claim(NS, f"{name}-main", user=name, gpus=(card_of(name).uuid,), cores=25))

    def start(name: str) -> tuple[str, str, str]:
        pod = k.run_pod(name, NS, annotations={"elasticgpu.io/request.main": "gpu-core=25,gpu-memory=10Gi"})
        main, sidecar = k.create_container(pod, "main"), k.create_container(pod, "sidecar")
        for container_id in (main, sidecar):
            k.start(container_id)
        return name, main, sidecar

    with ThreadPoolExecutor(max_workers=8) as pool:
        started = list(pool.map(start, pods))
    for name, main, sidecar in started:
        assert k.env(main)["NVIDIA_VISIBLE_DEVICES"] == card_of(name).uuid
        assert k.env(sidecar)["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert sorted(gpu_node.rows()) == sorted(("created", main, name, f"{name}-main") for name, main, _ in started)


def test_a_restarted_agent_still_knows_who_holds_a_claim(
    containerd: TestRuntime, proxy_socket: Path, tmp_path: Path
) -> None:
    publish_cards(containerd.cdi_dir, containerd.directory / "dev")
    view = View()
    claim = view.add(slice_claim(NS, "slice", user="first"))
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    agent = start_agent(containerd, proxy_socket, url, view, tmp_path)
    with Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
        first = k.run_pod("first", NS, annotations=uses("slice"))
        k.start(k.create_container(first, "main"))
    stop_agent(agent)
    view.add(serving(claim, "second"))  # the controller moved on; the first pod's container still runs
    agent = start_agent(containerd, proxy_socket, url, view, tmp_path)
    try:
        with Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
            second = k.run_pod("second", NS, annotations=uses("slice"))
            with pytest.raises(grpc.RpcError) as refused:
                k.create_container(second, "main")
            assert f"still in use by pod {NS}/first" in (refused.value.details() or "")
    finally:
        stop_agent(agent)
