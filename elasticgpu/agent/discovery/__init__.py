"""Discovery of the node's cards: one interface, two backends (NVML and simulated).

`open_backend` is the one place that picks a backend; the rest of the agent sees only
`DiscoveryBackend` and the values in `models`.
"""

from __future__ import annotations

from pathlib import Path

from elasticgpu.agent import errors
from elasticgpu.agent.discovery.backend import DiscoveryBackend
from elasticgpu.agent.discovery.models import (
    APPLICATION_XIDS,
    Card,
    CardReset,
    DriverInfo,
    ProcessUsage,
    Snapshot,
    XidEvent,
)

BACKENDS = ("nvml", "simulated")


def open_backend(
    name: str,
    *,
    node_name: str,
    simulation_file: str | Path | None = None,
    device_dir: str | Path = "/run/elasticgpu/devices",
    inject_dir: str | Path | None = None,
) -> DiscoveryBackend:
    """The backend `name` ("nvml" or "simulated"), opened; raises an `AgentError` subclass that says what to fix."""
    if name == "nvml":
        from elasticgpu.agent.discovery.nvml import NvmlBackend  # imports NVML only when asked for

        return NvmlBackend.open()
    if name == "simulated":
        from elasticgpu.agent.discovery.simulated import SimulatedBackend

        if simulation_file is None:
            raise errors.SimulationInvalid(
                "the simulated backend needs a description of its cards: give --simulation FILE"
                " (a YAML file; see `elasticgpu agent run --help`)"
            )
        return SimulatedBackend.from_file(
            simulation_file, node_name=node_name, device_dir=device_dir, inject_dir=inject_dir
        )
    raise errors.DiscoveryError(f"discovery backend {name!r} does not exist; use one of {', '.join(BACKENDS)}")


__all__ = [
    "APPLICATION_XIDS",
    "BACKENDS",
    "Card",
    "CardReset",
    "DiscoveryBackend",
    "DriverInfo",
    "ProcessUsage",
    "Snapshot",
    "XidEvent",
    "open_backend",
]
