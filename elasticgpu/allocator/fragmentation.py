"""Fragmentation of a node against a target workload (Weng et al., USENIX ATC'23).

For one request shape, a node's free GPU capacity (in cores, percent of a card) is:
- all fragmented when the node cannot host the shape at all (too few cards that fit, a model
  the shape excludes, or too little CPU left for it);
- otherwise, fragmented on the cards too small for one unit of the shape.
A node's fragmentation is the popularity-weighted sum over the workload's shapes. The
fragmentation-gradient policy places each request where this sum grows least.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import NamedTuple

import numpy as np

from elasticgpu.allocator.inventory import UNTRACKED
from elasticgpu.allocator.shapes import CardSig, Shape, card_fits, model_matches
from elasticgpu.allocator.workloads import Workload
from elasticgpu.api import names


class FragmentationModel:
    """Fragmentation of node states for one workload, memoised by state.

    A shape the node's free CPU or main memory cannot host sees all of its free GPU as
    fragmented (the paper counts CPU; counting memory too is ours: on the openb trace most
    GPUs left idle sit on nodes whose memory is gone). Only the ordering of free CPU and
    memory against the workload's needs matters, so the node's (CPU, memory) pair is reduced
    to a bucket and the memo key is (cards, bucket). Shapes that differ only in CPU and memory
    share one pass over the cards (the GPU part decides which cards fit).

    `memory=False` ignores main memory (the paper's model).
    """

    def __init__(self, workload: Workload, *, memory: bool = True) -> None:
        self.workload = workload
        self.memory = memory
        self._cpu_steps = sorted({s.cpu_milli for s in workload.shapes if s.cpu_milli > 0})
        self._mem_steps = sorted({s.pod_memory for s in workload.shapes if s.pod_memory > 0}) if memory else []
        self._mems = len(self._mem_steps) + 1
        self.buckets = (len(self._cpu_steps) + 1) * self._mems
        groups: dict[Shape, list[tuple[int, int, float]]] = {}
        for shape, weight in zip(workload.shapes, workload.weights, strict=True):
            gpu_part = shape._replace(cpu_milli=0, pod_memory=0)
            groups.setdefault(gpu_part, []).append((shape.cpu_milli, shape.pod_memory if memory else 0, weight))
        # Per GPU part and bucket: the weight of its shapes that a node in the bucket can host
        # (CPU and memory), as a 2-D cumulative sum over the workload's steps.
        self._groups: list[tuple[Shape, list[float], float]] = []
        for gpu_part, entries in groups.items():
            grid = np.zeros((len(self._cpu_steps) + 1, self._mems))
            for cpu, mem, weight in entries:
                grid[bisect_left(self._cpu_steps, cpu) + (cpu > 0), bisect_left(self._mem_steps, mem) + (mem > 0)] += (
                    weight
                )
            by_bucket = grid.cumsum(axis=0).cumsum(axis=1).ravel().tolist()
            self._groups.append((gpu_part, by_bucket, sum(w for _, _, w in entries)))
        self._memo: dict[tuple[tuple[CardSig, ...], int], float] = {}

    def bucket(self, cpu_free: int, memory_free: int = UNTRACKED) -> int:
        """Which of the workload's CPU and memory needs a node with this much free can meet."""
        return bisect_right(self._cpu_steps, cpu_free) * self._mems + bisect_right(self._mem_steps, memory_free)

    def node(self, cards: tuple[CardSig, ...], cpu_free: int, memory_free: int = UNTRACKED) -> float:
        """Fragmented cores of a node with these usable cards and this much free CPU/memory."""
        bucket = self.bucket(cpu_free, memory_free)
        key = (cards, bucket)
        value = self._memo.get(key)
        if value is None:
            if len(self._memo) > 1_000_000:  # bound memory on very long runs
                self._memo.clear()
            value = self._compute(cards, bucket)
            self._memo[key] = value
        return value

    def _compute(self, cards: tuple[CardSig, ...], bucket: int) -> float:
        total_free = 0
        for card in cards:
            total_free += card.free_cores
        if total_free == 0:
            return 0.0
        frag = 0.0
        for shape, by_bucket, weight in self._groups:
            cpu_ok = by_bucket[bucket]
            # Shapes whose CPU the node lacks see all its free GPU as fragmented.
            frag += (weight - cpu_ok) * total_free
            if cpu_ok:
                frag += cpu_ok * self._for_gpu_part(shape, cards, total_free)
        return frag

    @staticmethod
    def _for_gpu_part(shape: Shape, cards: tuple[CardSig, ...], total_free: int) -> int:
        fitting = 0
        unusable = 0
        if shape.cards == 0 and shape.memory_mib is None and not shape.models:
            # The common case (a share with memory in proportion), inlined for speed.
            cores = shape.cores
            for card in cards:
                if card.free_cores >= cores and card.free_memory >= card.memory * cores // 100:
                    fitting += 1
                else:
                    unusable += card.free_cores
        else:
            for card in cards:
                if card_fits(shape, card):
                    fitting += 1
                else:
                    unusable += card.free_cores
        needed = shape.cards if shape.cards > 0 else 1
        if fitting < needed:
            return total_free
        return unusable

    def cluster(self, nodes: list[tuple[tuple[CardSig, ...], int]]) -> float:
        """Fragmented cores of many nodes, each given as (cards, cpu_free)."""
        return sum(self.node(cards, cpu) for cards, cpu in nodes)


class BucketTables(NamedTuple):
    """The fast path's tables for one card model and one CPU/memory bucket."""

    spread: float
    """Weight per free core that is fragmented whatever the cards: shapes the node's CPU or
    memory cannot host, and whole-card shapes (their usable free cards are taken off via
    `whole`)."""
    per_card: list[float]
    """`per_card[f]`: f * (weight of the share shapes that cannot use a card with f free)."""
    whole: list[float]
    """`whole[k]`: weight of the whole-card shapes of at most k cards (they can run on a
    node with k free cards, which then are not fragmented for them)."""


class NodeView(NamedTuple):
    """A node as the fast path sees it: one card model, every card's memory at least in
    proportion to its free cores (so a proportional share fits wherever its cores fit)."""

    key: int
    """Interned id of (model class, frees, full): states with equal keys fragment alike for
    every shape without a model constraint of its own."""
    model_key: int
    """Interned id of (model, frees, full), for shapes that name models."""
    model: str
    kind: tuple[bool, ...]
    """The model's class: which of the workload's model globs it matches (models of one
    class share tables)."""
    frees: tuple[int, ...]
    """Free cores of each usable card that has any, ascending (empty cards change nothing)."""
    full: int
    """Cards nobody holds (free whole): what whole-card requests can take."""
    total: int


class FastFragmentation:
    """The same fragmentation as `FragmentationModel`, computed per card from tables.

    Valid when every workload shape is a proportional share or whole cards without a memory
    floor. For a share of `c` cores a card with `f` free cores is fragmented exactly when
    `f < c` (or its model is excluded), so a node's share part is a sum over its cards of
    `f * (weight of the shares that cannot use f)`: one table lookup per card. A whole-card
    shape of `k` cards sees all free GPU as fragmented on a node with fewer than `k` free
    cards, else all but the free cards: a function of (free total, free cards) alone. Moves
    are then scored in O(cards) without building the state after them.
    """

    def __init__(self, model: FragmentationModel) -> None:
        self.model = model
        self.buckets = model.buckets
        self.shares: list[tuple[int, tuple[str, ...], list[float]]] = []
        self.wholes: list[tuple[int, tuple[str, ...], list[float]]] = []
        self.valid = True
        for shape, by_bucket, _ in model._groups:
            if shape.memory_mib is not None or shape.cards < 0:
                self.valid = False
            elif shape.cards == 0:
                self.shares.append((shape.cores, shape.models, by_bucket))
            else:
                self.wholes.append((shape.cards, shape.models, by_bucket))
        self._total_weight = sum(weight for _, _, weight in model._groups)
        self._max_cards = max((cards for cards, _, _ in self.wholes), default=0)
        self._tables: dict[tuple[tuple[bool, ...], int], BucketTables] = {}
        self._globs = sorted({models for _, models, _ in self.shares + self.wholes if models})
        self._kinds: dict[str, tuple[bool, ...]] = {}
        self._keys: dict[tuple[object, ...], int] = {}
        self._next_key = 0  # never reused, so a cleared `_keys` cannot alias old memo entries

    def tables(self, model: str, bucket: int) -> BucketTables:
        """The tables for one card model's class and bucket (built on first use)."""
        key = (self.kind(model), bucket)
        cached = self._tables.get(key)
        if cached is not None:
            return cached
        # Shapes the node's CPU or memory cannot host see all of its free GPU as fragmented.
        spread = self._total_weight - sum(g[1][bucket] for g in self.model._groups)
        whole = [0.0] * (self._max_cards + 1)
        for cards, models, by_bucket in self.wholes:
            weight = by_bucket[bucket]
            spread += weight
            if not models or model_matches(model, models):
                for k in range(cards, self._max_cards + 1):
                    whole[k] += weight
        # per_card[f] = f * (weight of the shares with more cores than f, or another model).
        steps = np.zeros(names.CORES_PER_CARD + 2)
        for cores, models, by_bucket in self.shares:
            weight = by_bucket[bucket]
            steps[0] += weight
            if not models or model_matches(model, models):
                steps[cores] -= weight
        per_card = (np.cumsum(steps[:-1]) * np.arange(names.CORES_PER_CARD + 1)).tolist()
        cached = BucketTables(spread, per_card, whole)
        self._tables[key] = cached
        return cached

    def kind(self, model: str) -> tuple[bool, ...]:
        """The class of a card model: which of the workload's model globs it matches."""
        kind = self._kinds.get(model)
        if kind is None:
            kind = tuple(model_matches(model, globs) for globs in self._globs)
            self._kinds[model] = kind
        return kind

    def _intern(self, state: tuple[object, ...]) -> int:
        key = self._keys.get(state)
        if key is None:
            if len(self._keys) > 1_000_000:  # bound memory on very long runs
                self._keys.clear()
            key = self._next_key
            self._next_key += 1
            self._keys[state] = key
        return key

    def view(self, cards: tuple[CardSig, ...]) -> NodeView | None:
        """The node's view, or None when the fast path does not apply to it."""
        if not self.valid or not cards:
            return None
        model = cards[0].model
        frees = []
        full = 0
        for card in cards:
            if card.model != model or card.free_memory < card.memory * card.free_cores // names.CORES_PER_CARD:
                return None
            if card.free_cores:
                frees.append(card.free_cores)
                if card.idle and card.free_cores == names.CORES_PER_CARD:
                    full += 1
        frees.sort()
        shape = tuple(frees)
        kind = self.kind(model)
        return NodeView(
            self._intern((kind, shape, full)), self._intern((model, shape, full)), model, kind, shape, full, sum(frees)
        )

    @staticmethod
    def _value(tables: BucketTables, total: int, part: float, full: int) -> float:
        whole = tables.whole
        return tables.spread * total + part - names.CORES_PER_CARD * full * whole[full if full < len(whole) else -1]

    def value(self, view: NodeView, bucket: int) -> float:
        """Fragmented cores of the node in this bucket (as `FragmentationModel.node`)."""
        tables = self.tables(view.model, bucket)
        row = tables.per_card
        return self._value(tables, view.total, sum(row[f] for f in view.frees), view.full)

    def deltas(self, view: NodeView, before: int, after: int, shape: Shape) -> list[tuple[float, int, int]]:
        """(fragmentation growth, free cores left on the node, a move token) of every distinct
        move of `shape`, whose CPU and memory move the node from bucket `before` to `after`.
        The token of a share is `2 * free + idle`: the free cores of the card it goes to, and
        whether that card is a free card nobody holds; -1 for whole cards and for no GPU."""
        frees = view.frees
        total, full = view.total, view.full
        cache = self._tables
        t0 = cache.get((view.kind, before)) or self.tables(view.model, before)
        row0 = t0.per_card
        shared0 = sum(map(row0.__getitem__, frees))
        base = self._value(t0, total, shared0, full)
        if after == before:
            t1, row1, shared1 = t0, row0, shared0
        else:
            t1 = cache.get((view.kind, after)) or self.tables(view.model, after)
            row1 = t1.per_card
            shared1 = sum(map(row1.__getitem__, frees))
        value = self._value
        if shape.cards < 0:
            return [(value(t1, total, shared1, full) - base, total, -1)]
        if shape.models and not model_matches(view.model, shape.models):
            return []
        if shape.cards > 0:
            if full < shape.cards:
                return []
            left = total - names.CORES_PER_CARD * shape.cards
            part = shared1 - shape.cards * row1[names.CORES_PER_CARD]
            return [(value(t1, left, part, full - shape.cards) - base, left, -1)]
        cores = shape.cores
        left = total - cores
        out = []
        seen = -1
        held_full = frees.count(names.CORES_PER_CARD) - full  # free cards that hold a memory-only share
        for free in frees:
            if free < cores or free == seen:
                continue
            seen = free
            part = shared1 - row1[free] + row1[free - cores]
            if free == names.CORES_PER_CARD:
                if held_full:
                    out.append((value(t1, left, part, full) - base, left, 2 * free))
                if full:
                    out.append((value(t1, left, part, full - 1) - base, left, 2 * free + 1))
            else:
                out.append((value(t1, left, part, full) - base, left, 2 * free))
        return out
