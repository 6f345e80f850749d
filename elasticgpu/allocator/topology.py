"""Which whole cards to take together: NVLink peers first, then the same NUMA node."""

from __future__ import annotations

from elasticgpu.allocator.inventory import CardState


def _gain(card: CardState, group: list[CardState], seed: CardState) -> tuple[int, int, int]:
    """How well `card` joins `group`: NVLinks to it, same NUMA node as the seed, low index."""
    uuids = {g.record.uuid for g in group}
    links = len(card.record.links & uuids) + sum(card.record.uuid in g.record.links for g in group)
    return (links, card.record.numa == seed.record.numa, -card.record.index)


def pick_linked(cards: list[CardState], count: int) -> list[CardState]:
    """`count` cards out of `cards` (all usable), preferring sets joined by NVLink, then sets
    on one NUMA node, then lower indices. Greedy from each seed card: optimal for the usual
    topologies (pairs, quads, all-to-all) and cheap for 8 cards."""
    if count >= len(cards):
        return list(cards)
    if count == 1:
        return [cards[0]]
    best: list[CardState] = []
    best_key: tuple[int, int] | None = None
    for seed in cards:
        group = [seed]
        rest = [c for c in cards if c is not seed]
        while len(group) < count:
            nxt = max(rest, key=lambda card: _gain(card, group, seed))
            group.append(nxt)
            rest.remove(nxt)
        uuids = {g.record.uuid for g in group}
        links = sum(len(g.record.links & uuids) for g in group)
        same_numa = sum(g.record.numa == seed.record.numa for g in group)
        key = (links, same_numa)
        if best_key is None or key > best_key:
            best, best_key = group, key
    return sorted(best, key=lambda c: c.record.index)
