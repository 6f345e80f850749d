"""The controller's picture of GPU capacity: GPU objects, the allocator's inventory, and the
reservations written into `status.allocations`.

The GPU objects on the server are the truth. `Ledger` mirrors them into an allocator
`Inventory` (one reservation per ElasticGPU name, spanning every card that holds an
allocation for it) so that `place` answers from memory, and it builds the GPU status bodies
that commit or free a reservation. It does no I/O: the caller PUTs the bodies with their
resourceVersion (the commit point) and feeds the server's answer back with `observe_gpu`.

Of each GPU it keeps a small record and the body's JSON, its model built when read (a bounded
cache of those built last: `gpu_records`). The ledger owns its indexes (`holders.Holders`: the
keys each GPU holds, the GPUs holding each key); of `compact`, `gpu_records` and `versions` it
asks only leaf questions (the record and model to keep, which copy is newer), and nothing it
calls calls back into it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from elasticgpu.allocator import (
    Allocator,
    CardShare,
    Health,
    Inventory,
    NodeRecord,
    Placement,
    PlacementRequest,
    ReservationConflict,
    UnknownObject,
    Unplaceable,
)
from elasticgpu.allocator.mig import model_for, partitions_fit
from elasticgpu.api import GPU, GPUAllocation, ObjectReference, allocatable_summary, format_memory, names, timestamps
from elasticgpu.api.gpu import GPUPartition
from elasticgpu.controller.errors import CardClosed, CardOverfilled
from elasticgpu.controller.picture import compact, gpu_records, versions
from elasticgpu.controller.picture.holders import Holders

logger = logging.getLogger(__name__)

Body = dict[str, Any]


now_rfc3339 = timestamps.now_rfc3339
"""The current time as the API server writes it (whole seconds); `timestamps.now_rfc3339`,
named here too for callers that still import it from the ledger."""

parse_time = timestamps.parse
"""An RFC 3339 timestamp, or None when absent or unreadable."""


class Ledger:
    """GPUs by object name and the allocator's inventory kept in step with their allocations."""

    def __init__(self) -> None:
        self.inventory = Inventory()
        self._allocators: dict[str, Allocator] = {}
        self._gpus: dict[str, gpu_records.GPURecord] = {}
        """Each GPU's record: what the events' paths read, and its body as JSON (`gpu_records`)."""
        self._models = gpu_records.Models()
        """The GPU models built last (a model per GPU was ~7 KB of its ~8.7 KB held)."""
        self._uuid_to_name: dict[str, str] = {}
        self._node_labels: dict[str, dict[str, str]] = {}
        self._holders = Holders()
        """Reservation keys by GPU name and GPU names by key (the ledger's own index)."""
        self._deleted: versions.Tombstones[str] = versions.Tombstones()
        """GPU deletions seen: an older copy (a list read before, a write answer after) is refused."""
        self._not_ready: set[str] = set()
        """GPUs found not ready (heartbeat expired, `gpu_sync`): their cards take no new
        reservations (Unhealthy to the allocator), the ones they hold are kept."""
        self._tentative: dict[str, float] = {}
        """Keys reserved in the inventory ahead of their GPU write (a batch), with when: the
        only inventory entries no GPU object holds, until the write lands or fails."""

    # -- reading -------------------------------------------------------------------------------

    def gpu(self, name: str) -> GPU | None:
        """The GPU object `name` as last seen, or None (built from its JSON when not cached)."""
        record = self._gpus.get(name)
        return None if record is None else self._models.get(name, record)

    def gpu_and_body(self, name: str) -> tuple[GPU, Body] | None:
        """The GPU object `name` as last seen, model and body (with its resourceVersion), or None."""
        model = self.gpu(name)
        return None if model is None else (model, self._body(name))

    def gpu_body(self, name: str) -> Body | None:
        """The GPU object `name` as last seen (a fresh dict with its resourceVersion), or None."""
        held = self._gpus.get(name)
        return held.packed.body() if held is not None else None

    def gpu_version(self, name: str) -> Body | None:
        """A body with only GPU `name`'s resourceVersion (what `versions` compares), or None; no parse."""
        held = self._gpus.get(name)
        return held.packed.version_body() if held is not None else None

    def _body(self, name: str) -> Body:
        return self._gpus[name].packed.body()

    def _model(self, name: str) -> GPU:
        """The model of a GPU the ledger holds (built from its JSON when not cached)."""
        return self._models.get(name, self._gpus[name])

    def gpu_names(self) -> list[str]:
        """Names of every GPU object seen."""
        return list(self._gpus)

    def gpus_on_node(self, node: str) -> list[str]:
        """Names of the GPU objects whose spec.nodeName is `node`, sorted."""
        return sorted(name for name, record in self._gpus.items() if record.node == node)

    def mig_gpu_names(self) -> list[str]:
        """Names of the GPU objects whose card is in MIG mode (spec.mig), builds no model."""
        return [name for name, record in self._gpus.items() if record.mig]

    def owner_moving_gpu_names(self) -> list[str]:
        """Names of the GPU objects whose spec.owner is not their effective owner (a move between
        ElasticGPU and DRA under way); builds no model."""
        return [name for name, record in self._gpus.items() if record.owner_moving()]

    def keys_on(self, gpu_name: str) -> set[str]:
        """The ElasticGPU names GPU `gpu_name` holds a reservation for (empty when none or unknown)."""
        return set(self._holders.keys_on(gpu_name))

    def name_of_uuid(self, uuid: str) -> str:
        """GPU object name of a card uuid."""
        return self._uuid_to_name.get(uuid, names.gpu_object_name(uuid))

    def held(self, key: str) -> Placement | None:
        """What the GPU objects hold for ElasticGPU `key`, or None.

        Read from the objects, not from the inventory: the inventory also carries a batch's
        tentative reservations and may briefly disagree with the objects; a decision that
        frees or fails capacity must rest on what the server holds."""
        return self._placement_in_gpus(key)

    def _placement_in_gpus(self, key: str) -> Placement | None:
        shares: list[CardShare] = []
        node = ""
        for gpu_name in self._gpus_holding(key):
            record = self._gpus.get(gpu_name)
            share = record.share(key) if record is not None else None
            if record is None or share is None:
                continue
            node = record.node
            shares.append(CardShare(uuid=record.uuid, cores=share[1], memory_mib=share[2], whole=share[3]))
        return Placement(node=node, cards=tuple(shares)) if shares else None

    def allocation(self, gpu_name: str, key: str) -> GPUAllocation | None:
        """The allocation of `key` on one GPU, or None (from its model: built when not cached)."""
        record = self._gpus.get(gpu_name)
        if record is None or record.share(key) is None:
            return None
        for allocation in reversed(self._models.get(gpu_name, record).status.allocations):
            if allocation.elastic_gpu == key:
                return allocation  # the last of a key, as the old dict by key kept
        return None

    def gpu_record(self, name: str) -> gpu_records.GPURecord | None:
        """What the ledger keeps of GPU `name` besides its JSON (read-only), or None; builds no model."""
        return self._gpus.get(name)

    def place(self, request: PlacementRequest, *, policy: str) -> Placement | Unplaceable:
        """Where the request would go now under `policy` (changes nothing)."""
        allocator = self._allocators.get(policy)
        if allocator is None:
            allocator = Allocator(self.inventory, policy=policy)
            self._allocators[policy] = allocator
        return allocator.place(request)

    def conflict(self, placement: Placement) -> str:
        """Why `placement` cannot be reserved now, or "" when it can."""
        return self.inventory.conflict(placement)

    # -- keeping in step with the server ---------------------------------------------------------

    def observe_node(self, name: str, labels: Mapping[str, str]) -> None:
        """Remember a node's labels (for class nodeSelectors); re-adds its cards when they changed."""
        if self._node_labels.get(name) == dict(labels):
            return
        # Its own strings, none of the list or event (`compact.own`: one kept string of a list keeps
        # an arena of it); the label keys and values of a fleet's nodes are mostly equal.
        name = compact.own(name)
        self._node_labels[name] = {compact.own(k): compact.own(v) for k, v in labels.items()}
        if name in self.inventory:
            bodies = [r.packed.body() for r in self._gpus.values() if r.node == name]
            for body in bodies:
                self.forget_gpu(body["metadata"]["name"])
            for body in bodies:
                self.observe_gpu(body)

    def forget_nodes_except(self, listed: set[str]) -> None:
        """Forget the labels of nodes not in `listed` (a complete node list) that hold no GPU."""
        with_gpus = {r.node for r in self._gpus.values()}
        for gone in set(self._node_labels) - listed - with_gpus:
            del self._node_labels[gone]

    def observe_gpu(self, body: Body) -> None:
        """Take in a GPU object as the server holds it (from a list, watch event or write)."""
        name = body["metadata"]["name"]
        held_version = self.gpu_version(name)
        if self._deleted.refuses(name, body, held=held_version):
            return  # older than the copy held, or a copy from before its deletion
        if held_version is not None and not versions.is_newer(body, held_version):
            # The copy held (the same resourceVersion: the same object). Kept again, its new model
            # and JSON were made while the list it came in was alive, in that list's arenas: a
            # watch starting over after an outage then pinned most of every GPU page's memory
            # (bench/relist_rss.py), for a picture that did not change.
            return
        record, model = gpu_records.take_in(body)  # the whole model validated, as ever
        name = model.metadata.name or name  # the model's: the keys below hold nothing of the list
        previous = self._gpus.get(name)
        if previous is not None and not previous.same_card(record):
            self.forget_gpu(name)
            previous = None
        self._gpus[name] = record
        self._models.put(name, record, model)
        self._uuid_to_name[record.uuid] = name
        if previous is None:
            node = record.node
            if node not in self.inventory:
                self.inventory.add_node(NodeRecord(name=node, labels=self._node_labels.get(node, {})))
            self.inventory.add_card(record.card)
            if name in self._not_ready or record.mig:
                # A card in MIG mode serves MIG classes only (`allocator.mig.cluster`): soft slices
                # never land on it; what it holds stays counted.
                self.inventory.set_health(record.uuid, Health.UNHEALTHY)
        after = record.keys()
        before = self._holders.set_keys_on(name, after)
        self._resync_keys(before | after)

    def delete_gpu(self, body: Body) -> None:
        """A GPU object was deleted (a watch's DELETED event, whose body has the deletion's
        resourceVersion): forget it, and refuse older copies of it from now on."""
        name = body["metadata"]["name"]
        self._deleted.bury(name, body)
        self.forget_gpu(name)
        self._not_ready.discard(name)

    def set_ready(self, name: str, ready: bool) -> bool:
        """Mark GPU `name` ready or not for new reservations (its heartbeat); True when that
        changed. Ready again, the card is as healthy as its object says."""
        if (name not in self._not_ready) == ready:
            return False
        if ready:
            self._not_ready.discard(name)
        else:
            self._not_ready.add(name)
        record = self._gpus.get(name)
        if record is not None:
            healthy = ready and not record.mig
            self.inventory.set_health(record.uuid, record.health if healthy else Health.UNHEALTHY)
        return True

    def is_ready(self, name: str) -> bool:
        """Whether GPU `name` takes new reservations (its heartbeat is fresh)."""
        return name not in self._not_ready

    def node_labels(self, node: str) -> dict[str, str]:
        """The labels of a node as last seen (for class nodeSelectors)."""
        return dict(self._node_labels.get(node, {}))

    def prune_tombstones(self, list_version: str) -> None:
        """Forget the deletions a list taken at `list_version` has seen."""
        self._deleted.prune(list_version)

    def forget_gpu(self, name: str) -> None:
        """Drop a GPU object (deleted, or about to be re-added with a new spec)."""
        record = self._gpus.pop(name, None)
        self._models.pop(name)
        keys = self._holders.set_keys_on(name, set())
        if record is None:
            return
        self.inventory.remove_card(record.uuid)
        if self._uuid_to_name.get(record.uuid) == name:
            del self._uuid_to_name[record.uuid]
        node = record.node
        if not any(r.node == node for r in self._gpus.values()) and node in self.inventory:
            self.inventory.remove_node(node)
        self._resync_keys(keys)

    def _resync_keys(self, keys: Iterable[str]) -> None:
        """Make the inventory's reservation of each key equal what the GPUs hold for it."""
        for key in keys:
            wanted = self._placement_in_gpus(key)
            if wanted is not None:
                self._tentative.pop(key, None)  # written: the objects hold it now
            if self.inventory.reservations.get(key) == wanted:
                continue
            self.inventory.release(key)
            if wanted is None:
                continue
            try:
                self.inventory.reserve(key, wanted)
            except ReservationConflict as err:
                # The GPUs were written by the server under its own rules; a conflict here means
                # cards of one key disagree in our picture for a moment (a multi-card write in
                # flight). The next event of those cards settles it.
                logger.debug("reservation not mirrored yet", extra={"key": key, "error": str(err)})

    def reserve_tentative(self, key: str, placement: Placement) -> None:
        """Reserve `placement` for `key` in the inventory before its GPU write (so the next
        claim of a batch sees it); `drop_tentative` undoes it if the write fails. Raises
        `ReservationConflict` as `Inventory.reserve` does."""
        self.inventory.reserve(key, placement)
        self._tentative[key] = time.monotonic()

    def repair_inventory(self, *, tentative_for_s: float = 120.0) -> list[str]:
        """Make the inventory equal what the GPU objects hold (level-based, for the resync):
        release what no object holds (except a tentative reservation younger than
        `tentative_for_s`: its write is in flight) and mirror again every key whose share on a
        card differs from the object's. Returns the keys it had to change: each is a drift a
        faster path should have prevented. Compares per card, without building placements
        (60-80 ms for 10,000 cards and 50,000 reservations, here)."""
        now = time.monotonic()
        changed: set[str] = set()
        for key in list(self.inventory.reservations):
            if key in self._holders:
                continue
            since = self._tentative.get(key)
            if since is not None and now - since < tentative_for_s:
                continue
            self._tentative.pop(key, None)
            self.inventory.release(key)
            changed.add(key)
        for record in self._gpus.values():
            try:
                holders = self.inventory.card(record.uuid).holders
            except UnknownObject:
                continue
            for key, cores, memory, whole in record.all_shares():
                share = holders.get(key)
                if share is None or (share.cores, share.memory_mib, share.whole) != (cores, memory, whole):
                    changed.add(key)
            held = record.keys()
            changed.update(k for k in holders if k not in held and k not in self._tentative)
        self._resync_keys(sorted(changed))
        return sorted(changed)

    def drop_tentative(self, key: str) -> None:
        """Undo a tentative reservation (a batch's write of it failed): the inventory goes back
        to what the GPU objects hold for `key`, which may be that very reservation when the
        write was applied and only its answer was lost (its watch event arrived first)."""
        self._tentative.pop(key, None)
        tentative = self.inventory.release(key)
        keys = {key}
        for share in tentative.cards if tentative is not None else ():
            # The tentative share may have kept a reservation the objects hold from being
            # mirrored on that card (`_resync_keys` refuses what does not fit): mirror it now.
            keys |= self._holders.keys_on(self._uuid_to_name.get(share.uuid, ""))
        self._resync_keys(sorted(keys))

    def _gpus_holding(self, key: str) -> list[str]:
        return sorted(self._holders.gpus_holding(key))

    def gpus_holding(self, key: str) -> list[str]:
        """Names of the GPU objects with an allocation for `key`."""
        return self._gpus_holding(key)

    # -- building writes -----------------------------------------------------------------------

    def with_allocation(self, gpu_name: str, allocation: GPUAllocation) -> Body:
        """The GPU body (for a PUT of its status) with `allocation` added or replaced. Raises
        `CardOverfilled` when that would put the card over its capacity (see `_refuse_overfill`)."""
        return self.with_allocations(gpu_name, [allocation])

    def with_allocations(self, gpu_name: str, allocations: list[GPUAllocation]) -> Body:
        """The GPU body with several allocations added or replaced (one write for a batch);
        `CardOverfilled` as `with_allocation`."""
        keys = {a.elastic_gpu for a in allocations}
        body = self._body(gpu_name)
        self._refuse_closed(gpu_name, keys - {str(a.get("elasticGPU")) for a in _allocations(body)})
        kept = [a for a in _allocations(body) if a.get("elasticGPU") not in keys]
        written = kept + [a.to_dict() for a in allocations]
        self._refuse_overfill(body, written, sorted(keys))
        return self._status_body(body, written)

    def _refuse_closed(self, gpu_name: str, new_keys: set[str]) -> None:
        """The owner half of the last check (docs/dra.md: new reservations stop the moment spec.owner
        changes): a decision made on a copy from before the platform team set spec.owner to DRA must
        not land on the card, and the picture's newest resourceVersion would let it through (only
        status.owner DRA is refused by the CRD). Adding a holder to a card not ours alone is refused;
        changing a reservation the card already holds (a claimRef stamp, a resize) or removing one is not."""
        record = self._gpus[gpu_name]
        if new_keys and not record.open:
            raise CardClosed(
                f"GPU {gpu_name}: not reserving {', '.join(sorted(new_keys))}: the card is moving to DRA or is"
                f" DRA's (spec.owner {record.owner}, status.owner {record.effective_owner}) since"
                " the decision; deciding again")

    def _refuse_overfill(self, body: Body, allocations: list[Body], keys: list[str]) -> None:
        """The last check before a write, whatever decided it: the body is built from the card
        as the picture holds it now, with its newest resourceVersion, so a decision made on an
        older copy (another controller's write arrived in between) would pass the server's
        precondition and oversubscribe the card. A write that leaves the card over capacity and
        holding more than it does now is refused; one that only keeps or lowers what an already
        overfull card holds (a release, a claimRef stamp) goes through."""
        spec = self._model(body["metadata"]["name"]).spec
        before = _load(_allocations(body))
        after = _load(allocations)
        cores, memory, count, whole = after
        overfull = cores > names.CORES_PER_CARD or memory > spec.memory or (whole and count > 1)
        if overfull and (cores > before[0] or memory > before[1] or count > before[2]):
            raise CardOverfilled(
                f"GPU {body['metadata']['name']}: writing {', '.join(keys)} would reserve {cores}% cores and "
                f"{memory} MiB of its 100% and {spec.memory} MiB{' beside a whole-card claim' if whole else ''}:"
                " the card changed since the decision; deciding again")
        # MIG instances must also keep to their slots: two on one slice fit the sums and still clash.
        model = model_for(spec.model, spec.memory)
        instances, held = _partitions(allocations), _partitions(_allocations(body))
        if model is not None and instances != held and partitions_fit(model, held) and not partitions_fit(
                model, instances):
            raise CardOverfilled(
                f"GPU {body['metadata']['name']}: writing {', '.join(keys)} would put MIG instances {instances}"
                " on shared slices: the card changed since the decision; deciding again")

    def without_allocation(self, gpu_name: str, key: str) -> Body | None:
        """The GPU body with `key`'s allocation removed, or None when it holds none."""
        body = self._body(gpu_name)
        allocations = _allocations(body)
        kept = [a for a in allocations if a.get("elasticGPU") != key]
        if len(kept) == len(allocations):
            return None
        return self._status_body(body, kept)

    def _status_body(self, body: Body, allocations: list[Body]) -> Body:
        name = body["metadata"]["name"]
        model = self._model(name)
        status = dict(body.get("status") or {})
        status["allocations"] = allocations
        cores = sum(int(a.get("cores", 0)) for a in allocations)
        memory = sum(int(a.get("memory", 0)) for a in allocations)
        whole = any(a.get("exclusive") for a in allocations)
        free_cores = 0 if whole else max(0, names.CORES_PER_CARD - cores)
        free_memory = 0 if whole else max(0, model.spec.memory - memory)
        status["allocatable"] = {
            names.RESOURCE_CORE: free_cores,
            names.RESOURCE_MEMORY: format_memory(free_memory) if free_memory else "0",
        }
        status["allocatableSummary"] = allocatable_summary(free_cores, free_memory)
        return {
            "apiVersion": body.get("apiVersion", names.API_VERSION),
            "kind": body.get("kind", names.KIND_GPU),
            "metadata": body["metadata"],
            "spec": body["spec"],
            "status": status,
        }


def allocation_for(key: str, share: CardShare, claim_ref: ObjectReference | None,
                   partition: GPUPartition | None = None) -> GPUAllocation:
    """The `status.allocations` entry of one card of a placement (with its MIG instance's
    `partition` for a class with partitioning: MIG)."""
    return GPUAllocation.model_validate(
        {
            "elasticGPU": key,
            "claimRef": claim_ref.to_dict() if claim_ref else None,
            "cores": share.cores,
            "memory": share.memory_mib,
            "exclusive": share.whole,
            "reservedAt": timestamps.now_rfc3339(),
            "partition": partition.to_dict() if partition is not None else None,
        }
    )


def _allocations(body: Body) -> list[Body]:
    return list((body.get("status") or {}).get("allocations") or [])


def _partitions(allocations: list[Body]) -> list[tuple[str, int]]:
    """The (profile, start) of each MIG instance the allocations hold."""
    return sorted((str(p["profile"]), int(p["start"])) for a in allocations if (p := a.get("partition")))


def _load(allocations: list[Body]) -> tuple[int, int, int, bool]:
    """Cores and MiB reserved, how many allocations, and whether one takes the card whole."""
    return (sum(int(a.get("cores", 0)) for a in allocations), sum(int(a.get("memory", 0)) for a in allocations),
            len(allocations), any(a.get("exclusive") for a in allocations))

