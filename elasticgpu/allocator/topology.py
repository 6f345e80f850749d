"""Which whole cards to take together: NVLink peers first, then the same NUMA node; and which
RDMA NICs go with them (the ones on the cards' PCIe roots).

Pure decisions over `CardState`s; the allocator calls them for multi-card placements.
A requirement (`NVLink`, `SameNUMA`) is a filter: a set that breaks it is never returned.
`Any` is a preference: the best set by (one NVLink domain, one NUMA node, NVLinks inside it).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from math import comb

from elasticgpu.allocator.inventory import CardState
from elasticgpu.api.gpu_class import TOPOLOGIES, Topology

__all__ = ["TOPOLOGIES", "Topology", "fully_linked", "has_fit", "pick_linked", "pick_nics", "same_numa", "satisfies"]

# Exhaustive search up to this many subsets (C(8,4) = 70, C(16,8) = 12870); greedy beyond.
_EXHAUSTIVE = 20_000


def _linked(a: CardState, b: CardState) -> bool:
    # NVLink is symmetric; an agent that reports it one way only still counts.
    return b.record.uuid in a.record.links or a.record.uuid in b.record.links


def fully_linked(cards: Sequence[CardState]) -> bool:
    """True when every pair of `cards` is joined by NVLink (one NVLink domain)."""
    return all(_linked(a, b) for a, b in itertools.combinations(cards, 2))


def same_numa(cards: Sequence[CardState]) -> bool:
    """True when all `cards` are on one NUMA node."""
    return len({c.record.numa for c in cards}) <= 1


def satisfies(cards: Sequence[CardState], topology: Topology) -> bool:
    """Whether a chosen set meets a required topology (`Any` always does)."""
    if topology == "NVLink":
        return fully_linked(cards)
    if topology == "SameNUMA":
        return same_numa(cards)
    return True


def _key(group: Sequence[CardState]) -> tuple[int, int, int, int]:
    """How good a set is: one NVLink domain, one NUMA node, NVLinks inside, low indices."""
    links = sum(_linked(a, b) for a, b in itertools.combinations(group, 2))
    return (fully_linked(group), same_numa(group), links, -sum(c.record.index for c in group))


def _gain(card: CardState, group: list[CardState], seed: CardState) -> tuple[int, int, int]:
    """How well `card` joins `group`: NVLinks to it, same NUMA node as the seed, low index."""
    links = sum(_linked(card, g) for g in group)
    return (links, card.record.numa == seed.record.numa, -card.record.index)


def _greedy(cards: list[CardState], count: int) -> Iterable[list[CardState]]:
    """One candidate set per seed card, grown by the best next card (large nodes only)."""
    for seed in cards:
        group = [seed]
        rest = [c for c in cards if c is not seed]
        while len(group) < count:
            nxt = max(rest, key=lambda card: _gain(card, group, seed))
            group.append(nxt)
            rest.remove(nxt)
        yield group


def pick_linked(
    cards: list[CardState], count: int, topology: Topology = "Any", nics: int = 0
) -> list[CardState] | None:
    """`count` cards out of `cards` (all usable), sorted by index: the best set by `_key`
    among those meeting `topology` whose PCIe roots hold `nics` RDMA NICs; None when no set
    does (or there are too few cards).

    Exhaustive over the subsets for the usual nodes (8 or 16 cards), so a fully linked set is
    found whenever one exists; greedy from each seed beyond that."""
    if count > len(cards) or count <= 0:
        return None
    if count == 1 and not nics:
        return [min(cards, key=lambda c: c.record.index)]
    ordered = sorted(cards, key=lambda c: c.record.index)
    if comb(len(ordered), count) <= _EXHAUSTIVE:
        candidates: Iterable[Sequence[CardState]] = itertools.combinations(ordered, count)
    else:
        candidates = _greedy(ordered, count)
    best: Sequence[CardState] | None = None
    best_key: tuple[int, int, int, int] | None = None
    for group in candidates:
        if not satisfies(group, topology) or (nics and pick_nics(group, nics) is None):
            continue
        key = _key(group)
        if best_key is None or key > best_key:
            best, best_key = group, key
    return None if best is None else sorted(best, key=lambda c: c.record.index)


def has_fit(cards: list[CardState], count: int, topology: Topology, nics: int = 0) -> bool:
    """Whether some `count` of `cards` meet `topology` with `nics` RDMA NICs on their roots
    (a node filter for required topologies and NICs)."""
    if count > len(cards):
        return False
    if nics:
        return pick_linked(cards, count, topology, nics) is not None
    if topology == "SameNUMA":
        numas: dict[int, int] = {}
        for card in cards:
            numas[card.record.numa] = numas.get(card.record.numa, 0) + 1
        return max(numas.values(), default=0) >= count
    if topology == "NVLink":
        if count == 1:
            return True
        # Only cards with enough peers can be in a fully linked set of `count`.
        linked = [c for c in cards if sum(_linked(c, o) for o in cards if o is not c) >= count - 1]
        return pick_linked(linked, count, "NVLink") is not None
    return True


def pick_nics(cards: Sequence[CardState], wanted: int) -> tuple[str, ...] | None:
    """`wanted` RDMA NICs for a claim on `cards`: NICs on the chosen cards' PCIe roots only,
    spread over the cards (one per card first, in card order), sorted by name; None when
    the cards' roots hold fewer than `wanted` NICs."""
    if wanted <= 0:
        return ()
    per_card = [sorted(c.record.nics) for c in sorted(cards, key=lambda c: c.record.index)]
    chosen: list[str] = []
    depth = 0
    while len(chosen) < wanted and any(len(n) > depth for n in per_card):
        for nics in per_card:
            if len(nics) > depth and nics[depth] not in chosen and len(chosen) < wanted:
                chosen.append(nics[depth])
        depth += 1
    return tuple(sorted(chosen)) if len(chosen) == wanted else None


def describe(cards: Sequence[CardState], nics: Sequence[str] = ()) -> str:
    """The topology of a chosen set, for `elasticgpu plan`: `NVLink: all linked (6 pairs), NUMA 0, NICs mlx5_0`."""
    ordered = sorted(cards, key=lambda c: c.record.index)
    pairs = list(itertools.combinations(ordered, 2))
    linked = sum(_linked(a, b) for a, b in pairs)
    if not pairs:
        parts = []
    elif linked == len(pairs):
        parts = [f"NVLink: all linked ({len(pairs)} pair{'s' if len(pairs) > 1 else ''})"]
    elif linked == 0:
        # Cards without NVLink (T4, L4, PCIe A100s) are normal, not a fault: say what joins them.
        parts = ["no NVLink (PCIe between the cards)"]
    else:
        parts = [f"NVLink: {linked} of {len(pairs)} pairs linked"]
    parts.append("NUMA " + ",".join(str(n) for n in sorted({c.record.numa for c in ordered})))
    roots = sorted({c.record.pcie_root for c in ordered if c.record.pcie_root})
    if roots:
        parts.append("PCIe root " + ",".join(roots))
    if nics:
        parts.append("NICs " + ",".join(nics))
    return ", ".join(parts)
