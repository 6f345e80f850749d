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

from elasticgpu.allocator.shapes import CardSig, Shape, card_fits
from elasticgpu.allocator.workloads import Workload


class FragmentationModel:
    """Fragmentation of node states for one workload, memoised by state.

    The memo key is (cards, CPU bucket): only the ordering of free CPU against the workload's
    CPU needs matters, so nodes with different free CPU share entries.
    """

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self._shapes = list(zip(workload.shapes, workload.weights, strict=True))
        self._cpu_steps = sorted({s.cpu_milli for s in workload.shapes if s.cpu_milli > 0})
        self._memo: dict[tuple[tuple[CardSig, ...], int], float] = {}

    def cpu_bucket(self, cpu_free: int) -> int:
        """How many of the workload's CPU needs `cpu_free` can meet."""
        return bisect_right(self._cpu_steps, cpu_free)

    def node(self, cards: tuple[CardSig, ...], cpu_free: int) -> float:
        """Fragmented cores of a node with these usable cards and this much free CPU."""
        bucket = self.cpu_bucket(cpu_free)
        key = (cards, bucket)
        value = self._memo.get(key)
        if value is None:
            if len(self._memo) > 1_000_000:  # bound memory on very long runs
                self._memo.clear()
            value = self._compute(cards, bucket)
            self._memo[key] = value
        return value

    def _compute(self, cards: tuple[CardSig, ...], bucket: int) -> float:
        total_free = sum(c.free_cores for c in cards)
        if total_free == 0:
            return 0.0
        cpu_free_level = self._cpu_steps[bucket - 1] if bucket else 0
        frag = 0.0
        for shape, weight in self._shapes:
            frag += weight * self._for_shape(shape, cards, total_free, cpu_free_level)
        return frag

    @staticmethod
    def _for_shape(shape: Shape, cards: tuple[CardSig, ...], total_free: int, cpu_free_level: int) -> int:
        if shape.cpu_milli > cpu_free_level:
            return total_free
        fitting = 0
        unusable = 0
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
