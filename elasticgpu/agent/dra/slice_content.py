"""What the node's ResourceSlice says: pure, from the node's GPU objects (what the agent published
from discovery) to the `spec` of one resource.k8s.io/v1 ResourceSlice.

One pool per node (names: elasticgpu/api/dra_names.py), one slice in it, one device per card that
card_owners says DRA may offer, healthy or of unknown health (an Unhealthy card is left out, so the
scheduler places no new claim on it; claims already allocated keep running until they end).

Each device carries
- attributes a user selects on in CEL (`device.attributes["gpu.elasticgpu.io"].model`, ...):
  `model`, `uuid`, `index`, `memory` (MiB, an int: comparisons are plain), `numa` (when known),
  `pcieRoot` (when known), `mig` (MIG mode on, as the GPU object says);
- capacity `cores` (100: percent of the card's compute) and `memory` (the card's memory, a
  quantity), each with a request policy: a claim that names neither consumes the whole card (the
  default is everything), one that names less gets a slice (KEP-5075 consumable capacity,
  `allowMultipleAllocations: true`, beta and on by default in Kubernetes 1.36), in steps of one
  percent and one MiB.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from elasticgpu.agent.dra import card_owners
from elasticgpu.api import dra_names

CORES = "cores"
MEMORY = "memory"
CORES_PER_CARD = 100
DIGEST_ANNOTATION = "elasticgpu.io/devices-digest"
"""On the slice: the SHA-256 of the devices as the agent wrote them. The API server rewrites quantities in
canonical form (81920Mi comes back as 80Gi), so what was written is compared by this, not by the devices."""


def _device(gpu: dict[str, Any]) -> dict[str, Any] | None:
    spec = gpu.get("spec") or {}
    index, uuid, memory = spec.get("index"), spec.get("uuid"), spec.get("memory")
    if not isinstance(index, int) or not isinstance(uuid, str) or not isinstance(memory, int) or memory < 1:
        return None  # a half-written object: the next publish has it whole
    attributes: dict[str, Any] = {
        "model": {"string": str(spec.get("model") or "")},
        "uuid": {"string": uuid},
        "index": {"int": index},
        "memory": {"int": memory},
        "mig": {"bool": bool(spec.get("mig"))},
    }
    if isinstance(spec.get("numa"), int):
        attributes["numa"] = {"int": spec["numa"]}
    if spec.get("pcieRoot"):
        attributes["pcieRoot"] = {"string": str(spec["pcieRoot"])}
    return {
        "name": dra_names.device_name(index),
        "attributes": attributes,
        "capacity": {
            CORES: {"value": str(CORES_PER_CARD), "requestPolicy": {
                "default": str(CORES_PER_CARD),
                "validRange": {"min": "1", "max": str(CORES_PER_CARD), "step": "1"}}},
            MEMORY: {"value": f"{memory}Mi", "requestPolicy": {
                "default": f"{memory}Mi", "validRange": {"min": "1Mi", "max": f"{memory}Mi", "step": "1Mi"}}},
        },
        "allowMultipleAllocations": True,
    }  # fmt: skip


def offered(gpu: dict[str, Any]) -> bool:
    """True when the card of `gpu` belongs in the slice: DRA may offer it and it is not Unhealthy."""
    status = gpu.get("status") or {}
    return card_owners.owner_of(gpu).publishable and status.get("health") != "Unhealthy"


def devices(gpus: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The slice's devices for the node's GPU objects `gpus`, sorted by name (equal inputs, equal slices)."""
    found = [device for gpu in gpus if offered(gpu) and (device := _device(gpu)) is not None]
    return sorted(found, key=lambda device: str(device["name"]))


def slice_name(node: str) -> str:
    """The name of `node`'s ResourceSlice (one per node: a pool of at most 128 devices fits one)."""
    return f"{node}-{dra_names.DRIVER_NAME}"


def digest(devices_: list[dict[str, Any]]) -> str:
    """The DIGEST_ANNOTATION value of `devices_`."""
    return hashlib.sha256(json.dumps(devices_, sort_keys=True).encode()).hexdigest()


def slice_body(node: str, devices_: list[dict[str, Any]], *, generation: int) -> dict[str, Any]:
    """The whole ResourceSlice object (for a server-side apply) of `node` with `devices_`."""
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node), "annotations": {DIGEST_ANNOTATION: digest(devices_)}},
        "spec": {
            "driver": dra_names.DRIVER_NAME, "nodeName": node, "devices": devices_,
            "pool": {"name": dra_names.pool_name(node), "generation": generation, "resourceSliceCount": 1},
        },
    }  # fmt: skip
