"""What discovery reports: plain frozen values, the same for every backend.

Nothing here imports NVML; the backends translate what they see into these values and
everything else in the agent (inventory, usage, health, the CRI hook) reads only these.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from elasticgpu.api import xids

# XIDs caused by the application (illegal address, page fault of one context, ...), not the card:
# NVIDIA's own guidance (and DCGM) treats them as the application's error. Recorded, never fatal.
# The whole table (informational, transient, reset-required) is `xids`.
APPLICATION_XIDS: frozenset[int] = xids.codes(xids.XidKind.APPLICATION)


@dataclass(frozen=True, kw_only=True)
class Card:
    """One physical card of this node."""

    index: int
    """NVML index of the card on its node."""
    uuid: str
    """Card uuid as NVML spells it (`GPU-8f6b...`)."""
    model: str
    """Product name, e.g. `NVIDIA A100-SXM4-80GB`."""
    memory_mib: int
    """Total memory in MiB."""
    minor: int
    """Minor number of the card's device node: the card is `/dev/nvidia<minor>` on the host."""
    device_path: str
    """Path of the card's device node to hand to a container: `/dev/nvidia<minor>`, or the
    simulated backend's stand-in character device (which points at /dev/null's major/minor)."""
    numa: int | None = None
    """NUMA node of the card (from its PCI bus id through /sys); None when unknown."""
    pci_bus_id: str = ""
    """PCI bus id in sysfs form (`0000:07:00.0`); empty in simulation when not given."""
    mig_enabled: bool = False
    """True when MIG mode is enabled (current mode, not pending)."""
    links: tuple[str, ...] = ()
    """Uuids of the cards of this node linked to this one by NVLink, sorted, without duplicates."""
    pcie_root: str = ""
    """PCI bus id of the root port above the card (sysfs, `pci.py`); empty when unknown."""
    nics: tuple[str, ...] = ()
    """RDMA NICs (ibverbs names, e.g. mlx5_0) under the card's PCIe root, sorted."""


@dataclass(frozen=True, kw_only=True)
class DriverInfo:
    """Versions of the driver stack (empty strings when unknown)."""

    driver_version: str = ""
    """Kernel driver version, e.g. `550.54.15`."""
    cuda_version: str = ""
    """Highest CUDA version the driver supports, e.g. `12.4`."""


@dataclass(frozen=True, kw_only=True)
class ProcessUsage:
    """What one process uses on one card, as measured now."""

    gpu_uuid: str
    """Card the process runs on."""
    pid: int
    """Process id in the host's (the agent's) pid namespace."""
    memory_mib: int
    """Device memory the process holds, MiB."""
    sm_percent: int | None = None
    """Share of the card's SM time the process used over the last sample, percent; None when NVML
    has no sample for it yet."""


@dataclass(frozen=True, kw_only=True)
class XidEvent:
    """One XID error reported by the driver for one card."""

    gpu_uuid: str
    """Card that reported it."""
    xid: int
    """The XID code (e.g. 79: the card fell off the bus)."""
    timestamp: float
    """time.time() when the agent saw it."""
    message: str = ""
    """Extra text (the simulated backend's note; empty from NVML)."""

    @property
    def kind(self) -> xids.XidKind:
        """What the XID means for the card (the table in `xids`)."""
        return xids.classify(self.xid).kind

    @property
    def fatal(self) -> bool:
        """True when the XID fails the card (transient or reset-required), not only one application."""
        return self.kind in (xids.XidKind.TRANSIENT, xids.XidKind.RESET)


@dataclass(frozen=True, kw_only=True)
class CardReset:
    """Evidence that a card was reset (or re-enumerated) after an XID that needed it."""

    gpu_uuid: str
    """The card."""
    timestamp: float
    """time.time() when the backend saw the evidence."""
    how: str
    """What the evidence was, for people (`re-enumerated`, `recovery action cleared`, `simulated reset`)."""


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """The cards of the node at one moment, with the versions of the driver."""

    cards: tuple[Card, ...] = ()
    """Every card, ordered by index."""
    driver: DriverInfo = field(default_factory=DriverInfo)
    """Versions of the driver stack."""
