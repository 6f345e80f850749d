"""`python -m elasticgpu.agent run --node-hook nri` as a real process on containerd 1.7 with NRI switched on
(issue 34): the simulated card, the local test API server, the test as kubelet talking to containerd's own
socket (no proxy in kubelet's path) and as the controller.

- /readyz says `nri-plugin` failed while the agent's plugin is not registered with the runtime (here: an
  NRI socket where nothing listens), and is ready once it is;
- a slice claim's container gets its card (env, device node), its sidecar `void`; the ledger row is
  `created`;
- the private CRI socket (the agent's own channel to the runtime) vanishes: the proxy restarts with new
  claim hooks, and the NRI front follows them (a removal and a creation still reach the ledger, /readyz
  is ready again);
- kill -9 of the agent, its ledger corrupted meanwhile: the restarted agent sets it aside and rebuilds it
  from the containers of the plugin's synchronize; the claim stays held, and a removal releases it.
"""

from __future__ import annotations

import socket
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from elasticgpu.agent.discovery import simulated
from elasticgpu.agent.ledger import store
from elasticgpu.api import names
from tests.agent.conftest import wait_for
from tests.agent.cri.kubelet import Kubelet, Pod
from tests.agent.cri.test_agent_run import AgentProcess, bound_pod, create_as_kubelet, rows, world_gpus
from tests.containerd_runtime import TestRuntime, sandbox_config
from tests.kube_cluster import TestCluster
from tests.pods.claim_world import World, kube, world
from tests.pods.conftest import pod_update_policies

__all__ = ["kube", "pod_update_policies", "world", "world_gpus"]  # fixtures

pytestmark = pytest.mark.timeout(300)
GARBAGE = b"this is not an SQLite database; a disk that lost a sector\n" * 200


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def readyz(port: int) -> tuple[int, str]:
    """(status, body) of the agent's /readyz; (0, why) while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=3) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return 0, str(e)


class NriAgent(AgentProcess):
    """The agent in NRI mode, restartable with another NRI socket."""

    def __init__(self, command: list[str], log: Path, port: int) -> None:
        super().__init__(command, log)
        self.port = port

    def use_nri_socket(self, path: Path) -> None:
        self.command[self.command.index("--nri-socket") + 1] = str(path)

    def failing(self) -> set[str]:
        """The names of the readiness checks that fail now (empty: ready)."""
        self.alive()
        status, body = readyz(self.port)
        if status == 0:
            return {"(no answer)"}
        return {line.split(" failed:")[0].removeprefix("[-]") for line in body.splitlines() if line.startswith("[-]")}


@pytest.fixture
def nri_agent(kube_cluster: TestCluster, nri_containerd: TestRuntime, nri_plugin: str,
              tmp_path: Path) -> Iterator[Callable[[str, str], NriAgent]]:  # fmt: skip
    made: list[NriAgent] = []
    sockets = nri_containerd.directory / f"agent-{uuid.uuid4().hex[:6]}"  # a socket path stays under 108 bytes

    def make(node: str, model: str) -> NriAgent:
        (tmp_path / "sim.yaml").write_text(yaml.safe_dump({"cards": [{"model": model, "memory": "80Gi", "numa": 0}]}))
        port = _free_port()
        command = [
            sys.executable, "-m", "elasticgpu.agent", "run", "--log-level", "debug", "--node-name", node,
            "--backend", "simulated", "--simulation", str(tmp_path / "sim.yaml"),
            "--device-dir", str(nri_containerd.directory / "simdev"), "--kubeconfig", str(kube_cluster.kubeconfig),
            "--ledger-url", f"sqlite:///{tmp_path / 'ledger.db'}", "--metrics-port", "0",
            "--health-probe-bind-address", f"127.0.0.1:{port}",
            "--heartbeat-interval-s", "2", "--rediscover-interval-s", "0.5",
            "--node-hook", "nri", "--nri-socket", str(nri_containerd.nri_socket), "--nri-plugin", nri_plugin,
            "--nri-agent-socket", str(sockets / "nri-agent.sock"), "--cri-front", "none",
            "--cri-front-dir", str(sockets / "front"), "--cri-upstream", str(nri_containerd.socket),
            "--cdi-dir", str(nri_containerd.cdi_dir), "--limits-dir", str(tmp_path / "limits"),
        ]  # fmt: skip
        agent = NriAgent(command, tmp_path / "agent.log", port)
        made.append(agent)
        return agent

    yield make
    for agent in made:
        agent.kill()


def test_agent_run_in_nri_mode(world: World, world_gpus: list[str], nri_containerd: TestRuntime,
                               nri_agent: Callable[[str, str], NriAgent], tmp_path: Path) -> None:  # fmt: skip
    node, model = world.node(f"{world.prefix}-a"), f"T{world.prefix}"
    card = simulated.simulated_uuid(node, 0)
    world_gpus.append(names.gpu_object_name(card))
    agent = nri_agent(node, model)
    assert nri_containerd.nri_socket is not None

    # No NRI plugin registered (nothing listens on its socket): everything else ready, /readyz is not.
    agent.use_nri_socket(tmp_path / "no-nri.sock")
    agent.start()
    wait_for("the agent's parts ready, its NRI plugin not registered",
             lambda: agent.failing() & {"(no answer)", "device-backend", "api-server", "loops"} == set()
             and "nri-plugin" in agent.failing(), timeout=60)  # fmt: skip
    time.sleep(1)
    assert "nri-plugin" in agent.failing()
    status, body = readyz(agent.port)
    assert status == 503 and "the NRI plugin is not registered with the runtime" in body, body
    agent.kill()

    # The runtime's NRI socket: ready once the plugin registered (and the ledger settled with its synchronize).
    agent.use_nri_socket(nri_containerd.nri_socket)
    agent.start()
    wait_for("/readyz ok", lambda: agent.failing() == set(), timeout=60)
    pod, claim_name = bound_pod(world, model, card)
    url = agent.command[agent.command.index("--ledger-url") + 1]
    config = sandbox_config(name="trainer", namespace=world.namespace, uid=pod["metadata"]["uid"],
                            annotations=pod["metadata"]["annotations"])  # fmt: skip
    with Kubelet(nri_containerd.endpoint, nri_containerd.image) as k:  # containerd's own socket, as kubelet
        sandbox = k.runtime.RunPodSandbox(k.pb.RunPodSandboxRequest(config=config), timeout=30).pod_sandbox_id
        running = Pod(id=sandbox, config=config)
        main = create_as_kubelet(k, running, "main", envs={"NVIDIA_VISIBLE_DEVICES": "all"})
        side = create_as_kubelet(k, running, "side", envs={"NVIDIA_VISIBLE_DEVICES": "all"})
        for container_id in (main, side):
            k.start(container_id)
        env = k.env(main)
        assert env["NVIDIA_VISIBLE_DEVICES"] == card
        assert env["CUDA_DEVICE_SM_LIMIT"] == "30" and env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "10240m"
        assert k.exec(main, "sh", "-c", "test -c /dev/nvidia0 && test -c /dev/nvidiactl")[0] == 0
        assert k.env(side)["NVIDIA_VISIBLE_DEVICES"] == "void"
        assert k.exec(side, "sh", "-c", "test -e /dev/nvidia0")[0] != 0
        ledger = store.LedgerStore.open(url)
        try:
            wait_for("the ledger row created", lambda: rows(ledger) == [("created", main, claim_name)])
        finally:
            ledger.close()

        # The private CRI socket vanishes: the proxy restarts with new claim hooks; the NRI front follows.
        private = Path(agent.command[agent.command.index("--cri-front-dir") + 1]) / "nri-mode-cri.sock"
        assert private.exists()
        private.unlink()
        wait_for("the proxy restarted", lambda: agent.alive() and private.exists()
                 and "restarting the proxy" in agent.log(), timeout=30)  # fmt: skip
        wait_for("/readyz ok after the restart", lambda: agent.failing() == set(), timeout=30)
        k.remove_container(side)
        k.remove_container(main)
        ledger = store.LedgerStore.open(url)
        try:
            wait_for("the removal released the row (through the new hooks)", lambda: rows(ledger) == [])
            main = create_as_kubelet(k, running, "main")
            k.start(main)
            assert k.env(main)["NVIDIA_VISIBLE_DEVICES"] == card
            wait_for("the new row created", lambda: rows(ledger) == [("created", main, claim_name)])
        finally:
            ledger.close()

        # kill -9; the ledger file is corrupted meanwhile: set aside, rebuilt from the plugin's synchronize.
        agent.kill()
        ledger_file = tmp_path / "ledger.db"
        for leftover in (ledger_file.with_name("ledger.db-wal"), ledger_file.with_name("ledger.db-shm")):
            leftover.unlink(missing_ok=True)
        ledger_file.write_bytes(GARBAGE)
        agent.start()
        wait_for("/readyz ok after kill -9", lambda: agent.failing() == set(), timeout=60)
        assert len(list(tmp_path.glob("ledger.db.corrupt-*"))) == 1
        ledger = store.LedgerStore.open(url)
        try:
            wait_for("the claim container's row rebuilt", lambda: rows(ledger) == [("created", main, claim_name)])
            (row,) = ledger.open_allocations()
            assert row.gpu_uuids == (card,) and (row.cores, row.memory_mib) == (30, 10240), row
            k.remove_pod(running)
            wait_for("released with the pod", lambda: rows(ledger) == [])
        finally:
            ledger.close()

    assert agent.process is not None
    agent.process.terminate()
    assert agent.process.wait(30) == 0, agent.log()
    assert "Traceback" not in agent.log(), agent.log()[-4000:]
