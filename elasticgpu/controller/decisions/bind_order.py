"""Bind order: which Pending claims to try first when capacity frees (ElasticGPUClass `bindOrder`).

Pure: plain records in, an order out; no Kubernetes, no I/O. The picture turns its claims into
`Waiting` records and the flow tries them in the order `bind_pass` gives; the property tests and
`bench/fair_share.py` drive the same code with the pure allocator.

- FIFO (the default): oldest claim first. Age is `creationTimestamp`, then the order in which
  the controller first saw the claim waiting (timestamps have one-second resolution), then
  namespace/name. Not the picture's arrival order alone: after a restart that is list order,
  which is alphabetical, so `a-new` would overtake `z-old`.
- FairShare: the namespace holding the least of the class first (cores held divided by the
  namespace's weight, see `parse_weight`), its oldest claim first; ties by claim age. The pick is
  made again after every bind, charging the namespace what it just got, so two claims of the
  least-served namespace do not both go before everyone else.

No head-of-line blocking: the order is the order of *tries*. A claim that does not fit when its
turn comes is passed over for this pass (and its namespace is not charged); the claims behind it
still get their try. Use is counted in cores (percent of one card; a whole card is 100), the
resource a GPU share is sold by; a memory-only (best-effort) claim holds no cores.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from elasticgpu.api.errors import InvalidSpec
from elasticgpu.api.gpu_class import BindOrder

ANNOTATION_FAIR_SHARE_WEIGHT: Final = "elasticgpu.io/fair-share-weight"
"""Namespace annotation: the namespace's weight under FairShare (a number from 0.01 to 100, default 1):
a namespace of weight 2 is served as if it held half of what it holds."""

NOT_YET: Final = "~"
"""Sorts after every RFC 3339 timestamp: a claim with no creationTimestamp counts as newest."""


@dataclass(frozen=True)
class Waiting:
    """A Pending claim as the ordering sees it."""

    namespace: str
    name: str
    created: str
    """`metadata.creationTimestamp` (RFC 3339 UTC, as the API server writes it; compares as text)."""
    arrival: int
    """Order in which the controller first saw the claim waiting (ties of `created`)."""
    cores: int
    """Cores it holds once bound: percent of one card, 100 per whole card, 0 for memory only."""
    class_name: str = ""
    """The class it binds under ("" for none): use is counted per class."""
    order: BindOrder = "FIFO"
    """Its class's `bindOrder`."""

    @property
    def key(self) -> tuple[str, str]:
        """(namespace, name)."""
        return self.namespace, self.name

    def age(self) -> tuple[str, int, str, str]:
        """Sort key, oldest first."""
        return self.created or NOT_YET, self.arrival, self.namespace, self.name


class InvalidWeight(InvalidSpec):
    """A namespace's fair-share weight annotation is not a number from 0.01 to 100."""


MIN_WEIGHT = 0.01
"""The least FairShare weight a namespace may have (deploy/policies/fair-share-weight.yaml says the same)."""
MAX_WEIGHT = 100.0
"""The greatest: a weight orders one namespace before every other, so it is bounded where it is read too (a
namespace written past the policy, or where the policy is not installed, keeps weight 1 and an Event says why;
issue 44)."""


def parse_weight(value: str | None, *, namespace: str) -> float:
    """The FairShare weight of `namespace` from its `elasticgpu.io/fair-share-weight` annotation
    (None: absent, weight 1). Raises `InvalidWeight` naming the namespace and the fix."""
    if value is None or not value.strip():
        return 1.0
    try:
        weight = float(value)
    except ValueError:
        weight = math.nan
    if not math.isfinite(weight) or not MIN_WEIGHT <= weight <= MAX_WEIGHT:
        raise InvalidWeight(field=f"Namespace {namespace}: metadata.annotations[{ANNOTATION_FAIR_SHARE_WEIGHT}]",
                            rule=f"must be a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}", value=value,
                            fix="set it to e.g. \"2\" (served as if it held half) or remove it (weight 1)")
    return weight


class _Class:
    """The waiting claims of one class during a pass: per-namespace lines, oldest first, and a
    heap with one entry per namespace that has a line, keyed by what the class orders by (so a
    pass costs O(claims * log namespaces), not O(claims * namespaces))."""

    def __init__(self, order: BindOrder, use: Mapping[str, float], weights: Mapping[str, float]) -> None:
        self.order = order
        self.use = dict(use)
        self.weights = weights
        self.lines: dict[str, deque[Waiting]] = {}
        self.heap: list[tuple[tuple[float, tuple[str, int, str, str]], str]] = []

    def rank(self, namespace: str) -> tuple[float, tuple[str, int, str, str]]:
        """The heap key of a namespace's line: (share, age of its oldest) or, for FIFO, (0, age)."""
        age = self.lines[namespace][0].age()
        if self.order == "FairShare":
            return self.use.get(namespace, 0.0) / self.weights.get(namespace, 1.0), age
        return 0.0, age

    def start(self) -> None:
        """Build the heap once every claim is in its line."""
        self.heap = [(self.rank(namespace), namespace) for namespace in self.lines]
        heapq.heapify(self.heap)

    def head(self) -> Waiting | None:
        """The claim this class tries next."""
        return self.lines[self.heap[0][1]][0] if self.heap else None

    def done(self, claim: Waiting, *, bound: bool) -> None:
        """`claim` (the head) was tried: drop it, charge its namespace if it bound, re-rank the line."""
        _rank, namespace = heapq.heappop(self.heap)
        line = self.lines[namespace]
        line.popleft()
        if bound:
            self.use[namespace] = self.use.get(namespace, 0.0) + claim.cores
        if line:
            heapq.heappush(self.heap, (self.rank(namespace), namespace))


def bind_pass(
    waiting: Iterable[Waiting],
    *,
    try_bind: Callable[[Waiting], bool],
    use: Mapping[str, Mapping[str, float]] | None = None,
    weights: Mapping[str, float] | None = None,
) -> list[Waiting]:
    """Try every waiting claim once, in bind order; the claims `try_bind` bound, in order.

    `use`: cores each namespace holds, by class name; `weights`: FairShare weight by namespace
    (absent: 1). Each class orders its own claims by its `bindOrder`; between classes the older
    of their next claims goes first (classes usually compete for different cards). A claim
    `try_bind` refuses (it did not fit) is passed over and its namespace is not charged: the
    claims behind it are still tried (no head-of-line blocking)."""
    classes: dict[str, _Class] = {}
    for claim in sorted(waiting, key=Waiting.age):
        entry = classes.get(claim.class_name)
        if entry is None:
            entry = classes[claim.class_name] = _Class(claim.order, (use or {}).get(claim.class_name, {}),
                                                      weights or {})
        entry.lines.setdefault(claim.namespace, deque()).append(claim)
    for entry in classes.values():
        entry.start()
    bound: list[Waiting] = []
    while True:
        heads = [(head, entry) for entry in classes.values() if (head := entry.head()) is not None]
        if not heads:
            return bound
        claim, entry = min(heads, key=lambda pair: pair[0].age())
        ok = try_bind(claim)
        entry.done(claim, bound=ok)
        if ok:
            bound.append(claim)


def order(
    waiting: Iterable[Waiting],
    *,
    use: Mapping[str, Mapping[str, float]] | None = None,
    weights: Mapping[str, float] | None = None,
) -> list[Waiting]:
    """The order in which to try `waiting` when capacity frees, assuming each claim binds when
    tried (FairShare charges its namespace as it goes). The flow queues the claims in this order;
    one that does not fit then simply waits again, and the next is tried."""
    return bind_pass(waiting, try_bind=lambda _claim: True, use=use, weights=weights)

