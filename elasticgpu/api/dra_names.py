"""The names under which the elasticgpu DRA driver publishes cards, and reading them back from a ResourceClaim.

Both sides import these: the driver (in the agent) publishes each DRA card of a node in a
ResourceSlice as driver `gpu.elasticgpu.io`, pool = the node's name, device = `gpu-<index>`;
the controller finds the cards DRA holds from ResourceClaims' `status.allocation.devices.results`
(resource.k8s.io/v1), which name driver, pool and device. Pure: plain dicts in, names out.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any, Final

DRIVER_NAME: Final = "gpu.elasticgpu.io"
"""The DRA driver name (a DNS subdomain of the product's domain), in ResourceSlices, DeviceClasses and claims."""

_DEVICE_PREFIX: Final = "gpu-"
# gpu-<index>, optionally followed by -<anything> (a device the driver may carve out of the card, e.g. a
# MIG instance): every such device belongs to card <index>, so a claim on it holds the card.
_DEVICE = re.compile(r"^gpu-(0|[1-9][0-9]*)(-[a-z0-9-]+)?$")


def pool_name(node_name: str) -> str:
    """The pool of a node's cards: the node's name (one pool per node, as kubelet plugins publish)."""
    return node_name


def device_name(index: int) -> str:
    """The device of a card in its node's pool: `gpu-<NVML index>`."""
    if index < 0:
        raise ValueError(f"a card index is never negative: {index}")
    return f"{_DEVICE_PREFIX}{index}"


def card_index(device: str) -> int | None:
    """The card index a device name of our driver stands for (`gpu-3` and `gpu-3-<part>` -> 3), or None."""
    match = _DEVICE.match(device)
    return int(match.group(1)) if match else None


def allocated_cards(claim: Mapping[str, Any]) -> Iterator[tuple[str, int]]:
    """(pool, card index) of every device of our driver that a ResourceClaim's allocation holds.

    A claim with no `status.allocation` holds nothing; results of other drivers are skipped. Shapes the
    claim's writer (the scheduler, or anyone who may write claim status) got wrong are skipped as well:
    this reads, never trusts, what it is given."""
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
    results = devices.get("results") if isinstance(devices, Mapping) else None
    if not isinstance(results, list):
        return
    for result in results:
        if not isinstance(result, Mapping) or result.get("driver") != DRIVER_NAME:
            continue
        pool, device = result.get("pool"), result.get("device")
        if not isinstance(pool, str) or not isinstance(device, str):
            continue
        index = card_index(device)
        if index is not None:
            yield pool, index
