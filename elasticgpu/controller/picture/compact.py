"""Keeping the picture small: what the controller stores of each object, and how.

At 10,000 GPUs and 50,000 claims the picture holds 100,000 objects twice (the body the server
sent and its model), and most of their bytes are bookkeeping that says the same thing for every
object of a kind:

- each pydantic model instance carries `__pydantic_fields_set__`, a set of the field names the
  input gave: 216 bytes for up to four names and 728 from five on, for every nested model, so
  about 45% of a claim's model. The sets of one kind are nearly all equal, so `share_fields`
  replaces each by one shared, immutable copy per distinct set, and every empty list or map
  field (labels, annotations, limits, gpus, users, ...: about 7 per claim, 60 bytes each) by one
  shared empty one that refuses changes;
- `metadata.managedFields` (server-side apply bookkeeping, often larger than the rest of the
  object) is never read by the controller: `strip` drops it from a body before it is stored;
- of a claim or an ElasticGPU in motion, the picture keeps the model and only the head of the
  body (`identity`: apiVersion, kind, metadata): spec and status would be a second copy of the
  model. One at rest (Bound) is kept as JSON instead, its model built when read (`records`);
- an index of members by key where nearly every key has one member (the claims naming an
  ElasticGPU) keeps a lone member bare, not in a one-element set (`Index`, `index_add`,
  `index_discard`, `index_members`); the GPU ledger's index of reservations does the same
  within the ledger (`reservations.Holders`).

Everything here is a leaf: it calls back into no module of the picture.

All are invisible to the readers: a shared set compares, iterates and copies as the original
(`model_copy` gets a mutable copy of its own), nothing reads `managedFields`, and the readers
of a stored claim or ElasticGPU body read its metadata only. Assigning a
field of a stored model raises TypeError (its set refuses the change): the picture's
models are read-only by contract (decisions run on them under the lock), and this makes a
breach of it loud instead of a silent change of a shared object.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Collection, Hashable
from typing import Any, TypeVar, get_args, get_origin

import orjson
from pydantic import BaseModel

Body = dict[str, Any]
M = TypeVar("M", bound=BaseModel)

MAX_SHARED_SETS = 4096
"""Distinct field sets kept for sharing. A kind has a handful (which optional fields the
objects use); the bound only guards against a pathological input growing the table."""


class SharedFields(set[str]):
    """A field set shared by many models: a `set` to every reader (pydantic's serializer
    requires one), refusing every change. A copy is a plain mutable set of the copier's own,
    which is what pydantic's `model_copy` and `copy.deepcopy` go on to extend."""

    __slots__ = ()

    def _refuse(self, *_args: object) -> None:
        raise TypeError("a model of the controller's picture is read-only: it shares its field set with"
                        " others; copy it (model_copy) and change the copy")

    add = discard = remove = update = difference_update = intersection_update = _refuse
    symmetric_difference_update = clear = _refuse
    __ior__ = __iand__ = __isub__ = __ixor__ = _refuse  # type: ignore[assignment]

    def pop(self) -> str:
        self._refuse()
        raise AssertionError  # unreachable

    def __copy__(self) -> set[str]:
        return set(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> set[str]:
        return set(self)


class _EmptyList(list[Any]):
    """The one empty list the picture's models share for their empty list fields (finalizers,
    conditions, gpus, ...): refuses every change; a copy is a plain list."""

    __slots__ = ()

    def _refuse(self, *_args: object) -> None:
        raise TypeError("a model of the controller's picture is read-only: its empty lists are shared;"
                        " copy the list (list(...)) and change the copy")

    append = extend = insert = remove = clear = sort = reverse = _refuse  # type: ignore[assignment]
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse  # type: ignore[assignment]

    def pop(self, *_args: object) -> Any:
        self._refuse()

    def __copy__(self) -> list[Any]:
        return []

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        return []


class _EmptyMap(dict[Any, Any]):
    """The one empty map the picture's models share for their empty map fields (labels,
    annotations, capacity, ...): refuses every change; a copy is a plain dict."""

    __slots__ = ()

    def _refuse(self, *_args: object, **_kwargs: object) -> None:
        raise TypeError("a model of the controller's picture is read-only: its empty maps are shared;"
                        " copy the map (dict(...)) and change the copy")

    __setitem__ = __delitem__ = setdefault = update = popitem = clear = _refuse  # type: ignore[assignment]
    __ior__ = _refuse  # type: ignore[assignment]

    def pop(self, *_args: object) -> Any:
        self._refuse()

    def __copy__(self) -> dict[Any, Any]:
        return {}

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[Any, Any]:
        return {}


EMPTY_LIST: list[Any] = _EmptyList()
EMPTY_MAP: dict[Any, Any] = _EmptyMap()

_shared: dict[frozenset[str], SharedFields] = {}
_shared_lock = threading.Lock()


def _shared_set(fields: set[str] | frozenset[str]) -> SharedFields | None:
    key = frozenset(fields)
    found = _shared.get(key)
    if found is not None:
        return found
    with _shared_lock:
        if len(_shared) >= MAX_SHARED_SETS:
            return None
        return _shared.setdefault(key, SharedFields(key))


def share_fields(model: M) -> M:
    """`model` with the field set of it and of every model nested in it (in fields, lists and
    dict values) replaced by a shared one; the same object, returned for convenience."""
    # Every watch event and every model the picture builds again from JSON passes here: the
    # loop binds what it calls to locals and reads one plan per class (~6 µs for a claim).
    stack: list[BaseModel] = [model]
    pop, push, extend = stack.pop, stack.append, stack.extend
    shared_sets = _shared
    while stack:
        item = pop()
        fields = item.__pydantic_fields_set__
        if type(fields) is not SharedFields:
            shared = shared_sets.get(frozenset(fields)) or _shared_set(fields)
            if shared is not None:
                _set_fields_set(item, shared)
        values = item.__dict__
        for name, container, nesting in _plan(type(item)):
            value = values.get(name)
            if not value:
                if container and value is not None:  # exactly an empty list or map: the shared one
                    kind = type(value)
                    if kind is list:
                        values[name] = EMPTY_LIST
                    elif kind is dict:
                        values[name] = EMPTY_MAP
                continue  # None, or an empty list or map: the common case, and nothing to walk
            if not nesting:
                continue
            # By type, not isinstance: BaseModel's metaclass is an ABCMeta, whose isinstance
            # costs about a microsecond, and this runs for every nested value.
            kind = type(value)
            if kind is list:
                extend(v for v in value if _is_model(type(v)))
            elif kind is dict:
                extend(v for v in value.values() if _is_model(type(v)))
            elif _is_model(kind):
                push(value)
    return model


_model_kinds: dict[type, bool] = {}


def _is_model(kind: type) -> bool:
    """True when `kind` is a pydantic model class (remembered per class)."""
    found = _model_kinds.get(kind)
    if found is None:
        found = _model_kinds[kind] = issubclass(kind, BaseModel)
    return found


_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
"""The slot's own setter: what `object.__setattr__` ends in, without the lookup."""

_plans: dict[type[BaseModel], tuple[tuple[str, bool, bool], ...]] = {}


def _plan(cls: type[BaseModel]) -> tuple[tuple[str, bool, bool], ...]:
    """What `share_fields` looks at in a model of `cls`: (field, typed as a list or a map, can
    hold a model) for every field that is either."""
    found = _plans.get(cls)
    if found is None:
        containers, nesting = _container_fields(cls), _nesting_fields(cls)
        found = tuple((name, name in containers, name in nesting)
                      for name in cls.model_fields if name in containers or name in nesting)
        _plans[cls] = found
    return found


_nesting: dict[type[BaseModel], tuple[str, ...]] = {}
_containers: dict[type[BaseModel], tuple[str, ...]] = {}


def _container_fields(cls: type[BaseModel]) -> tuple[str, ...]:
    """The fields of `cls` typed as a list or a map (labels, finalizers, conditions, ...)."""
    found = _containers.get(cls)
    if found is None:
        found = tuple(name for name, info in cls.model_fields.items() if _is_container(info.annotation))
        _containers[cls] = found
    return found


def _is_container(annotation: Any) -> bool:
    if get_origin(annotation) in (list, dict):
        return True
    return any(_is_container(arg) for arg in get_args(annotation))


def _nesting_fields(cls: type[BaseModel]) -> tuple[str, ...]:
    """The fields of `cls` whose type can hold a model (directly, in a list or as dict values):
    the walk skips the others (labels, quantities, plain lists)."""
    found = _nesting.get(cls)
    if found is None:
        found = tuple(name for name, info in cls.model_fields.items() if _holds_model(info.annotation))
        _nesting[cls] = found
    return found


def _holds_model(annotation: Any) -> bool:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    return any(_holds_model(arg) for arg in get_args(annotation))


def strip(body: Body) -> Body:
    """The body as the picture keeps it: without `metadata.managedFields`. A copy of the top
    level and of `metadata` when there is something to drop (the caller's body is not changed);
    the body itself otherwise."""
    meta = body.get("metadata")
    if not isinstance(meta, dict) or "managedFields" not in meta:
        return body
    meta = {k: v for k, v in meta.items() if k != "managedFields"}
    return {**body, "metadata": meta}


def kept(body: Body, kind: type[M], *, share: bool = True) -> tuple[Packed, M]:
    """What the picture keeps of an object it stores whole (a GPU): its body as JSON without
    managedFields (`Packed`) and its model of `kind` with shared field sets (`share_fields`),
    validated from that JSON: pydantic parses it, so every string of the model is allocated now,
    none is the list's (`fresh`), and no dict is built in between (as fast as validating the
    dict). (Interning the body's strings saved ~1.2 KB of a GPU with four reservations, but the
    unique ones, uids and names, cost an entry of the interned table each: ~0.5 KB net, not kept.)
    `share`: False leaves the model's field sets its own (a model most likely dropped soon: the
    caller shares them if it hands the model out)."""
    packed = pack(body)
    if packed is None:
        body = strip(body)
        model = kind.model_validate(body)
    else:
        model = kind.model_validate_json(packed)
    return Packed(body, packed), share_fields(model) if share else model


def identity(body: Body) -> Body:
    """What the picture keeps of a claim's or an ElasticGPU's body besides its model:
    apiVersion, kind and metadata (without managedFields), the parts its readers use (the
    resourceVersion order, owner references, the object an Event is about). Spec and status
    live in the model alone."""
    meta = body.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        meta = {k: v for k, v in meta.items() if k != "managedFields"}
    return {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"), "metadata": meta}


def fresh(text: str) -> str:
    """A copy of `text` allocated now. What the picture keeps of a listed object must not be an
    object of the parsed list: the list's dicts are freed after the merge, but one string still
    held keeps its whole 1 MiB arena of Python's allocator in the process's memory, and a kept
    name per object kept every arena of the list (RSS ~3x the bytes the picture held)."""
    return text.encode().decode()


def own(text: str) -> str:
    """`text` as the picture's own string (`fresh`), one object for every equal name kept
    (interned: the namespace of 100,000 objects is one string; an interned string goes with
    its last holder)."""
    return sys.intern(fresh(text))


def owned_names(body: Body) -> Body:
    """The body with its metadata's name and namespace its own strings (`own`): a shallow copy of
    it and of its metadata; the keys built from it hold no string of the parsed list."""
    meta = body.get("metadata")
    if not isinstance(meta, dict):
        return body
    meta = dict(meta)
    for field in ("name", "namespace"):
        value = meta.get(field)
        if type(value) is str:
            meta[field] = own(value)
    return {**body, "metadata": meta}


def pack(body: Body) -> bytes | None:
    """The body's JSON without `metadata.managedFields`, or None when it has no JSON form
    (never from a server)."""
    try:
        packed = orjson.dumps(strip(body))
    except TypeError:
        return None
    # orjson's bytes keep the 4 KiB buffer they were written into (tracemalloc: 4,096 bytes
    # each for 0.5 KB of JSON): the copy is exact, and costs ~0.3 µs.
    return bytes(memoryview(packed))


def fresh_body(body: Body) -> tuple[Body, bytes | None]:
    """The body (without managedFields) parsed again from its JSON, and that JSON (None, and the
    stripped body itself, when it has no JSON form). What the picture keeps of an object (its
    model's strings, its keys, the head of its body) then holds nothing of the list or event it
    came in (see `fresh`): the list's arenas go back once it is freed. ~6-9 µs an object."""
    packed = pack(body)
    if packed is None:
        return strip(body), None
    loaded: Body = orjson.loads(packed)
    return loaded, packed


class Packed:
    """A body the picture keeps whole but reads rarely (a pod, a GPU object): its JSON, not its
    dict. A pod's dict from orjson held ~18 KB (3.7 KB of JSON with managedFields), a GPU's ~3 KB:
    a dict, a str and an int per field. Its JSON without managedFields is ~2.2 KB and 1.1 KB, one
    bytes object out of pymalloc's arenas. `body()` parses it again (~10-20 µs: once per sync of
    the object, not per event); `version` answers the resourceVersion questions (`versions`)
    without a parse. A body with no JSON form (never from a server) is kept as it is."""

    __slots__ = ("_data", "version")

    def __init__(self, body: Body, packed: bytes | None = None) -> None:
        """`packed`: the body's JSON when the caller has it (`fresh_body`)."""
        meta = body.get("metadata")
        version = meta.get("resourceVersion") if isinstance(meta, dict) else None
        self.version: str | None = fresh(str(version)) if version is not None else None
        if packed is None:
            packed = pack(body)
        self._data: bytes | Body = packed if packed is not None else strip(body)

    def body(self) -> Body:
        """The body as taken in (without managedFields): a fresh dict, the caller's to keep."""
        data = self._data
        if type(data) is bytes:
            loaded: Body = orjson.loads(data)
            return loaded
        assert isinstance(data, dict)
        return data

    def version_body(self) -> Body:
        """A body that carries only the resourceVersion (what `versions` compares); no parse."""
        return {"metadata": {"resourceVersion": self.version}}

    def json(self) -> bytes | None:
        """The body's JSON as kept (without managedFields), or None when it has no JSON form."""
        data = self._data
        return data if type(data) is bytes else None


K = TypeVar("K", bound=Hashable)
V = TypeVar("V", bound=Hashable)

Index = dict[K, "V | set[V]"]
"""Members by key, where nearly every key has one member (the claims naming an ElasticGPU):
a lone member is kept bare, a set only from two on (an empty set
is 216 bytes; 50,000 one-member sets were ~11 MiB per index). Members are never sets
themselves. Read and written through `index_add`, `index_discard` and `index_members`."""


def index_add(index: Index[K, V], key: K, member: V) -> None:
    """Add `member` to the members of `key`."""
    held = index.get(key)
    if held is None:
        index[key] = member
    elif isinstance(held, set):
        held.add(member)
    elif held != member:
        index[key] = {held, member}


def index_discard(index: Index[K, V], key: K, member: V) -> None:
    """Remove `member` from the members of `key`; the entry goes with its last member."""
    held = index.get(key)
    if held is None:
        return
    if isinstance(held, set):
        held.discard(member)
        if len(held) == 1:
            index[key] = next(iter(held))
        elif not held:
            del index[key]
    elif held == member:
        del index[key]


def index_members(index: Index[K, V], key: K) -> Collection[V]:
    """The members of `key` (empty when none); a live set when there are several: do not keep it."""
    held = index.get(key)
    if held is None:
        return ()
    if isinstance(held, set):
        return held
    return (held,)


__all__ = ["MAX_SHARED_SETS", "Index", "Packed", "SharedFields", "fresh", "fresh_body", "identity", "index_add",
           "index_discard", "index_members", "kept", "own", "owned_names", "pack", "share_fields", "strip"]
