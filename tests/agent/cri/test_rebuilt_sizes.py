"""A ledger rebuilt from the runtime's containers takes each container's size from its claim, as the
controller bound it, never from the container's environment (issue 44.7): kubelet (our CRI client) ->
proxy with the agent's gated hooks -> real containerd with CDI, real SQLite ledgers.

A tenant's image may set CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=1 in a whole-card container (the agent writes
no limit for a whole card, so the image's value stays). Before, the agent restarted on a lost ledger read
that value back as the container's size: a 1% slice, and the card check let another tenant's 90% slice
onto the card. While claims cannot be read (the API server out of reach) the rebuild waits, and claims with
it; a container whose claim is gone holds its cards whole until it ends: a card may be wasted, never served
twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from elasticgpu.agent import errors
from elasticgpu.agent.cri.proxy import CriProxy, ProxySettings
from elasticgpu.agent.injecting import gated, injection
from elasticgpu.agent.ledger import store
from tests.agent.conftest import wait_for
from tests.agent.cri.images import import_variant
from tests.agent.cri.kubelet import Kubelet
from tests.agent.cri.node import CARDS, View, publish_cards, slice_claim, whole_claim
from tests.agent.cri.test_card_holders import devices, refused_create, uses
from tests.containerd_runtime import TestRuntime

TENANT_LIMITS = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "1", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1M",
                 "CUDA_DEVICE_SM_LIMIT": "1", "CUDA_DEVICE_MEMORY_LIMIT_0": "1m"}
"""What a tenant's image or pod spec may set: the limit variables the agent writes for slices."""


class Unreachable(View):
    """The view while the API server cannot be asked (the agent's claim view raises KubeUnavailable), until
    `reachable`."""

    reachable = False

    def claim(self, namespace: str, name: str) -> injection.ClaimInfo | None:
        if not self.reachable:
            raise errors.KubeUnavailable(f"ElasticGPUClaim {namespace}/{name}: the API server is out of reach")
        return super().claim(namespace, name)


@contextmanager
def agent(view: View, ledger: store.LedgerStore, containerd: TestRuntime, socket: Path, *,
          lost_ledger: bool) -> Iterator[Kubelet]:  # fmt: skip
    """The agent's CRI hook (gated hooks, as `agent run` makes them) on `ledger`; `lost_ledger`: the ledger is
    new because the last one was lost (the start-up reconciliation rebuilds it first)."""
    started: list[CriProxy] = []
    rebuilt: list[bool] = []
    hooks = gated.GatedHooks(view=view, ledger=lambda: ledger, settings=injection.InjectionSettings(),
                             owed_rebuild=lambda: lost_ledger and not rebuilt, rebuilt=lambda: rebuilt.append(True),
                             container_env=lambda container_id: started[0].container_env(container_id))  # fmt: skip
    settings = ProxySettings(listen=socket, upstream=str(containerd.socket), reconcile_period_s=0.2)
    with CriProxy(settings, container_hooks=hooks) as proxy, Kubelet(f"unix://{socket}", containerd.image) as k:
        started.append(proxy)
        assert proxy.reconciled.wait(30)
        yield k
    hooks.close()


def sizes(ledger: store.LedgerStore) -> list[tuple[str | None, str, tuple[str, ...], int, int]]:
    return [(row.container_id, row.claim_name, row.gpu_uuids, row.cores, row.memory_mib)
            for row in ledger.open_allocations()]


def test_a_whole_card_whose_image_sets_a_thread_percentage_is_rebuilt_whole(
    containerd: TestRuntime, proxy_socket: Path, tmp_path: Path,
) -> None:  # fmt: skip
    publish_cards(containerd.cdi_dir, containerd.directory / "dev")
    image = import_variant(containerd, name="elasticgpu.local/busybox-mps-one:test", env=TENANT_LIMITS)
    view = View()
    view.add(whole_claim("team-a", "whole", user="trainer"))
    first = store.LedgerStore.open(f"sqlite:///{tmp_path / 'first.db'}")
    with agent(view, first, containerd, proxy_socket, lost_ledger=False) as k:
        trainer = k.run_pod("trainer", "team-a", annotations=uses("whole"))
        main = k.create_container(trainer, "main", image=image, envs={"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "1"})
        k.start(main)
        assert k.env(main)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "1"  # the tenant's, untouched: a whole card
    first.close()

    # The agent restarts on a lost ledger: rebuilt from the runtime's containers.
    second = store.LedgerStore.open(f"sqlite:///{tmp_path / 'second.db'}")
    try:
        with agent(view, second, containerd, proxy_socket, lost_ledger=True) as k:
            whole = CARDS[1].uuid
            assert sizes(second) == [(main, "whole", (whole,), 100, 0)]
            # Another tenant's 90% slice of the same card (a controller's stale bind, a claim released by hand):
            # the card check still sees the card held whole.
            view.add(slice_claim("team-b", "ninety", user="server", gpus=(whole,), cores=90, memory_mib=1024))
            refused = refused_create(k, k.run_pod("server", "team-b", annotations=uses("ninety")), main)
            assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "ElasticGPUClaim team-a/whole (pod team-a/trainer)" in (refused.details() or "")
            assert "nvidia1" in devices(k, main)
            k.remove_pod(trainer)
    finally:
        second.close()


def test_a_container_whose_claim_is_gone_is_rebuilt_holding_its_cards_whole(
    containerd: TestRuntime, proxy_socket: Path, tmp_path: Path,
) -> None:  # fmt: skip
    publish_cards(containerd.cdi_dir, containerd.directory / "dev")
    view = View()
    view.add(slice_claim("team-a", "small", user="trainer"))  # 30% of the first card
    first = store.LedgerStore.open(f"sqlite:///{tmp_path / 'first.db'}")
    with agent(view, first, containerd, proxy_socket, lost_ledger=False) as k:
        trainer = k.run_pod("trainer", "team-a", annotations=uses("small"))
        main = k.create_container(trainer, "main", envs=TENANT_LIMITS)
        k.start(main)
        assert k.env(main)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"  # the agent's, over the tenant's
    first.close()

    later = View()  # the claim deleted by hand (its finalizer removed) while its pod runs
    second = store.LedgerStore.open(f"sqlite:///{tmp_path / 'second.db'}")
    try:
        with agent(later, second, containerd, proxy_socket, lost_ledger=True) as k:
            card = CARDS[0].uuid
            assert sizes(second) == [(main, "small", (card,), 100, 0)]
            later.add(slice_claim("team-b", "next", user="server", cores=10, memory_mib=1024))
            refused = refused_create(k, k.run_pod("server", "team-b", annotations=uses("next")), main)
            assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "ElasticGPUClaim team-a/small" in (refused.details() or "")
            k.remove_pod(trainer)
            wait_for("the row released with its container", lambda: not sizes(second), timeout=30)
    finally:
        second.close()


def test_the_rebuild_waits_until_the_claims_can_be_read(
    containerd: TestRuntime, proxy_socket: Path, tmp_path: Path,
) -> None:  # fmt: skip
    publish_cards(containerd.cdi_dir, containerd.directory / "dev")
    view = Unreachable()
    view.reachable = True
    view.add(slice_claim("team-a", "small", user="trainer"))
    first = store.LedgerStore.open(f"sqlite:///{tmp_path / 'first.db'}")
    with agent(view, first, containerd, proxy_socket, lost_ledger=False) as k:
        trainer = k.run_pod("trainer", "team-a", annotations=uses("small"))
        main = k.create_container(trainer, "main", envs=TENANT_LIMITS)
        k.start(main)
    first.close()

    view.reachable = False  # the restarted agent cannot read claims yet
    second = store.LedgerStore.open(f"sqlite:///{tmp_path / 'second.db'}")
    try:
        with agent(view, second, containerd, proxy_socket, lost_ledger=True) as k:
            assert sizes(second) == []  # nothing guessed: the rebuild waits
            view.add(slice_claim("team-a", "more", user="helper"))
            helper = k.run_pod("helper", "team-a", annotations=uses("more"))
            with pytest.raises(grpc.RpcError) as waiting:
                k.create_container(helper, "main")
            assert waiting.value.code() == grpc.StatusCode.UNAVAILABLE  # kubelet retries
            assert "not reconciled" in (waiting.value.details() or "")
            view.reachable = True
            # The rebuild writes a row as the hook does, started then created (its container id): wait for both.
            wait_for("the row rebuilt with its claim's size", lambda: all(row[0] for row in sizes(second))
                     and sizes(second), timeout=30)  # fmt: skip
            assert sizes(second) == [(main, "small", (CARDS[0].uuid,), 30, 10240)]
            k.remove_pod(helper)
            k.remove_pod(trainer)
    finally:
        second.close()
