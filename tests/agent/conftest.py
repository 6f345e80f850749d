"""Agent fixtures: a Node object for the agent and the agent itself as a real subprocess."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.controller.relay import Relay, kubeconfig_through
from tests.kube_cluster import TestCluster

REPO = Path(__file__).resolve().parents[2]


def wait_for(what: str, check: Callable[[], Any], *, timeout: float = 30.0, interval: float = 0.1) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; last value: {last!r}")


@pytest.fixture
def node_name(api_client: client.ApiClient) -> Iterator[str]:
    """A Node object with a fresh name, deleted after the test."""
    core = client.CoreV1Api(api_client)
    name = f"agent-node-{uuid.uuid4().hex[:8]}"
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name, labels={"elasticgpu-test": "1"})))
    yield name
    try:
        core.delete_node(name)
    except ApiException as e:
        if e.status != 404:
            raise


@dataclass
class RunningAgent:
    """An `elasticgpu agent run` subprocess with the simulated backend."""

    process: subprocess.Popen[str]
    node_name: str
    inject_dir: Path
    log_path: Path
    ledger_url: str

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""


@pytest.fixture
def start_agent(
    kube_cluster: TestCluster, crds_installed: list[str], tmp_path: Path
) -> Iterator[Callable[..., RunningAgent]]:
    """Starts agents (subprocesses) for a node with a simulated description; stops them after the test."""
    started: list[RunningAgent] = []

    def start(node: str, description: dict[str, Any], *extra: str) -> RunningAgent:
        directory = tmp_path / f"agent-{len(started)}"
        directory.mkdir()
        simulation = directory / "sim.yaml"
        simulation.write_text(yaml.safe_dump(description))
        log_path = directory / "agent.log"
        ledger_url = f"sqlite:///{directory / 'ledger.db'}"
        command = [
            sys.executable, "-m", "elasticgpu", "agent", "run", "--log-level", "debug",
            "--backend", "simulated", "--simulation", str(simulation), "--device-dir", str(directory / "dev"),
            "--inject-dir", str(directory / "inject"), "--node-name", node,
            "--kubeconfig", str(kube_cluster.kubeconfig),
            "--ledger-url", ledger_url, "--heartbeat-interval-s", "2", "--rediscover-interval-s", "0.3",
            "--metrics-port", "0", "--cri-proxy", "false", *extra,  # a later --cri-proxy true wins
        ]
        with log_path.open("w") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True, cwd=REPO)
        agent = RunningAgent(process, node, directory / "inject", log_path, ledger_url)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        if agent.process.poll() is None:
            agent.process.terminate()
            try:
                agent.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                agent.process.kill()
                agent.process.wait(timeout=15)


def free_port() -> int:
    """A TCP port free on loopback now."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """GET /metrics over HTTP and parse it: (name, sorted labels) -> value."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.fixture
def relayed_kubeconfig(kube_cluster: TestCluster, tmp_path: Path) -> Iterator[tuple[Path, Relay]]:
    """A kubeconfig that reaches the API server through a TCP relay the test can break."""
    path, relay = kubeconfig_through(Relay, kube_cluster.kubeconfig, tmp_path / "relayed-kubeconfig")
    try:
        yield path, relay
    finally:
        relay.close()
