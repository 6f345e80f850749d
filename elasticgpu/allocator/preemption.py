"""Preemption: which reservations of lower priority to take away so that a claim fits (pure, no I/O).

A claim that fits nowhere may take room from claims of lower priority (issue 27, docs/preemption.md).
The victims are chosen on ONE card (a slice: only that card's holders) or ONE node (whole cards: that
node's holders), never spread over the cluster, so a preemption disturbs as little as it can:

- only candidates of strictly lower priority are ever victims (never equal or higher);
- a set is a solution only if the request then fits (the allocator itself says so, with every rule it
  applies: models, node selector, isolation, topology, NICs), so nothing is preempted for a claim that
  would still not fit;
- a solution is minimal: no victim in it could be spared;
- among the solutions of every card or node, the one with the least total priority, then the fewest
  victims, then the youngest (the least work lost), then the first node/card by name.

Up to `EXACT_LIMIT` candidates on a card or node the search is exact (every subset, smallest first; a
superset of a solution is never minimal). Beyond, it is Kubernetes' own greedy: take all candidates,
then spare them one by one, the most valuable first (highest priority, oldest), while the request
still fits; that set is minimal, though not always of the least total priority.

Feasibility is monotone (freeing a reservation never makes a request unplaceable), which is what makes
both searches correct. The caller passes the candidates it may preempt (with their priorities) and the
inventory as it is now; nothing here changes that inventory: each node is copied once into a scratch
inventory, where subsets are released and restored.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from elasticgpu.allocator.allocating import Allocator
from elasticgpu.allocator.inventory import Inventory
from elasticgpu.allocator.records import Placement, PlacementRequest

EXACT_LIMIT = 10
"""Candidates on one card or node up to which every subset is tried (2**10 = 1024 allocator asks)."""


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """A reservation that may be preempted: its key (the ElasticGPU name), its claim's priority, and when
    the claim was created (seconds since the epoch; larger is younger, so less work is lost)."""

    key: str
    priority: int
    created: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Preemption:
    """Take these victims away and the request fits on `node` (on card `card`, for a slice)."""

    node: str
    card: str
    """The card's uuid for a slice; "" for whole cards (victims anywhere on the node)."""
    victims: tuple[str, ...]
    """Keys of the victims, sorted."""
    placement: Placement
    """Where the request goes once the victims are gone (as the allocator would place it now)."""
    total_priority: int


@dataclass(frozen=True)
class NoPreemption:
    """No set of lower-priority victims on one card or node makes the request fit; `reason` says why."""

    reason: str

    def __bool__(self) -> bool:
        return False


def cost(victims: Iterable[Candidate]) -> tuple[int, int, float, tuple[str, ...]]:
    """How bad preempting `victims` is (smaller is better): total priority, how many, minus the sum of
    their creation times (younger first: less work lost), then their keys (a deterministic tie-break)."""
    chosen = sorted(victims, key=lambda c: c.key)
    return (sum(c.priority for c in chosen), len(chosen), -sum(c.created for c in chosen),
            tuple(c.key for c in chosen))


class _Scratch:
    """One node of the inventory, copied, with an allocator that answers "does it fit without these"."""

    def __init__(self, inventory: Inventory, node: str, request: PlacementRequest, policy: str) -> None:
        self.inventory = Inventory()
        state = inventory.node(node)
        self.inventory.add_node(state.record)
        for card in state.cards:
            self.inventory.add_card(card.record)
        for key in sorted(state.holders):
            self.inventory.reserve(key, inventory.reservations[key])
        self.allocator = Allocator(self.inventory, policy=policy)
        # Restricted to this node: a fit elsewhere is not one this preemption makes.
        self.request = replace(request, nodes=frozenset({node}))

    def fits_without(self, keys: Sequence[str]) -> Placement | None:
        """Where the request goes with `keys` released (the inventory is restored before returning)."""
        released = [(key, self.inventory.release(key)) for key in keys]
        try:
            result = self.allocator.place(self.request, explain=False)
        finally:
            for key, placement in released:
                if placement is not None:
                    self.inventory.reserve(key, placement)
        return result if isinstance(result, Placement) else None


def _units(inventory: Inventory, request: PlacementRequest,
           eligible: Mapping[str, Candidate]) -> list[tuple[str, str, tuple[str, ...]]]:
    """(node, card uuid or "", candidate keys) for every card (a slice) or node (whole cards) holding a candidate."""
    whole = request.gpu is not None and request.gpu.is_whole
    units: list[tuple[str, str, tuple[str, ...]]] = []
    for node_name in sorted(inventory.node_names()):
        if request.nodes and node_name not in request.nodes:
            continue  # the request may not go there at all (e.g. nodes kept for a claim group)
        node = inventory.node(node_name)
        if whole:
            keys = tuple(sorted(k for k in node.holders if k in eligible))
            if keys:
                units.append((node_name, "", keys))
            continue
        for card in node.cards:
            keys = tuple(sorted(k for k in card.holders if k in eligible))
            if keys:
                units.append((node_name, card.record.uuid, keys))
    return units


def _exact(scratch: _Scratch, keys: tuple[str, ...],
           eligible: Mapping[str, Candidate]) -> tuple[tuple[str, ...], Placement] | None:
    """The minimal set of `keys` of least `cost` whose release makes the request fit, trying every subset."""
    solutions: list[frozenset[str]] = []
    best: tuple[tuple[int, int, float, tuple[str, ...]], tuple[str, ...], Placement] | None = None
    for size in range(1, len(keys) + 1):
        for subset in itertools.combinations(keys, size):
            chosen = frozenset(subset)
            if any(found <= chosen for found in solutions):
                continue  # a superset of a solution: not minimal
            placement = scratch.fits_without(subset)
            if placement is None:
                continue
            solutions.append(chosen)
            score = cost(eligible[k] for k in subset)
            if best is None or score < best[0]:
                best = (score, subset, placement)
    return None if best is None else (best[1], best[2])


def _greedy(scratch: _Scratch, keys: tuple[str, ...],
            eligible: Mapping[str, Candidate]) -> tuple[tuple[str, ...], Placement] | None:
    """All of `keys`, then spare the most valuable (highest priority, oldest) while the request still fits."""
    chosen = list(keys)
    placement = scratch.fits_without(chosen)
    if placement is None:
        return None
    for key in sorted(keys, key=lambda k: (-eligible[k].priority, eligible[k].created, k)):
        trial = [k for k in chosen if k != key]
        fits = scratch.fits_without(trial)
        if fits is not None:
            chosen, placement = trial, fits
    return tuple(sorted(chosen)), placement


def choose_victims(
    inventory: Inventory,
    request: PlacementRequest,
    *,
    priority: int,
    candidates: Iterable[Candidate],
    policy: str = "binpack",
    exact_limit: int = EXACT_LIMIT,
) -> Preemption | NoPreemption:
    """The victims whose reservations, once freed, let `request` (of a claim of `priority`) fit; see the
    module docstring for the rules. `candidates`: the reservations the caller may preempt (others, and
    those of equal or higher priority, are never chosen). Changes nothing."""
    eligible = {c.key: c for c in candidates if c.priority < priority and c.key in inventory.reservations}
    if not eligible:
        return NoPreemption(f"no claim of priority below {priority} holds a card")
    scratches: dict[str, _Scratch] = {}
    best: tuple[tuple[int, int, float, tuple[str, ...]], str, str, tuple[str, ...], Placement] | None = None
    for node, card, keys in _units(inventory, request, eligible):
        scratch = scratches.get(node)
        if scratch is None:
            scratch = scratches[node] = _Scratch(inventory, node, request, policy)
        search = _exact if len(keys) <= exact_limit else _greedy
        found = search(scratch, keys, eligible)
        if found is None:
            continue
        victims, placement = found
        key = (cost(eligible[k] for k in victims), node, card)
        if best is None or key < (best[0], best[1], best[2]):
            best = (key[0], node, card, victims, placement)
    if best is None:
        where = "card" if request.gpu is not None and not request.gpu.is_whole else "node"
        return NoPreemption(f"preempting every claim of priority below {priority} on any one {where} would still"
                            " not make room")
    score, node, card, victims, placement = best
    return Preemption(node=node, card=card, victims=tuple(sorted(victims)), placement=placement,
                      total_priority=score[0])
