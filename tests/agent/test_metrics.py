"""The agent's /metrics endpoint, scraped over HTTP from a running agent."""

from __future__ import annotations

from collections.abc import Callable

from kubernetes import client

from elasticgpu.agent.discovery import simulated
from tests.agent.conftest import RunningAgent, free_port, scrape, wait_for

MIB = 1024 * 1024


def test_card_metrics_in_base_units(
    api_client: client.ApiClient, node_name: str, start_agent: Callable[..., RunningAgent]
) -> None:
    port = free_port()
    description = {"cards": [{"model": "NVIDIA A100-SXM4-80GB", "memory": "80Gi", "count": 2}]}
    agent = start_agent(node_name, description, "--metrics-port", str(port), "--metrics-address", "127.0.0.1",
                        "--sample-interval-s", "0.3")
    card0, card1 = (simulated.simulated_uuid(node_name, i) for i in range(2))

    def on(uuid: str, *more: tuple[str, str]) -> tuple[tuple[str, str], ...]:
        """The sorted labels of a card's metric: every one names its node (one agent per node)."""
        return tuple(sorted([("gpu", uuid), ("node", node_name), *more]))

    def ready() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
        assert agent.process.poll() is None, agent.log()
        try:
            metrics = scrape(port)
        except OSError:
            return None
        wanted = [("elasticgpu_agent_gpu_healthy", on(card1)),
                  ("elasticgpu_agent_gpu_allocated_cores_ratio", on(card0)),  # once its object is seen
                  ("elasticgpu_agent_gpu_memory_used_bytes", on(card0))]  # after the first usage pass
        # Both cards' objects applied (the first scrape may fall between the two applies).
        applied = metrics.get(("elasticgpu_agent_api_writes_total", (("write", "gpu_apply"),)), 0) >= 2
        return metrics if applied and all(key in metrics for key in wanted) else None

    metrics = wait_for("the metrics endpoint", ready, timeout=30)
    key = ("elasticgpu_agent_gpu_memory_total_bytes", (("gpu", card0), ("index", "0"),
                                                       ("model", "NVIDIA A100-SXM4-80GB"), ("node", node_name)))
    assert metrics[key] == 80 * 1024 * MIB
    assert metrics[("elasticgpu_agent_gpu_healthy", on(card0))] == 1.0
    assert metrics[("elasticgpu_agent_gpu_allocated_cores_ratio", on(card0))] == 0.0
    assert metrics[("elasticgpu_agent_gpu_memory_used_bytes", on(card0))] == 0.0
    assert metrics[("elasticgpu_agent_api_writes_total", (("write", "gpu_apply"),))] >= 2
    assert ("elasticgpu_agent_ledger_writes_total", ()) in metrics

    simulated.inject(agent.inject_dir, {"process": {"card": 0, "pid": 1, "memory": "1Gi", "sm": 45}})
    simulated.inject(agent.inject_dir, {"xid": {"card": 1, "code": 79}})
    simulated.inject(agent.inject_dir, {"xid": {"card": 1, "code": 79}})
    metrics = wait_for("XID and usage metrics", lambda: (m := scrape(port)).get(
        ("elasticgpu_agent_gpu_xid_errors_total", on(card1, ("xid", "79")))) == 2 and m.get(
        ("elasticgpu_agent_gpu_memory_used_bytes", on(card0))) == 1024 * MIB and m, timeout=30)
    assert metrics[("elasticgpu_agent_gpu_healthy", on(card1))] == 0.0
    assert metrics[("elasticgpu_agent_gpu_utilization_ratio", on(card0))] == 0.45
    assert metrics[("elasticgpu_agent_ledger_writes_total", ())] > 0  # usage samples
