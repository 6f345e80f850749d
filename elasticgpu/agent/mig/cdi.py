"""A MIG instance as a CDI device: named by its uuid, with the card's device node and the
instance's access devices (the driver's nvidia-caps files), and the uuid CUDA sees.

The instances' spec is a file of its own (`elasticgpu.io-mig.json`) of the cards' kind
(`elasticgpu.io/gpu`): what a user names of that kind is stripped by the CRI hook, so nobody
takes an instance by naming it; the spec-wide edits (control nodes, driver files) come with
the card's device, which a MIG container is given too (its parent device node is needed).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from elasticgpu.agent.discovery.mig import MigInstanceInfo
from elasticgpu.agent.discovery.models import Card
from elasticgpu.agent.injecting import cdi as cards_cdi
from elasticgpu.agent.injecting import injection
from elasticgpu.agent.injecting.atomic_file import replace_if_changed

SPEC_FILE = "elasticgpu.io-mig.json"


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


def write_spec(directory: Path, devices: Iterable[dict[str, Any]]) -> bool:
    """Write the instances' CDI spec atomically (sorted by name); False when it was unchanged."""
    spec = {"cdiVersion": cards_cdi.CDI_VERSION, "kind": injection.CDI_KIND,
            "devices": sorted(devices, key=lambda d: str(d["name"]))}
    text = json.dumps(spec, indent=2, sort_keys=True) + "\n"
    return replace_if_changed(directory / SPEC_FILE, text)
