"""The interface every discovery backend implements (NVML, simulated).

The agent's loops call these methods from one thread each (inventory, usage, health); a backend
must tolerate calls from different threads but never two of the same method at once.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from elasticgpu.agent.discovery import models


class DiscoveryBackend(Protocol):
    """Where the agent learns about the node's cards, their processes and their errors."""

    name: str
    """`nvml` or `simulated`, for logs and metrics."""

    def snapshot(self) -> models.Snapshot:
        """The cards present now, and the driver's versions. A card that stopped answering is left out."""
        ...

    def process_usage(self) -> list[models.ProcessUsage]:
        """Memory and SM use of every process on every card, now."""
        ...

    def wait_xid_events(self, timeout_s: float) -> list[models.XidEvent]:
        """XID events since the last call, waiting at most `timeout_s` seconds for the first."""
        ...

    def card_resets(self, waiting: Collection[str]) -> list[models.CardReset]:
        """Cards among `waiting` (uuids that await a reset after an XID) that were reset since the last call.

        Called from the health loop after each XID wait, without blocking. A card is reset when the
        backend has evidence of it (re-enumerated, a pending recovery action or row remap cleared);
        without evidence a card stays in `waiting`.
        """
        ...

    def control_device_paths(self) -> list[str]:
        """Device nodes every GPU container needs besides its cards (`/dev/nvidiactl`, `/dev/nvidia-uvm`, ...)."""
        ...

    def rdma_device_nodes(self, nic: str) -> list[tuple[str, str]]:
        """The device nodes a container needs for RDMA NIC `nic` (issue 27), as (path in the container,
        path on the node): its uverbs node and rdma_cm; [] when the NIC has none."""
        ...

    def driver_root(self) -> str | None:
        """Where the driver's user-space files are on the node (the simulated backend's stand-in),
        or None: the agent's `--driver-root` setting says."""
        ...

    def close(self) -> None:
        """Release what the backend holds (NVML handle, event set)."""
        ...
