"""The target workload: how popular each request shape is.

Fragmentation (Weng et al., ATC'23) is measured against the shapes the cluster expects to
receive: free capacity that the popular shapes cannot use is fragmented. A `Workload` holds
those shapes and their weights (which sum to 1).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from elasticgpu.allocator.records import PlacementRequest
from elasticgpu.allocator.shapes import Shape, shape_of


@dataclass(frozen=True)
class Workload:
    """Request shapes with their popularity (weights sum to 1)."""

    shapes: tuple[Shape, ...]
    weights: tuple[float, ...]

    @classmethod
    def from_requests(cls, requests: Iterable[PlacementRequest], *, coverage: float = 1.0) -> Workload:
        """The most popular GPU shapes of `requests`, enough of them to cover `coverage` of the
        GPU requests (as the paper does: rare shapes cost time and change little)."""
        counts = Counter(shape_of(r) for r in requests if r.gpu is not None)
        if not counts:
            return cls.default()
        total = sum(counts.values())
        chosen: list[tuple[Shape, int]] = []
        covered = 0
        # Sorted by count, then shape, so that equal counts give the same workload every run.
        for shape, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
            if covered >= coverage * total:
                break
            chosen.append((shape, count))
            covered += count
        return cls(tuple(s for s, _ in chosen), tuple(c / covered for _, c in chosen))

    @classmethod
    def default(cls) -> Workload:
        """A broad mix for clusters that give no history: shares of 10-80%, 1, 2, 4, 8 cards."""
        mix = [
            (Shape(0, 10, None, 0, ()), 0.10),
            (Shape(0, 25, None, 0, ()), 0.15),
            (Shape(0, 50, None, 0, ()), 0.15),
            (Shape(0, 80, None, 0, ()), 0.10),
            (Shape(1, 100, None, 0, ()), 0.35),
            (Shape(2, 100, None, 0, ()), 0.06),
            (Shape(4, 100, None, 0, ()), 0.05),
            (Shape(8, 100, None, 0, ()), 0.04),
        ]
        return cls(tuple(s for s, _ in mix), tuple(w for _, w in mix))
