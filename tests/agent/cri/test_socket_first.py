"""The agent serves kubelet's socket before anything that can fail on the node (issue 15, Deliver 5).

`python -m elasticgpu.agent run` as a real process in front of the real containerd, started with a
corrupt ledger file, no device description (the simulated backend's NVML), and an API server it cannot
reach (a relay that refuses connections): pods without a claim start through its socket at once, a
claim container is refused (UNAVAILABLE, kubelet retries) with what is not ready. Once the description
is written and the API server reachable, claims work. A ledger corrupted under a running claim
container is set aside and rebuilt from the runtime's containers: the claim stays held.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
import yaml

from elasticgpu.agent.discovery import simulated
from elasticgpu.agent.ledger import store
from elasticgpu.api import names
from tests.agent.conftest import wait_for
from tests.agent.cri.kubelet import Kubelet, Pod
from tests.agent.cri.test_agent_run import (
    AgentProcess,
    agent_factory,
    bound_pod,
    create_as_kubelet,
    rows,
    serving,
    wait_until_serving,
    world_gpus,
)
from tests.containerd_runtime import TestRuntime, sandbox_config
from tests.controller.relay import Relay
from tests.pods.claim_world import World, kube, world
from tests.pods.conftest import pod_update_policies

__all__ = ["agent_factory", "kube", "pod_update_policies", "world", "world_gpus"]  # fixtures

GARBAGE = b"this is not an SQLite database; a disk that lost a sector\n" * 200


def _corrupt(ledger: Path) -> None:
    for leftover in (ledger.with_name(ledger.name + "-wal"), ledger.with_name(ledger.name + "-shm")):
        leftover.unlink(missing_ok=True)
    ledger.write_bytes(GARBAGE)


def test_a_node_without_its_parts_still_runs_pods_without_claims(
    world: World, world_gpus: list[str], containerd: TestRuntime, proxy_socket: Path, tmp_path: Path,
    agent_factory: Callable[..., AgentProcess], relayed_kubeconfig: tuple[Path, Relay],
) -> None:  # fmt: skip
    kubeconfig, relay = relayed_kubeconfig
    node, model = world.node(f"{world.prefix}-a"), f"T{world.prefix}"
    uuid = simulated.simulated_uuid(node, 0)
    world_gpus.append(names.gpu_object_name(uuid))
    ledger_file = tmp_path / "ledger.db"  # where agent_factory points --ledger-url
    _corrupt(ledger_file)
    description = tmp_path / "later.yaml"  # no device description yet: the backend cannot open
    relay.refuse()  # the API server cannot be reached

    started = time.monotonic()
    agent = agent_factory(node, model, "--simulation", str(description), "--kubeconfig", str(kubeconfig),
                          "--api-ready-window-s", "2", "--request-timeout-s", "2",
                          "--watch-timeout-s", "3")  # fmt: skip
    wait_for("the proxy serving", lambda: agent.alive() and serving(proxy_socket), timeout=15)
    with Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
        plain = k.run_pod("plain", world.namespace)
        app = k.create_container(plain, "app", envs={"NVIDIA_VISIBLE_DEVICES": "all"})
        k.start(app)
        assert time.monotonic() - started < 15, "a pod without a claim waited for the agent's parts"
        assert k.env(app)["NVIDIA_VISIBLE_DEVICES"] == "void"

        inline = {names.inline_request_annotation("main"): "gpu-core=30"}
        early = k.run_pod("early", world.namespace, annotations=inline)
        with pytest.raises(grpc.RpcError) as refused:
            k.create_container(early, "main")
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE  # kubelet retries
        details = str(refused.value.details())
        assert "is not ready yet (" in details and "the device backend (simulated)" in details, details
        assert "kubelet retries this container by itself" in details
        k.remove_pod(plain)
        k.remove_pod(early)
    aside = list(tmp_path.glob("ledger.db.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == GARBAGE  # kept, not deleted: evidence
    assert agent.alive()

    # The parts come: the description is written, the API server reachable again. Claims work.
    description.write_text(yaml.safe_dump({"cards": [{"model": model, "memory": "80Gi", "numa": 0}]}))
    relay.accept_again()
    wait_until_serving(world, agent, uuid, proxy_socket)
    pod, claim_name = bound_pod(world, model, uuid)
    config = sandbox_config(name="trainer", namespace=world.namespace, uid=pod["metadata"]["uid"],
                            annotations=pod["metadata"]["annotations"])  # fmt: skip
    with Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
        sandbox = k.runtime.RunPodSandbox(k.pb.RunPodSandboxRequest(config=config), timeout=30).pod_sandbox_id
        running = Pod(id=sandbox, config=config)
        main = create_as_kubelet(k, running, "main")
        k.start(main)
        assert k.env(main)["NVIDIA_VISIBLE_DEVICES"] == uuid

    # The ledger is corrupted under the running claim container: set aside again, rebuilt from the runtime.
    agent.kill()
    _corrupt(ledger_file)
    agent.start()
    wait_for("the proxy serving again", lambda: agent.alive() and serving(proxy_socket), timeout=15)
    url = agent.command[agent.command.index("--ledger-url") + 1]
    wait_for("a second file set aside", lambda: len(list(tmp_path.glob("ledger.db.corrupt-*"))) == 2, timeout=30)
    ledger = wait_for("the new ledger", lambda: _opened(url, agent), timeout=30)
    try:
        wait_for("the claim container's row rebuilt", lambda: rows(ledger) == [("created", main, claim_name)],
                 timeout=30)  # fmt: skip
        (row,) = ledger.open_allocations()
        assert (row.pod_name, row.pod_uid, row.container_name) == ("trainer", pod["metadata"]["uid"], "main")
        assert row.gpu_uuids == (uuid,) and (row.cores, row.memory_mib) == (30, 10240), row
    finally:
        ledger.close()
    with Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
        k.remove_pod(running)

    log = agent.log()
    assert log.count("level=WARNING logger=elasticgpu.agent.ledger.store") == 2, log  # once per corrupt file
    # Each failure logged once, not once per retry.
    assert log.count("the device backend (simulated) cannot be opened (") == 1, log
    assert "Traceback" not in log


def _opened(url: str, agent: AgentProcess) -> store.LedgerStore | None:
    """The agent's ledger, once the agent has made it (opening it first would make a second one)."""
    agent.alive()
    if "the ledger is open" not in agent.log().rsplit("moved to", 1)[-1]:
        return None
    return store.LedgerStore.open(url)
