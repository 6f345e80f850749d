"""One CDI spec per prepared ResourceClaim: kind `elasticgpu.io/claim`, one device named by the
claim's uid, whose edits are the environment the claim's containers get.

The card itself comes from the node's card spec (`elasticgpu.io/gpu=<uuid>`, injecting/cdi.py):
its device node, the control nodes and the driver's files, the same for our claims and DRA's. The
claim's spec adds what is the claim's own: `NVIDIA_VISIBLE_DEVICES` (the cards' uuids, so the CUDA
stack in the container sees exactly them), and for a slice (consumed capacity below a whole card)
its size as the environment MPS and HAMi-core read (isolation/none.py: the advisory baseline that
an image preloading HAMi-core, or a node running MPS, enforces).

Kubelet hands the ids to the runtime, which reads the specs on every CreateContainer; the file is
replaced atomically and removed at unprepare.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from pathlib import Path

from elasticgpu.agent.dra import checkpoint
from elasticgpu.agent.injecting import injection
from elasticgpu.agent.injecting.atomic_file import replace_if_changed
from elasticgpu.agent.isolation import base, none

CDI_VERSION = "0.6.0"
KIND = "elasticgpu.io/claim"
CORES_PER_CARD = 100


def spec_file(uid: str) -> str:
    """The file name of claim `uid`'s spec."""
    return f"elasticgpu.io-claim-{uid}.json"


def device_id(uid: str) -> str:
    """The CDI device id of claim `uid`."""
    return f"{KIND}={uid}"


def card_id(uuid: str) -> str:
    """The CDI device id of a card (the node's card spec)."""
    return injection.cdi_device(uuid)


def env(devices: Sequence[checkpoint.PreparedDevice], *, card_memory_mib: dict[str, int],
        isolation: str = base.MODE_NONE) -> list[str]:
    """The claim's environment, `KEY=value` lines: NVIDIA_VISIBLE_DEVICES, and in isolation mode None the
    slice's limits when it consumed less than whole cards (the smallest share of its devices, as one claim is
    one size). An enforcing mode's env comes from its room, through the node hook (injecting/dra_containers.py):
    the CDI spec's edits are applied after the container's own env and would override the room's."""
    uuids = [device.uuid for device in devices]
    lines = [f"NVIDIA_VISIBLE_DEVICES={','.join(uuids)}"]
    whole = all(d.cores >= CORES_PER_CARD and d.memory_mib >= card_memory_mib.get(d.uuid, 0) for d in devices)
    if devices and not whole and isolation == base.MODE_NONE:
        size = base.Slice(claim="", uuids=tuple(uuids), cores=min(d.cores for d in devices),
                          memory_mib=min(d.memory_mib for d in devices), pod_uid="", container="")  # fmt: skip
        lines.extend(f"{k}={v}" for k, v in (*none.mps_env(size), *none.hami_env(size, per_device_sm=False)))
    return lines


def write(directory: Path, uid: str, lines: list[str]) -> bool:
    """Write claim `uid`'s spec with the environment `lines` into the CDI `directory`; False when unchanged."""
    if not uid or any(not (ch.isalnum() or ch in "_.:-") for ch in uid):
        raise ValueError(f"claim uid {uid!r} cannot be a CDI device name")
    spec = {"cdiVersion": CDI_VERSION, "kind": KIND,
            "devices": [{"name": uid, "containerEdits": {"env": lines}}]}  # fmt: skip
    return replace_if_changed(directory / spec_file(uid), json.dumps(spec, indent=2, sort_keys=True) + "\n")


def remove(directory: Path, uid: str) -> None:
    """Remove claim `uid`'s spec (none: nothing to do)."""
    with contextlib.suppress(FileNotFoundError):
        (directory / spec_file(uid)).unlink()
