"""The seam between the CRI hook and the node's RDMA NICs.

    devices(nics)   pure: the CDI device names a claim's container gets for its NICs; raises
                    `MissingNic` (naming the NIC and what to check) when the node does not have one

`NodeNics` serves the NICs the agent found (sysfs on a real node, the simulation file otherwise);
`NO_RDMA` is the room of an agent that gives no NICs (the default): a claim without NICs passes,
one with NICs is refused, so a container never starts without what its claim was promised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from elasticgpu.agent.rdma.devices import cdi_name


class MissingNic(Exception):
    """A claim's NIC the node cannot give; the message says which and what to check."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class RdmaRoom(Protocol):
    """What the CRI hook asks of the node's RDMA NICs."""

    def devices(self, nics: Sequence[str]) -> tuple[str, ...]:
        """CDI device names for `nics`; raises `MissingNic`."""
        ...


class NodeNics:
    """The NICs this node has now (`names`: as the GPU objects publish them in spec.nics, read
    at each call: discovery may find or lose one)."""

    def __init__(self, names: Callable[[], Iterable[str]], *, node: str) -> None:
        self._names = names
        self._node = node

    def devices(self, nics: Sequence[str]) -> tuple[str, ...]:
        """CDI names of `nics`, in the claim's order."""
        present = frozenset(self._names())
        missing = [n for n in nics if n not in present]
        if missing:
            have = ", ".join(sorted(present)) or "none"
            raise MissingNic(
                f"RDMA NIC {missing[0]} (the ElasticGPU's spec.physicalGPU.rdmaNics) is not on node {self._node}"
                f" (it has: {have}); check /sys/class/infiniband and the NIC's driver, then delete the claim's pod"
                " to bind again")
        return tuple(cdi_name(n) for n in nics)


class _NoRdma:
    def devices(self, nics: Sequence[str]) -> tuple[str, ...]:
        if nics:
            raise MissingNic(
                f"the claim has RDMA NICs ({', '.join(nics)}) but this node's elasticgpu agent gives none (no"
                " NIC found under its cards' PCIe roots); check /sys/class/infiniband on the node")
        return ()


NO_RDMA: RdmaRoom = _NoRdma()
