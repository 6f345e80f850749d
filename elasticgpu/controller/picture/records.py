"""How the picture keeps its claims and ElasticGPUs: a model for an object in motion, the body's
JSON for an object at rest, and a small cache of the models built again from JSON.

At 50,000 Bound claims the pydantic models were most of the controller's memory: a claim is six
model instances (~2.4 KB with the head of its body beside it), an ElasticGPU about the same,
where the JSON of the same body is ~0.5 KB. Most of those objects rest: a Bound claim and its
Bound ElasticGPU are read by a resync now and then, by nothing in between. So `Models` keeps

- an object at rest (`at_rest(model)` true: a Bound claim not being deleted, a Bound
  ElasticGPU) as the JSON of its body (orjson bytes, without `metadata.managedFields`) and its
  resourceVersion; a reader that asks for it gets the model built again from that JSON by the
  same validation that built the first one (~20 µs), and the `cache_size` models built or put
  last stay built (a sync that follows a watch event or a write finds the model ready);
- an object in motion (Pending, Available, Released, Failed, being deleted, ...) as its model
  and the head of its body (`compact.identity`), as before: the deciders read those over and
  over (a waiting claim at every change of capacity).

Every model it hands out has shared field sets (`compact.share_fields`): read-only by contract,
as the picture's models always were; a caller that changes one copies it first (`model_copy`).
It does no locking of its own: it takes the lock it is given (the picture's) around each
method, since even a read moves an entry of its cache.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any, Generic, TypeVar

import orjson
from pydantic import BaseModel

from elasticgpu.controller.picture import compact

Body = dict[str, Any]
K = TypeVar("K", bound=Hashable)
M = TypeVar("M", bound=BaseModel)

CACHE_SIZE = 2048
"""Models of objects at rest kept built, per kind: those put or read last. A burst of binds
(each claim and ElasticGPU read again by the syncs its own writes wake) stays within it; a
resync of every object builds each once (~20 µs each: ~2 s of CPU for 100,000 objects)."""


class _Moving(Generic[M]):
    """An object in motion: its model and the head of its body."""

    __slots__ = ("head", "model")

    def __init__(self, model: M, head: Body) -> None:
        self.model = model
        self.head = head


class _Resting:
    """An object at rest: the JSON of its body, its resourceVersion (compared at every put) and
    its uid (a scrape asks whether the object it knows is still the one kept)."""

    __slots__ = ("packed", "uid", "version")

    def __init__(self, packed: bytes, version: str | None, uid: str | None) -> None:
        self.packed = packed
        self.version = version
        self.uid = uid


class Models(Mapping[K, M]):
    """Objects of one kind by key, each kept as `at_rest` calls for (see the module docstring).

    A `Mapping` of key to model: `get`, `[]`, `in`, `len` and iteration over keys cost no model
    built; reading values builds those at rest that are not cached (never iterate them in a
    path that runs per event)."""

    def __init__(self, model_type: type[M], *, at_rest: Callable[[M], bool], lock: threading.RLock,
                 cache_size: int = CACHE_SIZE) -> None:
        self._type = model_type
        self._at_rest = at_rest
        self._lock = lock
        self._cache_size = cache_size
        self._entries: dict[K, _Moving[M] | _Resting] = {}
        self._cache: OrderedDict[K, tuple[M, Body]] = OrderedDict()
        """Model and head of objects at rest built or put last, oldest first."""

    # -- writing ---------------------------------------------------------------------------------

    def put(self, key: K, body: Body, model: M, packed: bytes | None = None) -> None:
        """Keep the object `key`: `body` as the server sent it, `model` its validated model with
        shared field sets (`compact.share_fields`), which readers get until it is evicted;
        `packed` the body's JSON when the caller has it (`compact.fresh_body`)."""
        with self._lock:
            head = compact.identity(body)
            if not self._at_rest(model):
                packed = None
            elif packed is None:
                packed = _pack(body)
            if packed is None:
                self._cache.pop(key, None)
                self._entries[key] = _Moving(model, head)
                return
            meta = head.get("metadata") or {}
            version, uid = meta.get("resourceVersion"), meta.get("uid")
            # Strings of their own (`compact.fresh`): the body's may be a parsed list's.
            self._entries[key] = _Resting(packed, compact.fresh(version) if isinstance(version, str) else version,
                                          compact.fresh(uid) if isinstance(uid, str) else uid)
            self._remember(key, model, head)

    def pop(self, key: K) -> None:
        """Forget the object `key` (nothing when it is not kept)."""
        with self._lock:
            self._entries.pop(key, None)
            self._cache.pop(key, None)

    # -- reading ---------------------------------------------------------------------------------

    def __getitem__(self, key: K) -> M:
        with self._lock:
            entry = self._entries[key]
            if isinstance(entry, _Moving):
                return entry.model
            return self._unpacked(key, entry)[0]

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[K]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def head(self, key: K) -> Body | None:
        """The head of the object's body (apiVersion, kind, metadata: `compact.identity`), or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if isinstance(entry, _Moving):
                return entry.head
            return self._unpacked(key, entry)[1]

    def version_body(self, key: K) -> Body | None:
        """A body that carries the kept object's resourceVersion (what `versions` compares), or
        None when `key` is not kept; builds no model."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if isinstance(entry, _Moving):
                return entry.head
            return {"metadata": {"resourceVersion": entry.version}}

    def uid(self, key: K) -> str | None:
        """The kept object's uid (None: not kept); builds no model."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if isinstance(entry, _Moving):
                return (entry.head.get("metadata") or {}).get("uid")
            return entry.uid

    def rests(self, key: K) -> bool:
        """Whether the object `key` is kept at rest (as JSON)."""
        return isinstance(self._entries.get(key), _Resting)

    def resting(self) -> int:
        """How many objects are kept at rest (as JSON)."""
        with self._lock:
            return sum(1 for entry in self._entries.values() if isinstance(entry, _Resting))

    # -- the cache -------------------------------------------------------------------------------

    def _unpacked(self, key: K, entry: _Resting) -> tuple[M, Body]:
        found = self._cache.get(key)
        if found is not None:
            self._cache.move_to_end(key)
            return found
        body = orjson.loads(entry.packed)
        # The same validation as the model first kept: the model a reader gets is equal to it.
        model = compact.share_fields(self._type.model_validate(body))
        head = compact.identity(body)
        self._remember(key, model, head)
        return model, head

    def _remember(self, key: K, model: M, head: Body) -> None:
        self._cache[key] = (model, head)
        self._cache.move_to_end(key)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)


def _pack(body: Body) -> bytes | None:
    """The body's JSON without `metadata.managedFields` (`compact.pack`), or None when it has no
    JSON form (never from a server; such an object is kept as a model)."""
    return compact.pack(body)


__all__ = ["CACHE_SIZE", "Models"]
