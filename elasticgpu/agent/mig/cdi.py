"""A MIG instance as a CDI device: named by its uuid, with the card's device node and the
instance's access devices (the driver's nvidia-caps files), and the uuid CUDA sees."""

from __future__ import annotations

from typing import Any

from elasticgpu.agent.discovery.mig import MigInstanceInfo
from elasticgpu.agent.discovery.models import Card


def mig_device(instance: MigInstanceInfo, card: Card) -> dict[str, Any]:
    """The CDI `devices[]` entry of `instance` on `card` (same kind as the cards' spec)."""
    nodes: list[dict[str, Any]] = []
    for path, host in [(f"/dev/nvidia{card.minor}", card.device_path), *[
            (f"/dev/nvidia-caps/{p.rsplit('/', 1)[-1]}", p) for p in instance.device_paths]]:
        entry: dict[str, Any] = {"path": path, "permissions": "rw"}
        if host != path:
            entry["hostPath"] = host
        nodes.append(entry)
    return {
        "name": instance.uuid,
        "containerEdits": {"deviceNodes": nodes, "env": [f"NVIDIA_VISIBLE_DEVICES={instance.uuid}"]},
    }
