"""The DRA driver's checkpoint: which ResourceClaims this node prepared, with what, in one file.

Two-phase, as NVIDIA's driver and the agent's own ledger do: an entry is written `started` (with
the devices it will hand out) before the claim's CDI spec is written, and `completed` after; a
prepare that finds `completed` answers from it (idempotent), one that finds `started` (the agent
died in between) does the work again, which is safe because every step is a replace. Unprepare
removes the claim's spec first, its entry last. So a kill -9 at any point loses nothing: kubelet
calls again and the file says where the claim stands.

The file is JSON with a version and a SHA-256 over its entries; a file that fails the check is a
corrupt checkpoint (`CheckpointCorrupt`): the driver refuses to guess and says so, rather than
unprepare claims whose containers still run. Written atomically and fsynced (atomic_file).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from elasticgpu.agent.injecting import dra_containers
from elasticgpu.agent.injecting.atomic_file import write_atomically
from elasticgpu.agent.policing import decisions

VERSION = 1
STARTED = "started"
COMPLETED = "completed"


class CheckpointCorrupt(Exception):
    """The checkpoint file exists but cannot be trusted (bad JSON, checksum, or a newer version)."""


@dataclass(frozen=True, kw_only=True)
class PreparedDevice:
    """One device of a prepared claim: what kubelet got, and what the card gives the claim."""

    requests: tuple[str, ...]
    pool: str
    device: str
    uuid: str
    cdi_ids: tuple[str, ...]
    cores: int  # percent of the card the claim consumed (100: whole card)
    memory_mib: int  # MiB the claim consumed
    share_id: str | None = None
    whole: bool = False  # consumed the whole card (its cores and all its memory); an entry before issue 48: False


@dataclass(frozen=True, kw_only=True)
class ClaimEntry:
    """One claim in the checkpoint."""

    uid: str
    namespace: str
    name: str
    state: str
    devices: tuple[PreparedDevice, ...] = ()
    pods: tuple[str, ...] = field(default=())  # uids of the pods the claim was reserved for
    env: tuple[str, ...] = ()  # the claim's CDI spec environment (claim_cdi.env), to write it again
    # The isolation mode of the claim's DeviceClass (its opaque config, read at prepare): what the node hook
    # applies to the claim's containers, across agent restarts. An entry of an agent before it: None.
    isolation: str = "None"
    # The over-limit policy of the claim's DeviceClass (the same config): what policing applies to the claim's
    # containers. An entry of an agent before it: Warn, as that agent did.
    over_limit_action: str = "Warn"
    over_limit_grace_s: int = 60

    def as_dra_claim(self) -> dra_containers.DraClaim:
        """The claim as the node hook needs it."""
        cores = min((d.cores for d in self.devices), default=100)
        memory = min((d.memory_mib for d in self.devices), default=0)
        return dra_containers.DraClaim(
            uid=self.uid, namespace=self.namespace, name=self.name,
            cdi_ids=tuple(dict.fromkeys(cdi_id for d in self.devices for cdi_id in d.cdi_ids)),
            gpus=tuple(d.uuid for d in self.devices), cores=cores,
            memory_mib=0 if self.whole else memory, isolation=self.isolation,
        )  # fmt: skip

    @property
    def whole(self) -> bool:
        """True when every device was consumed whole (`PreparedDevice.whole`)."""
        return all(d.whole for d in self.devices)


def _entry_from(data: dict[str, Any]) -> ClaimEntry:
    devices = tuple(
        PreparedDevice(**{**d, "requests": tuple(d["requests"]), "cdi_ids": tuple(d["cdi_ids"])})
        for d in data.get("devices", [])
    )
    return ClaimEntry(uid=data["uid"], namespace=data["namespace"], name=data["name"], state=data["state"],
                      devices=devices, pods=tuple(data.get("pods", ())), env=tuple(data.get("env", ())),
                      isolation=str(data.get("isolation", "None")),
                      over_limit_action=str(data.get("over_limit_action", "Warn")),
                      over_limit_grace_s=int(data.get("over_limit_grace_s", 60)))  # fmt: skip


def _checksum(entries: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()


class Checkpoint:
    """The checkpoint file at `path`; thread-safe (kubelet may call prepare and unprepare at once)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call `listener` after every write (the agent's holders publisher reports the prepared claims)."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        for listener in self._listeners:
            listener()

    def _read(self) -> dict[str, ClaimEntry]:
        try:
            document = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except ValueError as e:
            raise CheckpointCorrupt(
                f"DRA checkpoint {self.path} is not JSON ({e}); move it aside to start empty") from e
        version = document.get("version") if isinstance(document, dict) else None
        if version != VERSION:
            raise CheckpointCorrupt(
                f"DRA checkpoint {self.path} has version {version}, this agent reads {VERSION}; run the agent"
                " version that wrote it, or move the file aside"
            )
        entries = document.get("claims") or {}
        if document.get("checksum") != _checksum(entries):
            raise CheckpointCorrupt(f"DRA checkpoint {self.path} fails its checksum; move it aside to start empty")
        try:
            return {uid: _entry_from(data) for uid, data in entries.items()}
        except (KeyError, TypeError) as e:
            raise CheckpointCorrupt(f"DRA checkpoint {self.path} has a malformed entry ({e})") from e

    def _write(self, claims: dict[str, ClaimEntry]) -> None:
        entries = {uid: asdict(entry) for uid, entry in sorted(claims.items())}
        document = {"version": VERSION, "checksum": _checksum(entries), "claims": entries}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path, json.dumps(document, indent=1, sort_keys=True) + "\n", sync_directory=True)

    def entries(self) -> dict[str, ClaimEntry]:
        """Every claim in the checkpoint, by uid."""
        with self._lock:
            return self._read()

    def get(self, uid: str) -> ClaimEntry | None:
        """The entry of claim `uid`, or None."""
        with self._lock:
            return self._read().get(uid)

    def devices_of_pod(self, pod_uid: str) -> frozenset[str]:
        """The CDI ids of the completed claims reserved for pod `pod_uid` (what the node hook lets its
        containers keep); empty for an unreadable checkpoint (the hook then treats them as claimless)."""
        try:
            claims = self.entries()
        except CheckpointCorrupt:
            return frozenset()
        return frozenset(cdi_id for entry in claims.values() if entry.state == COMPLETED and pod_uid in entry.pods
                         for device in entry.devices for cdi_id in device.cdi_ids)  # fmt: skip

    def claims_of_pod(self, pod_uid: str) -> tuple[dra_containers.DraClaim, ...]:
        """The completed claims reserved for pod `pod_uid`, as the node hook needs them; () for an unreadable
        checkpoint (the hook then treats the pod's containers as claimless)."""
        try:
            claims = self.entries()
        except CheckpointCorrupt:
            return ()
        return tuple(entry.as_dra_claim() for _, entry in sorted(claims.items())
                     if entry.state == COMPLETED and pod_uid in entry.pods)  # fmt: skip

    def policy_of(self, uid: str) -> decisions.Policy | None:
        """The over-limit policy kept for completed claim `uid` at prepare (its DeviceClass's); None for a claim
        not prepared here or an unreadable checkpoint (policing then only warns: never stop on a guess)."""
        try:
            entry = self.get(uid)
        except CheckpointCorrupt:
            return None
        if entry is None or entry.state != COMPLETED:
            return None
        action: decisions.Action = "StopContainer" if entry.over_limit_action == "StopContainer" else "Warn"
        return decisions.Policy(action=action, grace_s=float(max(0, entry.over_limit_grace_s)))

    def put(self, entry: ClaimEntry) -> None:
        """Write (or replace) the entry of `entry.uid`."""
        with self._lock:
            claims = self._read()
            claims[entry.uid] = entry
            self._write(claims)
        self._changed()

    def remove(self, uid: str) -> None:
        """Remove the entry of claim `uid` (none: nothing to do)."""
        with self._lock:
            claims = self._read()
            removed = claims.pop(uid, None) is not None
            if removed:
                self._write(claims)
        if removed:
            self._changed()
