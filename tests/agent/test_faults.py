"""The agent through a broken network: a refused API server, half-open connections. It never dies, it catches up."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client

from elasticgpu.agent.discovery import simulated
from elasticgpu.api import names
from tests.agent.conftest import RunningAgent, wait_for
from tests.agent.objects import DESCRIPTION, condition, node_gpus
from tests.controller.relay import Relay


def test_agent_survives_a_refused_server_and_half_open_connections(
    api_client: client.ApiClient, node_name: str, start_agent: Callable[..., RunningAgent],
    relayed_kubeconfig: tuple[Path, Relay],
) -> None:
    kubeconfig, relay = relayed_kubeconfig
    agent = start_agent(node_name, DESCRIPTION, "--kubeconfig", str(kubeconfig), "--watch-timeout-s", "3",
                        "--request-timeout-s", "2", "--recovery-quiet-s", "600")
    names_ = [names.gpu_object_name(simulated.simulated_uuid(node_name, i)) for i in range(2)]
    wait_for("GPU objects", lambda: set(node_gpus(api_client, node_name)) == set(names_))

    # The server is gone for a while; an XID happens meanwhile; it is written once the server is back.
    relay.refuse()
    simulated.inject(agent.inject_dir, {"xid": {"card": 0, "code": 79}})
    time.sleep(3)
    assert agent.process.poll() is None, agent.log()
    relay.accept_again()
    wait_for("Unhealthy after the outage", lambda: node_gpus(api_client, node_name)[names_[0]]["status"]
             .get("health") == "Unhealthy", timeout=30)

    # Every open connection goes half-open (no answer, no close): the agent gives them up and goes on.
    relay.silence()
    simulated.inject(agent.inject_dir, {"vanish": {"card": 1}})

    def vanished() -> dict[str, Any] | None:
        found = condition(node_gpus(api_client, node_name)[names_[1]], "Healthy")
        return found if found and found["reason"] == "Vanished" else None

    wait_for("Vanished through fresh connections", vanished, timeout=40)
    agent.process.send_signal(signal.SIGTERM)
    assert agent.process.wait(timeout=30) == 0, agent.log()
    log = agent.log()
    assert "Traceback" not in log and "failed" in log  # the failures were logged, as warnings
