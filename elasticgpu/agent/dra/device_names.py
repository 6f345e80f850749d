"""The DRA names of this product's cards: driver, pool and device (the interface fixed with the
controller side; elasticgpu/api/dra_names.py holds the same when both branches meet).

- driver `gpu.elasticgpu.io`: a DNS subdomain of the product's domain, as ResourceSlice.spec.driver
  requires;
- pool: the node's name (one pool per node, every card of the node in it);
- device: `gpu-<NVML index>` (a DNS label; stable while the card sits in its slot, and what a user
  reads in `kubectl get resourceclaim -o yaml` beside the uuid attribute).
"""

from __future__ import annotations

import re

DRIVER = "gpu.elasticgpu.io"
DEVICE_PREFIX = "gpu-"
_DEVICE = re.compile(r"^gpu-(0|[1-9][0-9]*)$")


def pool_name(node: str) -> str:
    """The pool of `node`'s cards."""
    return node


def device_name(index: int) -> str:
    """The device name of the card with NVML index `index`."""
    if index < 0:
        raise ValueError(f"card index {index} is negative; discovery reported it wrong")
    return f"{DEVICE_PREFIX}{index}"


def device_index(name: str) -> int | None:
    """The card index a device name stands for; None when `name` is not one of ours."""
    match = _DEVICE.match(name)
    return int(match.group(1)) if match else None


def slice_name(node: str) -> str:
    """The name of `node`'s ResourceSlice (one per node: a pool of at most 128 devices fits one)."""
    return f"{node}-{DRIVER}"
