"""Placement policies: how good one node (in one state) is for one request shape.

A policy sees only a node's signature (`NodeSig`) and the request's `Shape`, so its score can
be cached per (signature, shape) and shared by every node in that state. Lower is better; `inf`
means the shape does not fit. Each policy also says which card(s) it would use on the node.

- `fragmentation` (default): fragmentation gradient descent (Weng et al., ATC'23): the move
  that grows the node's fragmentation against the target workload least, scored in the
  paper's whole-number steps; equal scores go to a fixed node order (first-fit among
  near-equals), which keeps other nodes empty for the large requests.
- `binpack`: the fullest node that fits, and on it the fullest card that fits.
- `spread`: the emptiest node, and on it the emptiest card.
- `bestfit`, `packing`, `random`: the paper's baselines, scored as its authors' simulator
  does, for the benchmark.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Hashable, Iterator
from typing import ClassVar

from elasticgpu.allocator.fragmentation import FastFragmentation, FragmentationModel, NodeView
from elasticgpu.allocator.shapes import CardSig, NodeSig, Shape, card_fits, share_memory
from elasticgpu.allocator.workloads import Workload
from elasticgpu.api import names

INFEASIBLE = math.inf

# A move: the card signatures the request would take, and the node's usable cards afterwards.
Move = tuple[tuple[CardSig, ...], tuple[CardSig, ...]]


def moves(sig: NodeSig, shape: Shape) -> Iterator[Move]:
    """Every distinct way the shape fits the node (cards with equal signatures are one way)."""
    cards = sig.cards
    if shape.cpu_milli > sig.cpu_free or shape.pod_memory > sig.memory_free:
        return
    if shape.cards < 0:
        yield (), cards
        return
    if shape.cards > 0:
        fitting = [i for i, c in enumerate(cards) if card_fits(shape, c)]
        if len(fitting) < shape.cards:
            return
        # Cards come sorted by (free, memory): the first fitting ones are the smallest cards
        # that satisfy the memory floor, which leaves bigger cards for bigger requests.
        taken = set(fitting[: shape.cards])
        yield tuple(cards[i] for i in sorted(taken)), tuple(c for i, c in enumerate(cards) if i not in taken)
        return
    seen: set[CardSig] = set()
    for i, card in enumerate(cards):
        if card in seen or not card_fits(shape, card):
            continue
        seen.add(card)
        after = CardSig(
            card.free_cores - shape.cores,
            card.free_memory - share_memory(shape, card.memory),
            card.memory,
            False,
            card.model,
        )
        rest = [*cards[:i], after, *cards[i + 1 :]]
        rest.sort()
        yield (card,), tuple(rest)


def free_cores(cards: tuple[CardSig, ...]) -> int:
    """Free cores over these cards."""
    return sum(c.free_cores for c in cards)


class Policy:
    """Scores a node state for a shape; subclasses define `move_score`."""

    name: ClassVar[str] = ""
    randomized: ClassVar[bool] = False
    """True for policies that pick uniformly among the nodes that fit (no scores)."""
    integral: bool = False
    """True when every score is a whole number (or inf): ties are then broken by adding half
    the node's rank, in one pass."""

    def move_score(self, sig: NodeSig, shape: Shape, move: Move) -> float:
        """Score of one move; lower is better."""
        raise NotImplementedError

    def table_shape(self, shape: Shape) -> Shape:
        """The shape as this policy's scores see it (the allocator keeps one table per such
        shape). By default the pod's memory only filters, so it is left out."""
        return shape._replace(pod_memory=0) if shape.pod_memory else shape

    def prepare(self, sig: NodeSig) -> object:
        """Whatever `resolve` wants precomputed about a node state; called once per distinct
        state (the allocator interns states), so per-shape work can stay small."""
        return None

    def resolve(
        self, prepared: object, sig: NodeSig, shape: Shape, memo: dict[Hashable, tuple[float, object]]
    ) -> tuple[float, object]:
        """Score of a node state for a shape and a token for the move (see `cards`). `memo`
        is the shape's cache, for policies that map many states to one computation."""
        return self.best(sig, shape)

    def resolver(
        self, shape: Shape, memo: dict[Hashable, tuple[float, object]]
    ) -> Callable[[object, NodeSig], tuple[float, object]]:
        """`resolve` for one shape and its memo, as one callable (the allocator calls it for
        every new node state a shape's table meets, so policies may specialise it)."""

        def resolve(prepared: object, sig: NodeSig) -> tuple[float, object]:
            return self.resolve(prepared, sig, shape, memo)

        return resolve

    def cards(self, sig: NodeSig, shape: Shape, token: object) -> tuple[CardSig, ...]:
        """The card signatures a move takes, from the token `resolve` returned."""
        return token  # type: ignore[return-value]

    def best(self, sig: NodeSig, shape: Shape) -> tuple[float, tuple[CardSig, ...]]:
        """Best score of the node for the shape and the cards it takes (`inf`, () if none fit)."""
        best_score = INFEASIBLE
        best_cards: tuple[CardSig, ...] = ()
        for move in moves(sig, shape):
            score = self.move_score(sig, shape, move)
            if score < best_score:
                best_score, best_cards = score, move[0]
        return best_score, best_cards


class Fragmentation(Policy):
    """Fragmentation gradient descent (Weng et al., ATC'23): the move that grows the node's
    fragmentation against the workload least.

    The growth is scored as the paper's scheduler does, `floor(quantum * sigmoid(-growth /
    100))` with growth in cores (the paper: milli-GPU over 1000, `quantum` 100), so moves
    within a few percent of a card are equal. Equal scores go to the allocator's per-seed
    node order, which keeps choosing the same nodes (first-fit among near-equals) and so
    leaves other nodes empty for the large requests.
    Measured on the openb trace (bench/README.md), quantised growth beats exact growth with a
    best-fit tie-break by 0.6 points of allocation, and the whole workload as the target (the
    paper keeps the task types covering 95% of the pods) adds 0.4.
    """

    name = "fragmentation"

    def __init__(self, workload: Workload | None = None, *, quantum: float = 100.0, memory: bool = False) -> None:
        self.model = FragmentationModel(workload or Workload.default(), memory=memory)
        self.fast = FastFragmentation(self.model)
        self.quantum = quantum
        self.integral = quantum > 0

    def score(self, growth: float, left: int) -> float:
        """Score of a move that grows fragmentation by `growth` cores and leaves `left` free."""
        if self.quantum <= 0:
            return growth + 1e-9 * left
        # Rounded first: the fast path and the reference sum the same growth in another order, and
        # a growth of 0 (sigmoid exactly 0.5) must not floor to 50 on one path and 49 on the other.
        x = round(growth, 9) / 100.0
        sigmoid = 1.0 / (1.0 + math.exp(x)) if x > -700 else 1.0
        return -math.floor(self.quantum * sigmoid)

    def move_score(self, sig: NodeSig, shape: Shape, move: Move) -> float:
        before = self.model.node(sig.cards, sig.cpu_free, sig.memory_free)
        after = self.model.node(move[1], sig.cpu_free - shape.cpu_milli, sig.memory_free - shape.pod_memory)
        return self.score(after - before, free_cores(move[1]))

    def table_shape(self, shape: Shape) -> Shape:
        return shape if self.model.memory else super().table_shape(shape)

    def prepare(self, sig: NodeSig) -> object:
        return self.fast.view(sig.cards)

    def resolve(
        self, prepared: object, sig: NodeSig, shape: Shape, memo: dict[Hashable, tuple[float, object]]
    ) -> tuple[float, object]:
        cpu, memory = sig.cpu_free, sig.memory_free
        if shape.cpu_milli > cpu or shape.pod_memory > memory:
            return INFEASIBLE, ()
        # Free CPU and memory matter only through the model's buckets before and after.
        before = self.model.bucket(cpu, memory)
        after = self.model.bucket(cpu - shape.cpu_milli, memory - shape.pod_memory)
        view = prepared if isinstance(prepared, NodeView) else None
        if view is None or (shape.cards >= 0 and shape.memory_mib is not None) or _coreless(shape):
            # The general path: its cards are this state's own, so it keys on them.
            key: Hashable = (sig.cards, before, after)
            hit = memo.get(key)
            if hit is None:
                hit = self.best(sig, shape)
                memo[key] = hit
        else:
            key = (view.model_key if shape.models else view.key, before, after)
            hit = memo.get(key)
            if hit is None:
                best_score, token = INFEASIBLE, _NO_MOVE
                for growth, left, move in self.fast.deltas(view, before, after, shape):
                    score = self.score(growth, left)
                    if score < best_score:
                        best_score, token = score, move
                hit = (best_score, token)
            memo[key] = hit
        return hit

    def resolver(
        self, shape: Shape, memo: dict[Hashable, tuple[float, object]]
    ) -> Callable[[object, NodeSig], tuple[float, object]]:
        if (
            self.model.memory
            or not self.fast.valid
            or (shape.cards >= 0 and shape.memory_mib is not None)
            or _coreless(shape)
        ):
            return super().resolver(shape, memo)
        # The hot path, specialised per shape: no memory buckets, proportional shares.
        need = shape.cpu_milli
        named = bool(shape.models)  # then the card model itself decides, not only its class
        steps = self.model._cpu_steps
        deltas = self.fast.deltas
        score = self.score
        general = self.resolve

        def resolve(prepared: object, sig: NodeSig) -> tuple[float, object]:
            cpu = sig.cpu_free
            if need > cpu:
                return _INFEASIBLE
            if prepared is None:
                return general(prepared, sig, shape, memo)
            view: NodeView = prepared  # type: ignore[assignment]
            before = bisect_right(steps, cpu)
            after = bisect_right(steps, cpu - need) if need else before
            key = (view.model_key if named else view.key, before, after)
            hit = memo.get(key)
            if hit is None:
                best_score, token = INFEASIBLE, _NO_MOVE
                for growth, left, move in deltas(view, before, after, shape):
                    value = score(growth, left)
                    if value < best_score:
                        best_score, token = value, move
                hit = (best_score, token)
                memo[key] = hit
            return hit

        return resolve

    def cards(self, sig: NodeSig, shape: Shape, token: object) -> tuple[CardSig, ...]:
        if not isinstance(token, int):
            return token  # type: ignore[return-value]
        if shape.cards < 0:
            return ()
        if shape.cards > 0:
            return next(moves(sig, shape))[0]
        # A share: the token names the free cores of the card the fast path chose (cards with
        # those free cores are alike to it) and whether it is a card nobody holds.
        free, idle = divmod(token, 2)
        return (next(c for c in sig.cards if c.free_cores == free and c.idle == bool(idle) and card_fits(shape, c)),)


_NO_MOVE = -2


def _coreless(shape: Shape) -> bool:
    """A share of no cores (memory only): it can go on a card with nothing free, which the
    fast path's view leaves out, so the general path scores it."""
    return shape.cards == 0 and shape.cores == 0


_INFEASIBLE: tuple[float, object] = (INFEASIBLE, ())


class BinPack(Policy):
    """Fullest node first, fullest card first."""

    name = "binpack"

    def move_score(self, sig: NodeSig, shape: Shape, move: Move) -> float:
        card_left = sum(c.free_cores for c in move[0]) - (shape.cores if shape.cards == 0 else 0)
        return free_cores(move[1]) * 1000.0 + card_left


class Spread(Policy):
    """Emptiest node first, emptiest card first."""

    name = "spread"

    def move_score(self, sig: NodeSig, shape: Shape, move: Move) -> float:
        card_left = sum(c.free_cores for c in move[0]) - (shape.cores if shape.cards == 0 else 0)
        return -(free_cores(move[1]) * 1000.0 + card_left)


# The paper's simulator normalises BestFit by the largest node spec of the openb cluster.
_MAX_SPEC_CPU = 128000  # milli-CPU
_MAX_SPEC_GPU_CORES = 8 * names.CORES_PER_CARD


class BestFit(Policy):
    """The paper's BestFit baseline (Weng et al., ATC'23; the authors' simulator,
    `best_fit_score.go`): `int(100 * (1 - (cpu left / 128 CPU + GPU left / 8 GPUs) / 2))`,
    higher is better. The card of a share is the fullest that fits. Equal scores go to the
    allocator's fixed per-seed node order: with that, this and `packing` reproduce the
    paper's figures (random choice among equal scores does not; see bench/README.md)."""

    name = "bestfit"

    def move_score(self, sig: NodeSig, shape: Shape, move: Move) -> float:
        cpu_left = (sig.cpu_free - shape.cpu_milli) / _MAX_SPEC_CPU
        gpu_left = free_cores(move[1]) / _MAX_SPEC_GPU_CORES
        # Moves on one node score alike; `best` keeps the first, the fullest card that fits.
        return -int(100.0 * (1.0 - 0.5 * (cpu_left + gpu_left)))


class Packing(Policy):
    """The paper's GpuPacking baseline (the authors' simulator, `gpu_packing_score.go`), in
    its integer scores, higher is better: a share that fits on a card already in use scores
    `100 - (free % of that card) // 10` (at least 50); a request that needs free cards of a
    node already in use `50 - free cards taken` (at least 33); a node with every card free
    `max(33 - its cards, its cards)`. Pods without GPU score alike. Equal scores go to the
    allocator's per-seed node order; the card is the fullest that fits."""

    name = "packing"

    def move_score(self, sig: NodeSig, shape: Shape, move: Move) -> float:
        taken = move[0]
        if shape.cards < 0:
            return 0.0
        gpus = sig.gpus or len(sig.cards)
        free_cards = sum(c.idle and c.free_cores == names.CORES_PER_CARD for c in sig.cards)
        card_left = sum(c.free_cores for c in taken)
        if free_cards == gpus:
            score = max(33 - gpus, gpus)
        else:
            newly = sum(c.idle and c.free_cores == names.CORES_PER_CARD for c in taken)
            score = max(50 - newly, 33) if newly else max(100 - card_left // 10, 50)
        return -score  # equal moves: `best` keeps the first, the fullest card that fits


class Random(Policy):
    """Any node that fits, chosen uniformly at random (the paper's Random baseline)."""

    name = "random"
    randomized = True

    def move_score(self, sig: NodeSig, shape: Shape, move: Move) -> float:
        return 0.0


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (Fragmentation, BinPack, Spread, BestFit, Packing, Random)}
DEFAULT_POLICY = Fragmentation.name


def make_policy(name: str, *, workload: Workload | None = None) -> Policy:
    """A policy by name (`fragmentation`, `binpack`, `spread`, `bestfit`, `packing`, `random`)."""
    try:
        cls = POLICIES[name]
    except KeyError:
        known = ", ".join(sorted(POLICIES))
        raise ValueError(f"unknown policy {name!r}; use one of {known}") from None
    if cls is Fragmentation:
        return Fragmentation(workload)
    return cls()
