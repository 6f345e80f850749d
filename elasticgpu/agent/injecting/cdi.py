"""The CDI spec of this node's cards, written where the runtime reads CDI specs.

One spec file, kind `elasticgpu.io/gpu`, one device per card named by its uuid, whose edit is
the card's device node (`/dev/nvidia<minor>`), plus spec-wide edits (applied whenever any of
its devices is injected) with the control nodes (`/dev/nvidiactl`, `/dev/nvidia-uvm`,
`/dev/nvidia-uvm-tools`) and the driver's files (driver.py: libraries at their versioned names
and sonames, binaries, firmware, IPC sockets, all read-only bind mounts; the update-ldcache hook
when nvidia-ctk is on the node), as `nvidia-ctk cdi generate` writes them, so a claimed container
runs CUDA on a plain runc node without the NVIDIA runtime hook. CDI version 0.6.0: containerd 1.7
reads 0.5.0 to 0.8.0, CRI-O too.

Why the agent writes all of it and does not consume the toolkit's generated spec: the spec must
name exactly the cards discovery reported (uuids are our device names, and a card that vanished
must go at once), the toolkit is not installed on every node (and its generated spec goes stale
at a driver upgrade unless something regenerates it), and the driver's file list is small and
stable. nvidia-ctk, when present, is used only for what needs code on the node (the ldcache hook).

A device node has a `path` (inside the container) and a `hostPath` (on the node); the runtime
stats the host path for type, major and minor and allows that device in the container's device
cgroup. Real cards: the host path is the same /dev path. The simulated backend points the host
paths at stand-in character devices it made, so the same path runs without a GPU.

The runtime re-reads the spec directory on every CreateContainer, so the file is replaced
atomically: written to a hidden temporary name that does not end in .json (the runtime skips
it), flushed to disk, renamed over the old one. An unchanged spec is not rewritten.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elasticgpu.agent.discovery import Card
from elasticgpu.agent.injecting import driver, injection
from elasticgpu.agent.injecting.atomic_file import replace_if_changed

CDI_VERSION = "0.6.0"
SPEC_FILE = "elasticgpu.io-gpu.json"
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


@dataclass(frozen=True, kw_only=True)
class DeviceNode:
    """A device node to create in the container: `path` inside, `host_path` on the node."""

    path: str
    host_path: str | None = None  # None: the same path on the node

    def to_spec(self) -> dict[str, Any]:
        """The CDI `deviceNodes` entry."""
        entry: dict[str, Any] = {"path": self.path, "permissions": "rw"}
        if self.host_path is not None and self.host_path != self.path:
            entry["hostPath"] = self.host_path
        return entry


@dataclass(frozen=True, kw_only=True)
class CardDevice:
    """A card as CDI device: its uuid (the device name) and its device node."""

    uuid: str
    minor: int
    host_path: str | None = None  # None: /dev/nvidia<minor> on the node

    def node(self) -> DeviceNode:
        """The card's device node, /dev/nvidia<minor>."""
        return DeviceNode(path=f"/dev/nvidia{self.minor}", host_path=self.host_path)


def existing_control_nodes(dev: Path = Path("/dev")) -> list[DeviceNode]:
    """The control nodes present under `dev` (a spec naming a missing node fails every injection)."""
    return [DeviceNode(path=path) for path in CONTROL_NODES if (dev / Path(path).name).exists()]


def card_devices(cards: Iterable[Card]) -> list[CardDevice]:
    """Discovery's cards as CDI devices: `/dev/nvidia<minor>` in the container, the card's
    `device_path` on the node (the same path for a real card, a stand-in when simulated)."""
    return [
        CardDevice(
            uuid=card.uuid,
            minor=card.minor,
            host_path=None if card.device_path == f"/dev/nvidia{card.minor}" else card.device_path,
        )
        for card in cards
    ]


def control_nodes(host_paths: Iterable[str]) -> list[DeviceNode]:
    """The backend's control devices (`backend.control_device_paths()`) as device nodes: each is
    `/dev/<its name>` in the container (`/dev/nvidiactl`, ...), wherever it is on the node."""
    return [DeviceNode(path=f"/dev/{Path(path).name}", host_path=path) for path in host_paths]


def build_spec(
    cards: Sequence[CardDevice], control_nodes: Iterable[DeviceNode], driver_files: driver.DriverFiles | None = None
) -> dict[str, Any]:
    """The CDI spec document for `cards` (sorted by uuid, so equal inputs give equal files)."""
    edits: dict[str, Any] = {"deviceNodes": [node.to_spec() for node in control_nodes]}
    if driver_files is not None and driver_files.mounts:
        edits["mounts"] = [mount.to_spec() for mount in driver_files.mounts]
    if driver_files is not None and (hooks := driver_files.hooks()):
        edits["hooks"] = hooks
    return {
        "cdiVersion": CDI_VERSION,
        "kind": injection.CDI_KIND,
        "devices": [
            {"name": card.uuid, "containerEdits": {"deviceNodes": [card.node().to_spec()]}}
            for card in sorted(cards, key=lambda card: card.uuid)
        ],
        "containerEdits": edits,
    }


def write_spec(
    directory: Path,
    cards: Sequence[CardDevice],
    control_nodes: Iterable[DeviceNode],
    driver_files: driver.DriverFiles | None = None,
) -> bool:
    """Write the spec into the CDI `directory` atomically; returns False when it was unchanged."""
    for card in cards:
        # A CDI device name allows letters, digits, '_', '.', ':' and '-' only.
        if not card.uuid or any(not (ch.isalnum() or ch in "_.:-") for ch in card.uuid):
            raise ValueError(f"card uuid {card.uuid!r} cannot be a CDI device name; discovery reported it wrong")
    text = json.dumps(build_spec(cards, control_nodes, driver_files), indent=2, sort_keys=True) + "\n"
    return replace_if_changed(directory / SPEC_FILE, text)


def remove_spec(directory: Path) -> None:
    """Remove our spec (the agent is being uninstalled); containers already running keep their devices."""
    with contextlib.suppress(FileNotFoundError):
        (directory / SPEC_FILE).unlink()


@dataclass(frozen=True, kw_only=True)
class ResolvedNode:
    """A device node of a resolved CDI device: where it goes in the container, and what it is on the node
    (the runtime creates it with this type and number, and allows exactly it in the device cgroup)."""

    path: str
    type: str  # "c" (character) or "b" (block)
    major: int
    minor: int
    file_mode: int  # permission bits of the node on the node (0666 for the driver's)


@dataclass(frozen=True, kw_only=True)
class ResolvedEdits:
    """What our CDI devices stand for, merged: for a runtime hook that cannot take CDI names (NRI
    before v0.10, as containerd 1.7 and 2.0 speak it)."""

    nodes: tuple[ResolvedNode, ...] = ()
    mounts: tuple[dict[str, Any], ...] = ()  # CDI `mounts` entries (hostPath, containerPath, options)
    env: tuple[tuple[str, str], ...] = ()
    hooks: tuple[dict[str, Any], ...] = ()  # CDI `hooks` entries (hookName, path, args, env)


class UnresolvedDevice(LookupError):
    """A CDI device name no spec of the directory defines (or whose node is missing on the node)."""


def resolve(directory: Path, names: Sequence[str]) -> ResolvedEdits:
    """The device nodes, mounts, env and hooks that the CDI devices `names` stand for, read from the
    specs of `directory` as the runtime would (each device's edits, plus its spec's spec-wide edits
    once); raises UnresolvedDevice naming the first that cannot be resolved."""
    wanted = list(dict.fromkeys(names))
    if not wanted:
        return ResolvedEdits()
    edits: list[dict[str, Any]] = []
    found: set[str] = set()
    for spec in _specs(directory):
        kind = spec.get("kind", "")
        hits = [d for d in spec.get("devices") or [] if f"{kind}={d.get('name')}" in wanted]
        if not hits:
            continue
        found.update(f"{kind}={d.get('name')}" for d in hits)
        edits.extend(d.get("containerEdits") or {} for d in hits)
        edits.append(spec.get("containerEdits") or {})
    if missing := [name for name in wanted if name not in found]:
        raise UnresolvedDevice(f"CDI device {missing[0]} is in no spec under {directory}")
    nodes: dict[str, ResolvedNode] = {}
    mounts: dict[str, dict[str, Any]] = {}
    env: dict[str, str] = {}
    hooks: list[dict[str, Any]] = []
    for edit in edits:
        for node in edit.get("deviceNodes") or []:
            nodes[node["path"]] = _node(node)
        for mount in edit.get("mounts") or []:
            mounts[mount["containerPath"]] = mount
        for item in edit.get("env") or []:
            key, _, value = str(item).partition("=")
            env[key] = value
        hooks.extend(hook for hook in edit.get("hooks") or [] if hook not in hooks)
    return ResolvedEdits(nodes=tuple(nodes.values()), mounts=tuple(mounts.values()), env=tuple(env.items()),
                         hooks=tuple(hooks))


def card_nodes(directory: Path) -> dict[tuple[str, int, int], str]:
    """Our CDI devices' own nodes (cards', and RDMA NICs': injection.is_ours) as the runtime makes them:
    (type, major, minor) -> the CDI name (`elasticgpu.io/gpu=<uuid>`). A front whose runtime has resolved CDI
    devices before it is asked (NRI) tells ours by them; a device whose node is missing on the node is left out."""
    found: dict[tuple[str, int, int], str] = {}
    for spec in _specs(directory):
        if not injection.is_ours(f"{spec.get('kind')}=any"):
            continue
        for device in spec.get("devices") or []:
            for entry in (device.get("containerEdits") or {}).get("deviceNodes") or []:
                try:
                    node = _node(entry)
                except (UnresolvedDevice, KeyError):
                    continue
                found[(node.type, node.major, node.minor)] = f"{spec.get('kind')}={device.get('name')}"
    return found


_SpecKey = tuple[int, int, int, int]  # (device, inode, size, mtime in ns) of a spec file
_parsed: dict[Path, tuple[_SpecKey, dict[str, Any] | None]] = {}
_parsed_lock = threading.Lock()


def _specs(directory: Path) -> list[dict[str, Any]]:
    """The parsed specs of `directory`, in name order, each read again only when its file changed (its
    inode, size or mtime: specs are replaced by rename): one stat per file per CreateContainer, not a parse."""
    specs = []
    for path in sorted(directory.glob("*.json")):
        try:
            info = path.stat()
        except OSError:
            continue  # gone meanwhile
        key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        with _parsed_lock:
            cached = _parsed.get(path)
        if cached is None or cached[0] != key:
            try:
                spec = json.loads(path.read_text())
            except (OSError, ValueError):
                spec = None  # being replaced, or not ours: another spec names the device or nothing does
            cached = (key, spec if isinstance(spec, dict) else None)
            with _parsed_lock:
                _parsed[path] = cached
        if cached[1] is not None:
            specs.append(cached[1])
    return specs


def _node(entry: dict[str, Any]) -> ResolvedNode:
    host = entry.get("hostPath") or entry["path"]
    try:
        info = os.stat(host)
    except OSError as e:
        raise UnresolvedDevice(f"device node {host} (for {entry['path']}): {e.strerror}") from e
    if stat.S_ISCHR(info.st_mode):
        kind = "c"
    elif stat.S_ISBLK(info.st_mode):
        kind = "b"
    else:
        raise UnresolvedDevice(f"{host} (for {entry['path']}) is not a device node")
    return ResolvedNode(path=entry["path"], type=kind, major=os.major(info.st_rdev), minor=os.minor(info.st_rdev),
                        file_mode=stat.S_IMODE(info.st_mode))
