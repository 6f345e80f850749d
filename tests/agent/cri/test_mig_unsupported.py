"""A node whose device backend cannot carve MIG instances (NVML today) refuses the containers of MIG
claims, saying why, instead of giving them the card: kubelet (our CRI client) -> proxy with the hooks
`MigRoom` chooses for such a backend -> real containerd, a real SQLite ledger. Other claims pass."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from elasticgpu.agent.cri.proxy import CriProxy, ProxySettings
from elasticgpu.agent.injecting import claim_hooks, hooks
from elasticgpu.agent.ledger import store
from elasticgpu.agent.mig import MigRoom
from tests.agent.cri.kubelet import Kubelet
from tests.agent.cri.node import View, publish_cards, slice_claim
from tests.containerd_runtime import TestRuntime

NS = "team"


class NoMigBackend:
    """A device backend without MIG calls (as NVML's is): its name is all the room reads of it."""

    name = "nvml"


@pytest.fixture
def node(containerd: TestRuntime, proxy_socket: Path,
         tmp_path: Path) -> Iterator[tuple[View, claim_hooks.ClaimHooks, store.LedgerStore, Kubelet]]:  # fmt: skip
    publish_cards(containerd.cdi_dir, containerd.directory / "dev")
    view = View()
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    inner = claim_hooks.ClaimHooks(view=view, ledger=ledger)
    room = MigRoom(backend=NoMigBackend, cards=lambda: (), cdi_dir=containerd.cdi_dir)
    wrapped = room.wrap(inner, view, ledger)
    assert wrapped is not None
    container_hooks: hooks.ContainerHooks = wrapped
    settings = ProxySettings(listen=proxy_socket, upstream=str(containerd.socket))
    with CriProxy(settings, container_hooks=container_hooks) as proxy, \
            Kubelet(f"unix://{proxy_socket}", containerd.image) as k:  # fmt: skip
        assert proxy.reconciled.wait(10)
        yield view, inner, ledger, k
    inner.close()
    ledger.close()


def test_a_mig_claims_container_is_refused_where_the_backend_cannot_carve(
    node: tuple[View, claim_hooks.ClaimHooks, store.LedgerStore, Kubelet],
) -> None:
    view, inner, ledger, k = node
    view.add(slice_claim(NS, "mig", user="trainer", cores=42, memory_mib=40960, partition=("3g.40gb", 4)))
    view.add(slice_claim(NS, "soft", user="server"))
    pod = k.run_pod("trainer", NS, annotations={"egpuc.elasticgpu.io/main": "mig"})
    with pytest.raises(grpc.RpcError) as refused:
        k.create_container(pod, "main", envs={})
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = str(refused.value.details())
    assert "team/mig" in details and "3g.40gb at slice 4" in details and "nvml device backend" in details
    soft = k.run_pod("server", NS, annotations={"egpuc.elasticgpu.io/main": "soft"})
    k.start(k.create_container(soft, "main", envs={}))  # a claim without partition passes as before
    inner.flush()  # the rows' queued writes
    [row] = ledger.open_allocations()
    assert row.claim_name == "soft"  # the refused one left no row
