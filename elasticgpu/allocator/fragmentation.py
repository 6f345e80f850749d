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
