"""One card never serves more than it has, whatever the claims say: kubelet (our CRI client) ->
proxy with claim hooks -> real containerd with CDI, a real SQLite ledger.

The claim-level check (a claim serves one pod) is not enough: when a claim is released while
its pod still runs (its finalizer removed by hand, the claim deleted), the controller may bind
another claim to the same card. The agent sees both claims' containers in its ledger and keeps
the card within its capacity: a whole card serves one claim, slices sum their cores and memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from elasticgpu.agent.cri.proxy import CriProxy, ProxySettings
from elasticgpu.agent.injecting import claim_hooks, hooks
from elasticgpu.agent.ledger import store
from tests.agent.cri.kubelet import Kubelet, Pod
from tests.agent.cri.node import CARDS, View, publish_cards, serving, slice_claim, whole_claim
from tests.containerd_runtime import TestRuntime

NS = "team"


class GapHooks(claim_hooks.ClaimHooks):
    """Claim hooks with a test's step between the caller's ListContainers and the reconcile: the
    window in which the proxy's periodic reconcile (and the one after RemovePodSandbox) holds a
    list of containers that a CreateContainer can make stale."""

    gap: Callable[[], None] | None = None

    def reconcile(self, containers: Sequence[hooks.RuntimeContainer], *, starting: bool) -> None:
        gap, self.gap = self.gap, None
        if gap is not None and not starting:
            gap()
        super().reconcile(containers, starting=starting)


@dataclass
class GpuNode:
    view: View
    ledger: store.LedgerStore
    kubelet: Kubelet
    hooks: GapHooks

    def rows(self) -> list[tuple[str, str | None, str, str]]:
        """Open ledger rows: (state, container id, pod name, claim name), once queued writes are done."""
        self.hooks.flush()
        return [(a.state, a.container_id, a.pod_name, a.claim_name) for a in self.ledger.open_allocations()]


@pytest.fixture
def gpu_node(containerd: TestRuntime, proxy_socket: Path, tmp_path: Path) -> Iterator[GpuNode]:
    publish_cards(containerd.cdi_dir, containerd.directory / "dev")
    view = View()
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    hooks = GapHooks(view=view, ledger=ledger)
    settings = ProxySettings(listen=proxy_socket, upstream=str(containerd.socket))
    with CriProxy(settings, container_hooks=hooks) as proxy, Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
        assert proxy.reconciled.wait(10)
        yield GpuNode(view=view, ledger=ledger, kubelet=k, hooks=hooks)
    hooks.close()
    ledger.close()


def uses(claim: str, container: str = "main") -> dict[str, str]:
    return {f"egpuc.elasticgpu.io/{container}": claim}


def devices(kubelet: Kubelet, container_id: str) -> list[str]:
    code, out = kubelet.exec(container_id, "sh", "-c", "ls /dev | grep nvidia; true")
    assert code == 0, out
    return sorted(out.split())


def refused_create(kubelet: Kubelet, pod: Pod, running: str) -> grpc.RpcError:
    """CreateContainer of `pod`'s main container, which must be refused; if the runtime made it,
    fail with what both containers see (the card served twice)."""
    try:
        intruder = kubelet.create_container(pod, "main")
    except grpc.RpcError as e:
        return e
    kubelet.start(intruder)
    pytest.fail(
        f"one card served two claims: the running container sees {devices(kubelet, running)}, "
        f"the new one {devices(kubelet, intruder)}"
    )


def test_a_card_still_used_by_a_released_claim_is_not_given_to_the_next(gpu_node: GpuNode) -> None:
    k = gpu_node.kubelet
    gpu_node.view.add(whole_claim("team-a", "first", user="trainer"))
    first = k.run_pod("trainer", "team-a", annotations=uses("first"))
    first_id = k.create_container(first, "main")
    k.start(first_id)
    assert "nvidia1" in devices(k, first_id)
    # Its claim is deleted while the pod runs (finalizer removed by hand); the controller frees the
    # reservation and binds a claim of another namespace to the same card.
    del gpu_node.view.claims[("team-a", "first")]
    gpu_node.view.add(whole_claim("team-b", "second", user="server"))
    second = k.run_pod("server", "team-b", annotations=uses("second"))
    refused = refused_create(k, second, first_id)
    message = refused.details() or ""
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert CARDS[1].uuid in message and "ElasticGPUClaim team-a/first (pod team-a/trainer)" in message
    assert "whole" in message and "kubelet retries" in message
    assert k.container_ids() == {first_id}
    assert gpu_node.rows() == [("created", first_id, "trainer", "first")]
    # The first pod ends: the card is free, kubelet's retry passes.
    k.remove_pod(first)
    second_id = k.create_container(second, "main")
    k.start(second_id)
    assert "nvidia1" in devices(k, second_id)


def test_slices_of_one_card_sum_within_its_capacity(gpu_node: GpuNode) -> None:
    k = gpu_node.kubelet
    card = CARDS[0]  # 80 GiB
    gpu_node.view.add(slice_claim("team-a", "big", user="a", cores=60, memory_mib=40960))
    gpu_node.view.add(slice_claim("team-b", "small", user="b", cores=30, memory_mib=30720))
    running = {}
    for namespace, pod_name, claim in (("team-a", "a", "big"), ("team-b", "b", "small")):
        pod = k.run_pod(pod_name, namespace, annotations=uses(claim))
        running[pod_name] = k.create_container(pod, "main")
        k.start(running[pod_name])  # 60 + 30 cores, 40 + 30 GiB: fits
    # Cores: 60 + 30 + 20 > 100.
    gpu_node.view.add(slice_claim("team-c", "cores", user="c", cores=20, memory_mib=1024))
    refused = refused_create(k, k.run_pod("c", "team-c", annotations=uses("cores")), running["a"])
    message = refused.details() or ""
    assert card.uuid in message and "110" in message and "cores" in message
    assert "ElasticGPUClaim team-a/big (pod team-a/a)" in message
    assert "ElasticGPUClaim team-b/small (pod team-b/b)" in message
    # Memory: 40 + 30 + 20 GiB > 80 GiB, though 60 + 30 + 10 cores fit.
    gpu_node.view.add(slice_claim("team-d", "memory", user="d", cores=10, memory_mib=20480))
    refused = refused_create(k, k.run_pod("d", "team-d", annotations=uses("memory")), running["a"])
    assert "92160 MiB" in (refused.details() or "") and "81920 MiB" in (refused.details() or "")
    # A whole-card claim on a card with slices running.
    gpu_node.view.add(slice_claim("team-e", "whole", user="e", cores=100, memory_mib=0))
    refused = refused_create(k, k.run_pod("e", "team-e", annotations=uses("whole")), running["a"])
    assert "whole" in (refused.details() or "")
    # What fits still passes: 10 more cores and 10 GiB.
    gpu_node.view.add(slice_claim("team-f", "fits", user="f", cores=10, memory_mib=10240))
    k.start(k.create_container(k.run_pod("f", "team-f", annotations=uses("fits")), "main"))
    assert len(gpu_node.rows()) == 3


def test_a_stopped_container_does_not_hold_its_card(gpu_node: GpuNode) -> None:
    k = gpu_node.kubelet
    gpu_node.view.add(whole_claim("team-a", "done", user="job"))
    job = k.run_pod("job", "team-a", annotations=uses("done"))
    job_id = k.create_container(job, "main")
    k.start(job_id)
    k.runtime.StopContainer(k.pb.StopContainerRequest(container_id=job_id, timeout=5), timeout=30)
    gpu_node.view.add(whole_claim("team-b", "next", user="next"))
    k.start(k.create_container(k.run_pod("next", "team-b", annotations=uses("next")), "main"))


# --- reconcile with a list made before the lock -----------------------------------------------


def test_a_container_created_after_the_reconcile_listed_keeps_its_row(gpu_node: GpuNode) -> None:
    """RemovePodSandbox of another pod: the proxy lists the containers, then reconciles. A claim
    container created in between must not be taken for gone (its row released): a second pod would
    then get the claim while the first still runs."""
    k = gpu_node.kubelet
    claim = gpu_node.view.add(slice_claim(NS, "held", user="holder"))
    bystander = k.run_pod("bystander", NS)
    holder = k.run_pod("holder", NS, annotations=uses("held"))
    made: list[str] = []
    gpu_node.hooks.gap = lambda: made.append(k.create_container(holder, "main"))
    k.runtime.StopPodSandbox(k.pb.StopPodSandboxRequest(pod_sandbox_id=bystander.id), timeout=30)
    k.runtime.RemovePodSandbox(k.pb.RemovePodSandboxRequest(pod_sandbox_id=bystander.id), timeout=30)
    assert gpu_node.hooks.gap is None and len(made) == 1, "the reconcile after RemovePodSandbox did not run"
    k.start(made[0])
    assert gpu_node.rows() == [("created", made[0], "holder", "held")]
    # The controller hands the claim to another pod; the holder's container still runs here.
    gpu_node.view.add(serving(claim, "second"))
    refused = refused_create(k, k.run_pod("second", NS, annotations=uses("held")), made[0])
    assert f"still in use by pod {NS}/holder" in (refused.details() or "")
