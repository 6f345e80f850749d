"""Writes the RDMA CDI spec (devices.py) next to the cards' spec, atomically and only when it changed
(kept apart from devices.py: the CRI hook imports this package, and this file imports the CRI's writer)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from elasticgpu.agent.discovery import Card
from elasticgpu.agent.injecting.atomic_file import replace_if_changed
from elasticgpu.agent.rdma.devices import SPEC_FILE, NicDevices, build_spec


def nic_devices(
    cards: Iterable[Card], device_nodes: Callable[[str], Sequence[tuple[str, str]]]
) -> tuple[NicDevices, ...]:
    """The NICs under `cards`' PCIe roots that have device nodes (`device_nodes`: the discovery
    backend's, sysfs on a real node); a NIC without one is left out (a claim that names it is
    then refused with the reason)."""
    found = []
    for name in sorted({n for card in cards for n in card.nics}):
        nodes = tuple(device_nodes(name))
        if nodes:
            found.append(NicDevices(name=name, nodes=nodes))
    return tuple(found)


def write_spec(directory: Path, nics: Iterable[NicDevices]) -> bool:
    """Write the spec into the CDI `directory` atomically; False when it was unchanged."""
    listed = list(nics)
    for nic in listed:
        if not nic.name or any(not (ch.isalnum() or ch in "_.:-") for ch in nic.name):
            raise ValueError(f"RDMA NIC {nic.name!r} cannot be a CDI device name; discovery reported it wrong")
    text = json.dumps(build_spec(listed), indent=2, sort_keys=True) + "\n"
    return replace_if_changed(directory / SPEC_FILE, text)
