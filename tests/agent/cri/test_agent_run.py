"""`python -m elasticgpu.agent run` as a real process, with its CRI proxy in front of the real containerd and
its view read from the real API server; the test acts as kubelet (and runs the controller).

The agent publishes its simulated card and writes the CDI spec; the controller binds a pod's inline claim to
the card and lifts the gate; through the agent's socket the claim's container gets its card (env and device
node), the sidecar `void`; the ledger records it. kill -9 of the agent: the socket is dead, a container is
removed meanwhile directly on the runtime; the restarted agent's proxy serves again and its reconciliation
releases the gone container's row, so the claim is given again to the next container.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from elasticgpu.agent.discovery import simulated
from elasticgpu.agent.injecting import cdi
from elasticgpu.agent.ledger import store
from elasticgpu.api import errors, names, pod_claims
from tests import spawning
from tests.agent.conftest import wait_for
from tests.agent.cri.kubelet import Kubelet, Pod
from tests.agent.notify_listener import Listener, drain
from tests.binding import objects as o
from tests.containerd_runtime import REPO_ROOT, TestRuntime, sandbox_config
from tests.controller.relay import Relay
from tests.kube_cluster import TestCluster
from tests.pods.claim_world import World, controller_for, kube, settle, world
from tests.pods.conftest import pod_update_policies

__all__ = ["kube", "pod_update_policies", "world"]  # fixtures


class AgentProcess:
    """`python -m elasticgpu.agent run` with the simulated backend and the CRI proxy, restartable."""

    def __init__(self, command: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.command, self.log_path = command, log
        self.env = {**os.environ, **env} if env else None
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("a") as log:
            self.process = spawning.spawn(self.command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                                          env=self.env)  # fmt: skip

    def alive(self) -> bool:
        assert self.process is not None and self.process.poll() is None, self.log()
        return True

    def log(self) -> str:
        return self.log_path.read_text()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(15)


@pytest.fixture
def agent_factory(kube_cluster: TestCluster, containerd: TestRuntime, proxy_socket: Path,
                  tmp_path: Path) -> Iterator[Callable[..., AgentProcess]]:  # fmt: skip
    made: list[AgentProcess] = []

    def make(node: str, model: str, *extra: str, env: dict[str, str] | None = None,
             card: dict[str, Any] | None = None) -> AgentProcess:
        description = {"cards": [{"model": model, "memory": "80Gi", "numa": 0, **(card or {})}]}
        (tmp_path / "sim.yaml").write_text(yaml.safe_dump(description))
        command = [
            sys.executable, "-m", "elasticgpu.agent", "run", "--log-level", "debug", "--node-name", node,
            "--backend", "simulated", "--simulation", str(tmp_path / "sim.yaml"),
            "--device-dir", str(containerd.directory / "simdev"), "--kubeconfig", str(kube_cluster.kubeconfig),
            "--ledger-url", f"sqlite:///{tmp_path / 'ledger.db'}", "--metrics-port", "0",
            "--heartbeat-interval-s", "2", "--rediscover-interval-s", "0.5",
            "--cri-listen", str(proxy_socket), "--cri-upstream", str(containerd.socket),
            "--cdi-dir", str(containerd.cdi_dir), "--limits-dir", str(tmp_path / "limits"), *extra,
        ]  # fmt: skip
        agent = AgentProcess(command, tmp_path / "agent.log", env)
        made.append(agent)
        agent.start()
        return agent

    yield make
    for agent in made:
        agent.kill()
    # A killed agent leaves the tmpfs mounts of its isolation folders (MPS /dev/shm, HAMi-core caches): as on a
    # node, its next start would take them up; here the test's folder goes.
    points = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for point in reversed([p for p in points if p.startswith(f"{tmp_path}/")]):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True, timeout=30)


@pytest.fixture
def world_gpus(world: World) -> Iterator[list[str]]:
    """GPU objects the agent publishes (named by uuid, not by the world's prefix): deleted after the test."""
    published: list[str] = []
    yield published
    for name in published:
        with contextlib.suppress(Exception):
            world.kube.delete_gpu(name)


def serving(socket: Path) -> bool:
    """True once a CRI call through the proxy's socket is answered (by the runtime behind it)."""
    with Kubelet(f"unix://{socket}", "") as k:
        try:
            k.runtime.Version(k.pb.VersionRequest(), timeout=2)
        except grpc.RpcError:
            return False
    return True


def create_as_kubelet(k: Kubelet, pod: Pod, name: str, **kwargs: Any) -> str:
    """CreateContainer, retried as kubelet retries while the agent says it is not ready yet (UNAVAILABLE)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return k.create_container(pod, name, **kwargs)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def wait_until_serving(world: World, agent: AgentProcess, uuid: str, socket: Path) -> None:
    """The agent published its card and its proxy answers."""

    def published() -> dict[str, Any] | None:
        agent.alive()
        try:
            return world.kube.get_gpu(names.gpu_object_name(uuid))
        except errors.NotFound:
            return None

    wait_for("the GPU object", published, timeout=60)
    wait_for("the proxy serving", lambda: agent.alive() and serving(socket), timeout=30)


def bound_pod(world: World, model: str, uuid: str) -> tuple[dict[str, Any], str]:
    """A pod `trainer` with an inline claim for container `main`, gated as the webhook leaves it; the
    controller binds the claim to the agent's card and lifts the gate. Returns the pod and the claim's name."""
    world.klass(o.klass(f"{world.prefix}-now", parameters={"gpuModel": model}))
    world.pod("trainer", inline={"main": f"gpu-core=30,gpu-memory=10Gi,class={world.prefix}-now"})
    controller = controller_for(world)
    wait_for("the claim bound and the gate lifted", lambda: (settle(controller), names.SCHEDULING_GATE not in [
        g["name"] for g in world.get_pod("trainer")["spec"].get("schedulingGates") or []])[1])  # fmt: skip
    claim_name = pod_claims.inline_claim_name("trainer", "main")
    assert world.get_claim(claim_name)["status"]["gpus"] == [uuid]
    return world.get_pod("trainer"), claim_name


def rows(ledger: store.LedgerStore) -> list[tuple[str, str | None, str]]:
    return [(a.state, a.container_id, a.claim_name) for a in ledger.open_allocations()]


@pytest.mark.parametrize("front", ["none", "nginx"])
def test_agent_run_injects_through_its_proxy_and_reconciles_after_kill_9(
    world: World, world_gpus: list[str], containerd: TestRuntime, proxy_socket: Path,
    agent_factory: Callable[..., AgentProcess], front: str,
) -> None:  # fmt: skip
    """With --cri-front none the proxy serves kubelet's socket; with nginx, nginx does (cri/front.py) and
    sends only the proxy's methods through it: the same calls, the same results, the same crash repair."""
    node, model = world.node(f"{world.prefix}-a"), f"T{world.prefix}"
    uuid = simulated.simulated_uuid(node, 0)
    world_gpus.append(names.gpu_object_name(uuid))
    front_args = ["--cri-front", front]
    if front == "nginx":
        if containerd.nginx is None:
            pytest.skip("the test runtime was built before it had nginx: run `bash testruntime/build.sh`")
        front_args += ["--cri-nginx", str(containerd.nginx), "--cri-front-dir", f"{proxy_socket}.d"]
    agent = agent_factory(node, model, *front_args)

    # The agent publishes its card, writes the CDI spec and serves the socket (mode 0600).
    wait_until_serving(world, agent, uuid, proxy_socket)
    assert stat.S_IMODE(os.stat(proxy_socket).st_mode) == 0o600
    spec = wait_for("the CDI spec", lambda: (containerd.cdi_dir / cdi.SPEC_FILE).exists())
    assert spec and uuid in (containerd.cdi_dir / cdi.SPEC_FILE).read_text()

    pod, claim_name = bound_pod(world, model, uuid)

    ledger = store.LedgerStore.open(agent.command[agent.command.index("--ledger-url") + 1])
    try:
        with Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
            config = sandbox_config(name="trainer", namespace=world.namespace, uid=pod["metadata"]["uid"],
                                    annotations=pod["metadata"]["annotations"])  # fmt: skip
            sandbox = k.runtime.RunPodSandbox(k.pb.RunPodSandboxRequest(config=config), timeout=30).pod_sandbox_id
            running = Pod(id=sandbox, config=config)
            main = create_as_kubelet(k, running, "main", envs={"NVIDIA_VISIBLE_DEVICES": "all"})
            side = create_as_kubelet(k, running, "side", envs={"NVIDIA_VISIBLE_DEVICES": "all"})
            for container_id in (main, side):
                k.start(container_id)
            env = k.env(main)
            assert env["NVIDIA_VISIBLE_DEVICES"] == uuid
            assert env["CUDA_DEVICE_SM_LIMIT"] == "30" and env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "10240m"
            assert k.exec(main, "sh", "-c", "test -c /dev/nvidia0 && test -c /dev/nvidiactl")[0] == 0
            assert k.env(side)["NVIDIA_VISIBLE_DEVICES"] == "void"
            assert k.exec(side, "sh", "-c", "test -e /dev/nvidia0")[0] != 0
            wait_for("the ledger row created", lambda: rows(ledger) == [("created", main, claim_name)])
            # Issue 17: the claim's limits file is mounted, and the agent reports the size it says as applied.
            code, out = k.exec(main, "cat", "/run/elasticgpu/limits.json")
            assert code == 0 and (json.loads(out)["cores"], json.loads(out)["memoryMiB"]) == (30, 10240), out
            wait_for("applied in the card's runningClaims", lambda: [c.get("applied") for c in (world.kube.get_gpu(
                names.gpu_object_name(uuid)).get("status") or {}).get("runningClaims") or []] == [
                {"cores": 30, "memory": 10240}])  # fmt: skip

        # kill -9: kubelet's socket answers nothing. Meanwhile the claim's container goes, directly on the
        # runtime (an operator's crictl rm, or kubelet pointed back at containerd).
        agent.kill()
        assert not serving(proxy_socket)
        with Kubelet(containerd.endpoint, containerd.image) as direct:
            direct.remove_container(main)

        # Restarted: the proxy serves again, and its start-up reconciliation releases the gone container's row.
        agent.start()
        wait_for("the proxy serving again", lambda: agent.alive() and serving(proxy_socket), timeout=30)
        wait_for("the gone container's row released", lambda: rows(ledger) == [])
        released = ledger.allocation_for_container(main)
        assert released is not None and released.state == "released"

        with Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
            again = create_as_kubelet(k, running, "main")  # kubelet recreates the container: the claim is free
            k.start(again)
            assert k.env(again)["NVIDIA_VISIBLE_DEVICES"] == uuid
            wait_for("the new row created", lambda: rows(ledger) == [("created", again, claim_name)])
            k.remove_pod(running)
        wait_for("the ledger released after the pod", lambda: rows(ledger) == [])
    finally:
        ledger.close()

    # SIGTERM: the agent stops cleanly and takes its socket with it.
    assert agent.process is not None
    agent.process.send_signal(signal.SIGTERM)
    assert agent.process.wait(30) == 0, agent.log()
    assert not proxy_socket.exists()
    assert "Traceback" not in agent.log()
    assert f"CRI front: {front}" in agent.log()


def test_without_the_api_server_only_claim_containers_wait(
    world: World, world_gpus: list[str], containerd: TestRuntime, proxy_socket: Path,
    agent_factory: Callable[..., AgentProcess], relayed_kubeconfig: tuple[Path, Relay],
) -> None:  # fmt: skip
    kubeconfig, relay = relayed_kubeconfig
    node, model = world.node(f"{world.prefix}-a"), f"T{world.prefix}"
    uuid = simulated.simulated_uuid(node, 0)
    world_gpus.append(names.gpu_object_name(uuid))
    agent = agent_factory(node, model, "--kubeconfig", str(kubeconfig), "--api-ready-window-s", "2",
                          "--request-timeout-s", "2", "--watch-timeout-s", "3")  # fmt: skip
    wait_until_serving(world, agent, uuid, proxy_socket)
    pod, _ = bound_pod(world, model, uuid)  # the controller reaches the API server directly

    relay.refuse()  # the agent's API server is gone
    time.sleep(3)  # longer than --api-ready-window-s
    with Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
        config = sandbox_config(name="trainer", namespace=world.namespace, uid=pod["metadata"]["uid"],
                                annotations=pod["metadata"]["annotations"])  # fmt: skip
        sandbox = k.runtime.RunPodSandbox(k.pb.RunPodSandboxRequest(config=config), timeout=30).pod_sandbox_id
        running = Pod(id=sandbox, config=config)
        with pytest.raises(grpc.RpcError) as refused:
            k.create_container(running, "main")
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE  # kubelet retries
        assert "is not ready yet (the API server has not answered it for" in str(refused.value.details())
        assert "kubelet retries this container by itself" in str(refused.value.details())
        side = k.create_container(running, "side", envs={"NVIDIA_VISIBLE_DEVICES": "all"})  # no claim: starts
        k.start(side)
        assert k.env(side)["NVIDIA_VISIBLE_DEVICES"] == "void"

        relay.accept_again()  # back: kubelet's next retry gets the card
        main = create_as_kubelet(k, running, "main")
        k.start(main)
        assert k.env(main)["NVIDIA_VISIBLE_DEVICES"] == uuid
        k.remove_pod(running)
    assert agent.alive() and "Traceback" not in agent.log()


def test_under_systemd_ready_means_kubelet_s_socket_serves_and_the_watchdog_hears_from_it(
    world: World, world_gpus: list[str], containerd: TestRuntime, proxy_socket: Path,
    agent_factory: Callable[..., AgentProcess],
) -> None:  # fmt: skip
    """deploy/elasticgpu-agent.service is Type=notify with a watchdog, Before=kubelet: kubelet starts once
    the agent says READY=1, so READY=1 must mean that kubelet's socket answers."""
    node, model = world.node(f"{world.prefix}-a"), f"T{world.prefix}"
    world_gpus.append(names.gpu_object_name(simulated.simulated_uuid(node, 0)))
    listener = Listener(f"@elasticgpu-agent-test-{os.getpid()}-{time.monotonic_ns()}")  # abstract: no path limit
    try:
        agent = agent_factory(node, model, env={"NOTIFY_SOCKET": listener.address, "WATCHDOG_USEC": "1000000"})
        listener.until("READY", timeout_s=60)
        assert serving(proxy_socket), agent.log()
        pings = [f for f in drain(listener, 3.0) if f.get("WATCHDOG") == "1"]
        assert len(pings) >= 3, pings  # every half second while every loop runs
        assert agent.process is not None
        agent.process.send_signal(signal.SIGTERM)
        assert listener.until("STOPPING", timeout_s=30)[-1]["STOPPING"] == "1"
        assert agent.process.wait(30) == 0, agent.log()
    finally:
        listener.sock.close()
    assert "Traceback" not in agent.log()
