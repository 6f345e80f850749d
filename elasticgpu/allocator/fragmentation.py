"""Fragmentation of a node against a target workload (Weng et al., USENIX ATC'23).

For one request shape, a node's free GPU capacity (in cores, percent of a card) is:
- all fragmented when the node cannot host the shape at all (too few cards that fit, a model
  the shape excludes, or too little CPU left for it);
- otherwise, fragmented on the cards too small for one unit of the shape.
A node's fragmentation is the popularity-weighted sum over the workload's shapes. The
fragmentation-gradient policy places each request where this sum grows least.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import NamedTuple

from elasticgpu.allocator.shapes import CardSig, Shape, card_fits, model_matches
from elasticgpu.allocator.workloads import Workload
from elasticgpu.api import names


class FragmentationModel:
    """Fragmentation of node states for one workload, memoised by state.

    The memo key is (cards, CPU bucket): only the ordering of free CPU against the workload's
    CPU needs matters, so nodes with different free CPU share entries. Shapes that differ only
    in CPU share one pass over the cards (the GPU part decides which cards fit).
    """

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self._cpu_steps = sorted({s.cpu_milli for s in workload.shapes if s.cpu_milli > 0})
        groups: dict[Shape, list[tuple[int, float]]] = {}
        for shape, weight in zip(workload.shapes, workload.weights, strict=True):
            gpu_part = shape._replace(cpu_milli=0)
            groups.setdefault(gpu_part, []).append((shape.cpu_milli, weight))
        # Per GPU part: the weight of its shapes whose CPU a node in each bucket can meet.
        self._groups: list[tuple[Shape, list[float], float]] = []
        for gpu_part, entries in groups.items():
            by_bucket = [
                sum(w for cpu, w in entries if cpu <= (self._cpu_steps[b - 1] if b else 0))
                for b in range(len(self._cpu_steps) + 1)
            ]
            self._groups.append((gpu_part, by_bucket, sum(w for _, w in entries)))
        self._memo: dict[tuple[tuple[CardSig, ...], int], float] = {}

    def cpu_bucket(self, cpu_free: int) -> int:
        """How many of the workload's CPU needs `cpu_free` can meet."""
        return bisect_right(self._cpu_steps, cpu_free)

    def node(self, cards: tuple[CardSig, ...], cpu_free: int) -> float:
        """Fragmented cores of a node with these usable cards and this much free CPU."""
        bucket = bisect_right(self._cpu_steps, cpu_free)
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


class ModelTables(NamedTuple):
    """The fast path's tables for one card model, per CPU bucket `b` (see `FastFragmentation`)."""

    spread: list[float]
    """Weight per free core that is fragmented whatever the cards: shapes the node's CPU
    cannot host, and whole-card shapes (a free card they use is subtracted via `whole`)."""
    per_card: list[list[float]]
    """`per_card[b][f]`: f * (weight of the share shapes that cannot use a card with f free)."""
    whole: list[list[float]]
    """`whole[b][k]`: weight of the whole-card shapes of at most k cards (they can run on a
    node with k free cards, which then are not fragmented for them)."""


class NodeView(NamedTuple):
    """A node as the fast path sees it: one card model, every card's memory at least in
    proportion to its free cores (so a proportional share fits wherever its cores fit)."""

    key: int
    """Interned id of (model, frees, full): states with equal keys fragment alike."""
    model: str
    frees: tuple[int, ...]
    """Free cores of each usable card, ascending."""
    full: int
    """Cards nobody holds (free whole): what whole-card requests can take."""
    total: int
    tables: ModelTables


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
        self.buckets = len(model._cpu_steps) + 1
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
        total_weight = sum(weight for _, _, weight in model._groups)
        # Shapes the node's CPU cannot host see all of its free GPU as fragmented.
        self._lack = [total_weight - sum(g[1][b] for g in model._groups) for b in range(self.buckets)]
        self._max_cards = max((cards for cards, _, _ in self.wholes), default=0)
        self._per_model: dict[str, ModelTables] = {}
        self._keys: dict[tuple[str, tuple[int, ...], int], int] = {}
        self._next_key = 0  # never reused, so a cleared `_keys` cannot alias old memo entries

    def tables(self, model: str) -> ModelTables:
        """The tables for one card model (built on first use)."""
        cached = self._per_model.get(model)
        if cached is not None:
            return cached
        spread = list(self._lack)
        whole = [[0.0] * (self._max_cards + 1) for _ in range(self.buckets)]
        for cards, models, by_bucket in self.wholes:
            for b in range(self.buckets):
                spread[b] += by_bucket[b]
                if not models or model_matches(model, models):
                    for k in range(cards, self._max_cards + 1):
                        whole[b][k] += by_bucket[b]
        per_card = []
        for b in range(self.buckets):
            row = []
            for free in range(names.CORES_PER_CARD + 1):
                weight = sum(
                    by_bucket[b]
                    for cores, models, by_bucket in self.shares
                    if free < cores or (models and not model_matches(model, models))
                )
                row.append(free * weight)
            per_card.append(row)
        cached = ModelTables(spread, per_card, whole)
        self._per_model[model] = cached
        return cached

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
            frees.append(card.free_cores)
            if card.idle and card.free_cores == names.CORES_PER_CARD:
                full += 1
        frees.sort()
        state = (model, tuple(frees), full)
        key = self._keys.get(state)
        if key is None:
            if len(self._keys) > 1_000_000:  # bound memory on very long runs
                self._keys.clear()
            key = self._next_key
            self._next_key += 1
            self._keys[state] = key
        return NodeView(key, model, state[1], full, sum(frees), self.tables(model))

    def _value(self, tables: ModelTables, bucket: int, total: int, part: float, full: int) -> float:
        whole = tables.whole[bucket]
        return (
            tables.spread[bucket] * total
            + part
            - names.CORES_PER_CARD * full * whole[full if full < len(whole) else -1]
        )

    def value(self, view: NodeView, bucket: int) -> float:
        """Fragmented cores of the node in this CPU bucket (as `FragmentationModel.node`)."""
        row = view.tables.per_card[bucket]
        return self._value(view.tables, bucket, view.total, sum(row[f] for f in view.frees), view.full)

    def deltas(self, view: NodeView, before: int, after: int, shape: Shape) -> list[tuple[float, int, int]]:
        """(fragmentation growth, free cores left on the node, a move token) of every distinct
        move of `shape`, whose CPU moves the node from bucket `before` to `after`. The token
        of a share is `2 * free + idle`: the free cores of the card it goes to, and whether
        that card is a free card nobody holds; -1 for whole cards and for no GPU."""
        tables = view.tables
        frees = view.frees
        total, full = view.total, view.full
        row0 = tables.per_card[before]
        shared0 = sum(row0[f] for f in frees)
        base = self._value(tables, before, total, shared0, full)
        if after == before:
            row1, shared1 = row0, shared0
        else:
            row1 = tables.per_card[after]
            shared1 = sum(row1[f] for f in frees)
        if shape.cards < 0:
            return [(self._value(tables, after, total, shared1, full) - base, total, -1)]
        if shape.models and not model_matches(view.model, shape.models):
            return []
        if shape.cards > 0:
            if full < shape.cards:
                return []
            left = total - names.CORES_PER_CARD * shape.cards
            part = shared1 - shape.cards * row1[names.CORES_PER_CARD]
            return [(self._value(tables, after, left, part, full - shape.cards) - base, left, -1)]
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
                    out.append((self._value(tables, after, left, part, full) - base, left, 2 * free))
                if full:
                    out.append((self._value(tables, after, left, part, full - 1) - base, left, 2 * free + 1))
            else:
                out.append((self._value(tables, after, left, part, full) - base, left, 2 * free))
        return out
