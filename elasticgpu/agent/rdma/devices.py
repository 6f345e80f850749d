"""The CDI spec of this node's RDMA NICs: kind `elasticgpu.io/rdma`, one device per NIC named by
its ibverbs name (mlx5_0), whose edit is its uverbs device node, plus `rdma_cm` for all.

spec_file.py writes it as a second spec file next to the cards' (cri/cdi.py), so the runtime
injects a claim's NICs as it injects its cards."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

CDI_KIND = "elasticgpu.io/rdma"
SPEC_FILE = "elasticgpu-rdma.json"
CDI_VERSION = "0.6.0"


@dataclass(frozen=True, kw_only=True)
class NicDevices:
    """One NIC and the device nodes a container needs for it: (path in the container, path on the node)."""

    name: str
    nodes: tuple[tuple[str, str], ...]


def cdi_name(nic: str) -> str:
    """The CDI name of a NIC: `elasticgpu.io/rdma=mlx5_0`."""
    return f"{CDI_KIND}={nic}"


def is_ours(device: str) -> bool:
    """True for a CDI device name of the RDMA kind (stripped from a spec before injection)."""
    return device.split("=", 1)[0] == CDI_KIND


def build_spec(nics: Iterable[NicDevices]) -> dict[str, Any]:
    """The CDI spec document for `nics` (sorted by name, so equal inputs give equal files)."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": [
            {"name": nic.name, "containerEdits": {"deviceNodes": [
                {"path": path, "hostPath": host} for path, host in nic.nodes]}}
            for nic in sorted(nics, key=lambda n: n.name)
        ],
    }
