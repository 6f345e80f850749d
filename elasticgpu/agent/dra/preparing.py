"""NodePrepareResources and NodeUnprepareResources of the DRA driver, as plain calls (the gRPC
servicer in plugin_serving.py only translates messages).

Prepare, for one claim kubelet names (namespace, name, uid):

    checkpoint says completed          -> answer from it (idempotent; nothing read, nothing written)
    read the ResourceClaim             -> its uid must be the one kubelet named (a claim deleted and
                                          made again under the name is another claim)
    status.allocation, our results     -> every device of our driver in this node's pool must be a
                                          card of this node whose effective owner is DRA; else a
                                          refusal naming the card and the fix
    status.allocation, config          -> the isolation mode and the over-limit policy of the claim's
                                          DeviceClass (class_config: a claim's own config does not
                                          change them), kept in the entry
    checkpoint: started                -> then the claim's CDI spec (claim_cdi) -> checkpoint: completed

A crash between the steps leaves `started` (or nothing): kubelet calls again and the steps repeat,
each a replace. Unprepare removes the claim's spec, then its entry; an unknown claim is done already.
Errors per claim go back in the claim's answer (`ClaimRefused`, `ClaimNotReady`); kubelet retries.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elasticgpu.agent import errors
from elasticgpu.agent.dra import card_owners, checkpoint, claim_cdi, class_config, slice_content
from elasticgpu.api import dra_names, quantities
from elasticgpu.api import errors as api_errors

_BARE = re.compile(r"^\s*[0-9]+\s*$")


class PrepareFailed(Exception):
    """One claim could not be prepared; the message goes to kubelet (and the pod's events)."""


class ClaimRefused(PrepareFailed):
    """The claim asks for something this node will not give (another pool, a card DRA does not own)."""


class ClaimNotReady(PrepareFailed):
    """The claim cannot be read or is not allocated yet; kubelet's next call may succeed."""


@dataclass(frozen=True, kw_only=True)
class ClaimRef:
    """A claim as kubelet names it."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"ResourceClaim {self.namespace}/{self.name} (uid {self.uid})"


def _memory_mib(value: object, *, field: str) -> int:
    # A Kubernetes quantity without suffix is bytes (the API server writes e.g. "1048576" for 1Mi
    # only when no suffix fits); quantities.parse_memory_mib reads a bare number as MiB.
    if isinstance(value, str) and _BARE.match(value):
        return math.ceil(int(value) / (1024 * 1024))
    return quantities.parse_memory_mib(value, field=field)


class Preparer:
    """Prepares and unprepares this node's DRA claims."""

    def __init__(self, *, node: str, read_claim: Callable[[str, str], dict[str, Any]],
                 list_gpus: Callable[[], list[dict[str, Any]]], store: checkpoint.Checkpoint,
                 cdi_dir: Path) -> None:  # fmt: skip
        self._node = node
        self._read_claim = read_claim
        self._list_gpus = list_gpus
        self._store = store
        self._cdi_dir = cdi_dir

    def prepare(self, ref: ClaimRef) -> checkpoint.ClaimEntry:
        """Prepare `ref` (see the module docstring); raises PrepareFailed."""
        entry = self._store.get(ref.uid)
        if entry is not None and entry.state == checkpoint.COMPLETED:
            # The spec folder may be a tmpfs that a reboot emptied while kubelet kept the claim prepared.
            claim_cdi.write(self._cdi_dir, ref.uid, list(entry.env))
            return entry
        claim = self._read(ref)
        devices, memory = self._devices(ref, claim)
        pods = tuple(str(r.get("uid")) for r in (claim.get("status") or {}).get("reservedFor") or []
                     if r.get("resource") == "pods" and r.get("uid"))  # fmt: skip
        allocation = (claim.get("status") or {}).get("allocation") or {}
        try:
            said = class_config.read(allocation, (r for d in devices for r in d.requests), claim=str(ref))
        except class_config.ConfigRefused as e:
            raise ClaimRefused(str(e)) from None
        env = tuple(claim_cdi.env(devices, card_memory_mib=memory, isolation=said.mode))
        entry = checkpoint.ClaimEntry(uid=ref.uid, namespace=ref.namespace, name=ref.name,
                                      state=checkpoint.STARTED, devices=devices, pods=pods, env=env,
                                      isolation=said.mode, over_limit_action=said.over_limit_action,
                                      over_limit_grace_s=said.over_limit_grace_s)  # fmt: skip
        self._store.put(entry)
        claim_cdi.write(self._cdi_dir, ref.uid, list(env))
        done = checkpoint.ClaimEntry(**{**entry.__dict__, "state": checkpoint.COMPLETED})
        self._store.put(done)
        return done

    def unprepare(self, ref: ClaimRef) -> None:
        """Undo `ref`'s prepare: its CDI spec, then its checkpoint entry (an unknown claim: done already)."""
        claim_cdi.remove(self._cdi_dir, ref.uid)
        self._store.remove(ref.uid)

    def _read(self, ref: ClaimRef) -> dict[str, Any]:
        try:
            claim = self._read_claim(ref.namespace, ref.name)
        except errors.KubeNotFound:
            raise ClaimNotReady(f"{ref} does not exist (any more); nothing to prepare") from None
        except errors.KubeError as e:
            raise ClaimNotReady(f"{ref} could not be read: {e}; kubelet retries") from None
        uid = (claim.get("metadata") or {}).get("uid")
        if uid != ref.uid:
            raise ClaimNotReady(f"{ref}: the claim of that name now has uid {uid}, another claim; kubelet retries")
        return claim

    def _devices(self, ref: ClaimRef,
                 claim: dict[str, Any]) -> tuple[tuple[checkpoint.PreparedDevice, ...], dict[str, int]]:  # fmt: skip
        allocation = (claim.get("status") or {}).get("allocation") or {}
        results = [r for r in (allocation.get("devices") or {}).get("results") or []
                   if r.get("driver") == dra_names.DRIVER_NAME]  # fmt: skip
        if not results:
            raise ClaimNotReady(f"{ref} has no device of driver {dra_names.DRIVER_NAME} in status.allocation yet")
        gpus = {gpu.get("spec", {}).get("index"): gpu for gpu in self._list_gpus()}
        pool = dra_names.pool_name(self._node)
        prepared: list[checkpoint.PreparedDevice] = []
        memory: dict[str, int] = {}
        for result in results:
            where = f"{ref}, device {result.get('pool')}/{result.get('device')}"
            if result.get("pool") != pool:
                raise ClaimRefused(f"{where}: the pool is not this node's ({pool}); the claim was allocated elsewhere")
            index = dra_names.card_index(str(result.get("device")))
            # Only whole devices are published (gpu-<index>); a carved one (gpu-<index>-<part>) is none of ours yet.
            whole = index is not None and dra_names.device_name(index) == result.get("device")
            gpu = gpus.get(index) if whole else None
            if gpu is None:
                raise ClaimRefused(
                    f"{where}: node {self._node} has no such card (no GPU object with spec.index {index})")
            owner = card_owners.owner_of(gpu)
            uuid = str(gpu["spec"]["uuid"])
            if not owner.preparable:
                raise ClaimRefused(
                    f"{where}: card {uuid} belongs to {owner.effective} (GPU {gpu.get('metadata', {}).get('name')}"
                    f" status.owner), not DRA; set its spec.owner to DRA and wait for status.owner,"
                    " then recreate the claim"
                )
            card_memory = int(gpu["spec"]["memory"])
            consumed = result.get("consumedCapacity") or {}
            try:
                cores = quantities.parse_count(consumed.get(slice_content.CORES, slice_content.CORES_PER_CARD),
                                               field="consumedCapacity.cores")  # fmt: skip
                memory_mib = _memory_mib(consumed.get(slice_content.MEMORY, f"{card_memory}Mi"),
                                         field="consumedCapacity.memory")  # fmt: skip
            except api_errors.InvalidQuantity as e:
                raise ClaimRefused(f"{where}: {e}") from None
            memory[uuid] = card_memory
            share = result.get("shareID")
            prepared.append(checkpoint.PreparedDevice(
                requests=(str(result.get("request", "")),) if result.get("request") else (),
                pool=pool, device=str(result["device"]), uuid=uuid,
                cdi_ids=(claim_cdi.card_id(uuid), claim_cdi.device_id(ref.uid)),
                cores=cores, memory_mib=memory_mib, share_id=str(share) if share else None,
                whole=cores >= slice_content.CORES_PER_CARD and memory_mib >= card_memory,
            ))  # fmt: skip
        return tuple(prepared), memory
