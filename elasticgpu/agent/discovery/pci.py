"""PCIe topology from sysfs: the root port above a device, and the RDMA NICs under each root.

The kernel's device tree spells the path from the host bridge down:
`/sys/devices/pci0000:00/0000:00:01.0/0000:05:00.0/0000:07:00.0`. The component right under the
host bridge (`0000:00:01.0`) is the root port (or, with no port between, the device itself);
cards and NICs that share it exchange data without crossing the CPU's interconnect, which is
what GPUDirect RDMA wants. A device whose path cannot be read has no root ("").
"""

from __future__ import annotations

import re
from pathlib import Path

_HOST_BRIDGE = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")


def root_of_path(device: Path) -> str:
    """The root port of a resolved sysfs device path, "" when none is in it."""
    parts = device.parts
    for i, part in enumerate(parts[:-1]):
        if _HOST_BRIDGE.match(part):
            return parts[i + 1]
    return ""


def pcie_root_of(bus_id: str, sysfs_root: Path = Path("/sys")) -> str:
    """The PCIe root port above a PCI device (`0000:07:00.0`), "" when unknown."""
    if not bus_id:
        return ""
    try:
        return root_of_path((sysfs_root / "bus/pci/devices" / bus_id).resolve(strict=True))
    except OSError:
        return ""


def rdma_nics_by_root(sysfs_root: Path = Path("/sys")) -> dict[str, tuple[str, ...]]:
    """The RDMA devices of `/sys/class/infiniband` (mlx5_0, ...) by the PCIe root they sit
    under, sorted; a device not on PCI (soft RoCE) is left out."""
    found: dict[str, list[str]] = {}
    base = sysfs_root / "class/infiniband"
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return {}
    for entry in entries:
        try:
            root = root_of_path((entry / "device").resolve(strict=True))
        except OSError:
            continue
        if root:
            found.setdefault(root, []).append(entry.name)
    return {root: tuple(sorted(nics)) for root, nics in found.items()}


def verbs_devices(nic: str, sysfs_root: Path = Path("/sys")) -> tuple[str, ...]:
    """The character devices a container needs for RDMA NIC `nic`: its uverbs node (found
    through `/sys/class/infiniband/<nic>/device/infiniband_verbs/`) and the shared
    `rdma_cm`, as /dev paths; () when the NIC has no verbs device."""
    try:
        verbs = sorted(p.name for p in (sysfs_root / "class/infiniband" / nic / "device/infiniband_verbs").iterdir())
    except OSError:
        return ()
    return (*(f"/dev/infiniband/{v}" for v in verbs), "/dev/infiniband/rdma_cm")
