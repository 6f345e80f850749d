"""Canonical, hashable forms of node states and request shapes, the keys of every score cache.

Two nodes with the same signature score the same for any request shape, whatever their names:
most of a large cluster shares a few signatures (all empty nodes of a type, for a start), so
a score is computed once per (signature, shape) and reused.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import NamedTuple

from elasticgpu.allocator.inventory import CardState, NodeState
from elasticgpu.allocator.records import Health, PlacementRequest
from elasticgpu.api import names


class CardSig(NamedTuple):
    """What a card can still take: free cores and MiB, its total MiB, whether nobody holds it."""

    free_cores: int
    free_memory: int
    memory: int
    idle: bool
    model: str


class NodeSig(NamedTuple):
    """What a node can still take: free CPU, total CPU, its usable cards in canonical order,
    how many cards it has in all (usable or not), and its free main memory (MiB)."""

    cpu_free: int
    cpu_total: int
    cards: tuple[CardSig, ...]
    gpus: int = 0
    memory_free: int = 0


class Shape(NamedTuple):
    """The part of a request that decides a node's score."""

    cards: int
    """Whole cards; 0 for a share; -1 for no GPU at all."""
    cores: int
    memory_mib: int | None
    cpu_milli: int
    models: tuple[str, ...]
    pod_memory: int = 0
    """The pod's main memory (MiB): it moves the node's memory, which fragmentation counts."""


_new_tuple = tuple.__new__  # builds NamedTuples without their Python-level __new__ (hot path)


def card_sig(card: CardState) -> CardSig:
    """Signature of a card state."""
    record = card.record
    return _new_tuple(CardSig, (card.free_cores, card.free_memory, record.memory_mib, not card.holders, record.model))


def node_sig(node: NodeState) -> NodeSig:
    """Signature of a node: Unhealthy cards and cards taken whole are left out, as they can
    take nothing new (and their capacity is not "free" for fragmentation either)."""
    healthy = Health.HEALTHY
    cards = [
        _new_tuple(CardSig, (c.free_cores, c.free_memory, c.record.memory_mib, not c.holders, c.record.model))
        for c in node.cards
        if not c.whole and c.record.health is healthy
    ]
    cards.sort()
    return _new_tuple(NodeSig, (node.cpu_free, node.record.cpu_milli, tuple(cards), len(node.cards), node.memory_free))


def shape_of(request: PlacementRequest) -> Shape:
    """The shape of a request."""
    gpu = request.gpu
    if gpu is None:
        return Shape(-1, 0, None, request.cpu_milli, request.models, request.memory_mib)
    return Shape(
        gpu.cards,
        gpu.cores if not gpu.is_whole else names.CORES_PER_CARD,
        gpu.memory_mib,
        request.cpu_milli,
        request.models,
        request.memory_mib,
    )


def share_memory(shape: Shape, card_memory: int) -> int:
    """MiB a share of `shape` takes on a card of `card_memory` MiB (as `GpuRequest.memory_on`)."""
    if shape.memory_mib is not None:
        return shape.memory_mib
    return card_memory * shape.cores // names.CORES_PER_CARD


def card_fits(shape: Shape, card: CardSig) -> bool:
    """Whether one card of this signature can take one card's worth of the shape."""
    if shape.models and not model_matches(card.model, shape.models):
        return False
    if shape.cards > 0:
        return card.idle and card.free_cores == names.CORES_PER_CARD and card.memory >= (shape.memory_mib or 0)
    return card.free_cores >= shape.cores and card.free_memory >= share_memory(shape, card.memory)


_MATCH_CACHE: dict[tuple[str, tuple[str, ...]], bool] = {}


VENDOR_PREFIXES = ("nvidia ",)
"""What NVML puts before the product ("NVIDIA A100-SXM4-80GB"): a glob may leave it out, so the
class parameter `gpuModel: A100*|H100*` that platform teams write matches the names cards report."""


def model_matches(model: str, globs: tuple[str, ...]) -> bool:
    """Whether a card model matches any of the globs (case-insensitive; `|` may join globs), with
    or without its vendor prefix (`A100*` and `NVIDIA A100*` both match `NVIDIA A100-SXM4-80GB`)."""
    key = (model, globs)
    hit = _MATCH_CACHE.get(key)
    if hit is None:
        patterns = [p.strip().lower() for g in globs for p in g.split("|") if p.strip()]
        lowered = model.lower()
        candidates = [lowered, *(lowered[len(v) :] for v in VENDOR_PREFIXES if lowered.startswith(v))]
        hit = any(fnmatchcase(name, p) for name in candidates for p in patterns)
        _MATCH_CACHE[key] = hit
    return hit
