"""The agent's /healthz, /readyz and /metrics over HTTP from a running agent, and their bind-address flags."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable

import pytest
from kubernetes import client

from elasticgpu.agent.settings import MetricsSettings
from elasticgpu.flags import BindAddress
from tests.agent.conftest import RunningAgent, free_port, wait_for

DESCRIPTION = {"cards": [{"model": "NVIDIA A100-SXM4-80GB", "memory": "80Gi"}]}


def get(port: int, path: str) -> tuple[int, str]:
    """GET a path; (status, body), also for an error status. OSError while nothing listens."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def answered(agent: RunningAgent, port: int, path: str) -> tuple[int, str] | None:
    assert agent.process.poll() is None, agent.log()
    try:
        return get(port, path)
    except OSError:
        return None


def test_probes_and_metrics_on_their_own_addresses_and_404_elsewhere(
    api_client: client.ApiClient, node_name: str, start_agent: Callable[..., RunningAgent]
) -> None:
    metrics_port = free_port()
    probe_port = wait_for("a second free port", lambda: (port := free_port()) != metrics_port and port)
    agent = start_agent(node_name, DESCRIPTION, "--metrics-bind-address", f"127.0.0.1:{metrics_port}",
                        "--health-probe-bind-address", f"127.0.0.1:{probe_port}")  # fmt: skip
    wait_for("/readyz ok", lambda: answered(agent, probe_port, "/readyz") == (200, "ok\n"), timeout=60)
    assert get(probe_port, "/healthz") == (200, "ok\n")
    status, text = get(metrics_port, "/metrics")
    assert status == 200 and "elasticgpu_agent_gpu_memory_total_bytes" in text
    for port, path in ((metrics_port, "/healthz"), (metrics_port, "/readyz"), (probe_port, "/metrics"),
                       (probe_port, "/"), (metrics_port, "/anything")):  # fmt: skip
        status, text = get(port, path)
        assert status == 404 and "404 page not found" in text, (port, path, status, text)


def test_not_ready_while_a_part_is_missing_but_alive_and_the_old_flags_still_work(
    api_client: client.ApiClient, node_name: str, start_agent: Callable[..., RunningAgent], tmp_path: object
) -> None:
    port = free_port()
    agent = start_agent(node_name, DESCRIPTION, "--simulation", "/nonexistent/elasticgpu-sim.yaml",
                        "--metrics-port", str(port), "--metrics-address", "127.0.0.1")  # fmt: skip
    ready = wait_for("/readyz answering", lambda: answered(agent, port, "/readyz"), timeout=60)
    assert ready[0] == 503, ready
    assert "[-]device-backend failed: the device backend (simulated): " in ready[1], ready
    assert "/nonexistent/elasticgpu-sim.yaml" in ready[1]
    assert "[-]loops failed: inventory, health and usage are not started yet" in ready[1]
    assert get(port, "/healthz") == (200, "ok\n")  # alive: a restart would not bring NVML back
    assert get(port, "/metrics")[0] == 200  # the old flags serve all three on one port, as before


@pytest.mark.parametrize(("given", "expected"), [
    ({}, (BindAddress("0.0.0.0", 9410), BindAddress("0.0.0.0", 9410))),
    ({"metrics_port": 0}, (None, None)),
    ({"metrics_bind_address": ":8080"}, (BindAddress("0.0.0.0", 8080), BindAddress("0.0.0.0", 8080))),
    ({"metrics_bind_address": "0", "health_probe_bind_address": "[::1]:8081"}, (None, BindAddress("::1", 8081))),
    ({"metrics_port": 1234, "health_probe_bind_address": "0"}, (BindAddress("0.0.0.0", 1234), None)),
])  # fmt: skip
def test_bind_addresses(given: dict[str, object], expected: tuple[BindAddress | None, BindAddress | None]) -> None:
    assert MetricsSettings(**given).endpoints() == expected  # type: ignore[arg-type]


def test_a_bind_address_that_does_not_parse_names_its_flag() -> None:
    with pytest.raises(ValueError, match=r"--health-probe-bind-address='8081': .* is not host:port"):
        MetricsSettings(health_probe_bind_address="8081").endpoints()
