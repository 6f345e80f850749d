"""How the ledger keeps its GPU objects: a small record of what the hot paths read, the body's
JSON, and a bounded cache of the `GPU` models built again from that JSON (issue 49 item 2).

At 40,000 cards the ledger held per GPU its JSON (~1.1 KB), its full pydantic model (~7 KB of
~8.7 KB: spec, capacity, conditions, usage, running claims, every allocation) and a dict of its
allocations. Nearly every question the ledger answers per event asks a few fields: the node and
uuid (the inventory's card), whether the card is in MIG mode, its health and owners, its
isolation modes, and each reservation's size (what the inventory mirrors). So `GPURecord`
keeps those and the `compact.Packed` JSON; a reader that asks for the model (`Ledger.gpu`, a
write, a decision on one card) gets it built again from the JSON by the same validation that
checked it at take-in (`Models`), and the `CACHE_SIZE` models built or taken in last stay built
(the sync a watch event or a write wakes finds its card's model ready). This is
`records.Models`' trick for claims and ElasticGPUs, for the GPUs.

At take-in every body is still validated whole as a `GPU` (`take_in`): a body the model refuses
is refused as before, however little of it the record keeps.

A leaf: it calls back into no module of the picture but `compact`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from elasticgpu.allocator import CardRecord, Health
from elasticgpu.api import GPU, names
from elasticgpu.api.gpu import GPULimit, effective_owner, open_to_elastic_gpu
from elasticgpu.controller.picture import compact

Body = dict[str, Any]

CACHE_SIZE = 2048
"""GPU models kept built: those taken in or read last (~7 KB each: ~14 MiB). A burst of binds
reads the cards it writes and their events' syncs read them again: far fewer than this. A pass
over every card (a relist's take-in) rebuilds none of them: the record answers it."""

_OWNERS = {names.OWNER_ELASTIC_GPU: names.OWNER_ELASTIC_GPU, names.OWNER_DRA: names.OWNER_DRA}

UNSHARED = 256
"""Models taken in and not read yet kept in the cache, at most: one whose field sets are its own is
~15 KB with four reservations (6.7 KB shared), and a list puts every card's; the oldest of them
leave the cache first (a sync that reads one builds it again, ~40 us)."""

Share = tuple[str, int, int, bool]
"""One reservation as the inventory mirrors it: (ElasticGPU name, cores, MiB, whole card)."""


class GPURecord:
    """What the ledger reads of one GPU object per event, and the object's JSON (`packed`).

    `card` is the allocator's record of the card (`CardRecord.from_gpu`, the one the inventory
    was given): two copies of an object whose cards differ (spec, health, isolation), or whose
    MIG mode or owner differ, are re-added to the inventory, as the old models' `spec !=` did
    (a spec change the card does not show, numa absent or 0, would re-add an equal card)."""

    __slots__ = ("card", "effective_owner", "limits", "mig", "open", "owner", "packed", "said_unhealthy", "shares")

    def __init__(self, model: GPU, packed: compact.Packed) -> None:
        spec, status = model.spec, model.status
        self.packed = packed
        # The model's strings are its own (validated from the JSON, `compact.kept`).
        self.card = CardRecord.from_gpu(model)
        self.mig: bool = spec.mig
        self.said_unhealthy = status.health == "Unhealthy"
        """Whether its agent says Unhealthy (status.health), whoever owns the card."""
        # The limits of the reservations under a resize, by key; None (nearly always) when none.
        self.limits: dict[str, GPULimit] | None = {
            a.elastic_gpu: a.limit for a in status.allocations if a.limit is not None} or None
        # The two owners' constant strings, not the model's copy of one per card.
        self.owner: str = _OWNERS.get(spec.owner, spec.owner)
        now = effective_owner(model)
        self.effective_owner: str = _OWNERS.get(now, now)
        self.open = open_to_elastic_gpu(model)
        """`api.gpu.open_to_elastic_gpu`: our allocator may place on the card."""
        # Flat (key, cores, MiB, whole, key, ...): a tuple per reservation was ~70 bytes more each.
        self.shares: tuple[str | int | bool, ...] = tuple(
            field for a in status.allocations for field in (a.elastic_gpu, a.cores, a.memory, a.exclusive))

    @property
    def uuid(self) -> str:
        """spec.uuid."""
        return self.card.uuid

    @property
    def node(self) -> str:
        """spec.nodeName."""
        return self.card.node

    @property
    def health(self) -> Health:
        """The card's health by its object (`health_of`), before the ledger's readiness."""
        return self.card.health

    def share(self, key: str) -> Share | None:
        """The reservation of `key` on the card, or None (a card holds a handful: a scan; the
        last of a key, as the old dict by key kept)."""
        shares = self.shares
        for i in range(len(shares) - 4, -1, -4):
            if shares[i] == key:
                return key, int(shares[i + 1]), int(shares[i + 2]), bool(shares[i + 3])
        return None

    def all_shares(self) -> list[Share]:
        """Every reservation on the card, in the object's order."""
        shares = self.shares
        return [(str(shares[i]), int(shares[i + 1]), int(shares[i + 2]), bool(shares[i + 3]))
                for i in range(0, len(shares), 4)]

    def sizes(self) -> dict[str, tuple[int, int, GPULimit | None]]:
        """Each reservation's (cores, MiB, limit) by key, as the model's allocations say."""
        limits = self.limits or {}
        return {key: (cores, memory, limits.get(key)) for key, cores, memory, _whole in self.all_shares()}

    def keys(self) -> set[str]:
        """The ElasticGPU names the card holds a reservation for."""
        return {str(key) for key in self.shares[::4]}

    def same_card(self, other: GPURecord) -> bool:
        """Whether `other` is the same card to the inventory (see the class docstring)."""
        return self.card == other.card and self.mig == other.mig and self.owner == other.owner

    def owner_moving(self) -> bool:
        """Whether spec.owner differs from the effective owner (`api.gpu.effective_owner`): a move
        between ElasticGPU and DRA is under way."""
        return self.owner != self.effective_owner


def health_of(model: GPU) -> Health:
    """The card's health to the allocator: Unhealthy when its agent says so, and when the card is
    not ours alone (spec.owner or status.owner DRA: it takes no new reservation)."""
    return Health.UNHEALTHY if model.status.health == "Unhealthy" or not open_to_elastic_gpu(model) else Health.HEALTHY


def take_in(body: Body) -> tuple[GPURecord, GPU]:
    """The record of a GPU body from a list, watch event or write, and its model (validated whole,
    as before: a body the model refuses raises pydantic's ValidationError here)."""
    packed, model = compact.kept(body, GPU, share=False)  # `Models.put` shares on first read
    return GPURecord(model, packed), model


class Models:
    """The GPU models built last, by object name, oldest first; built again from a record's JSON
    on a miss (see the module docstring). A lock of its own: a read moves the entry (and may
    evict one), and some readers of the ledger's models (a pod's sync) hold no picture lock."""

    def __init__(self, cache_size: int | None = None) -> None:
        """`cache_size`: `CACHE_SIZE` when None (read now: a test sets it smaller than its fleet)."""
        self._cache_size = CACHE_SIZE if cache_size is None else cache_size
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, tuple[GPURecord, GPU]] = OrderedDict()
        """By name: the record a model was built from or taken in with, and the model. A model
        answers only for its own record: one built by a reader while a newer copy was taken in
        is never handed out for the newer one."""
        self._unshared: OrderedDict[str, None] = OrderedDict()
        """Cached models taken in and not read yet, oldest first (at most `UNSHARED`): their field sets
        are shared (`compact.share_fields`) at their first read, not at take-in, where it was a quarter
        of a GPU's CPU and most of a list's models leave the cache unread."""

    def get(self, name: str, record: GPURecord) -> GPU:
        """The model of `record` (GPU `name`): the cached one, or one built from its JSON."""
        with self._lock:
            found = self._cache.get(name)
            if found is not None and found[0] is record:
                self._cache.move_to_end(name)
                if self._unshared.pop(name, False) is None:
                    compact.share_fields(found[1])
                return found[1]
        data = record.packed.json()
        # The same validation as the model taken in (`compact.kept`): the model is equal to it.
        model = compact.share_fields(GPU.model_validate_json(data) if data is not None
                                     else GPU.model_validate(record.packed.body()))
        with self._lock:
            self._remember(name, record, model)  # if a newer copy came meanwhile, its read misses
        return model

    def put(self, name: str, record: GPURecord, model: GPU) -> None:
        """Keep `model` built as GPU `name`'s newest (a copy just taken in, its field sets its own:
        shared when first read)."""
        with self._lock:
            self._remember(name, record, model)
            self._unshared[name] = None
            while len(self._unshared) > UNSHARED:
                self._cache.pop(self._unshared.popitem(last=False)[0], None)

    def _remember(self, name: str, record: GPURecord, model: GPU) -> None:
        self._unshared.pop(name, None)
        self._cache[name] = (record, model)
        self._cache.move_to_end(name)
        while len(self._cache) > self._cache_size:
            self._unshared.pop(self._cache.popitem(last=False)[0], None)

    def pop(self, name: str) -> None:
        """Forget GPU `name`'s model (the object is gone or changed)."""
        with self._lock:
            self._cache.pop(name, None)
            self._unshared.pop(name, None)

    def __len__(self) -> int:
        return len(self._cache)


__all__ = ["CACHE_SIZE", "UNSHARED", "GPURecord", "Models", "Share", "health_of", "take_in"]
