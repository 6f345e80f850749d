"""Fragmentation of MIG slots against a target workload (FGD, Weng et al. ATC'23, on slices).

`elasticgpu.allocator.fragmentation` counts the free cores of a card that a request shape
cannot use. With MIG the unit is the memory slice and "cannot use" is stricter: an instance
needs consecutive slices at an allowed start and enough free compute slices, so a card with 4
free slices may host no 4g at all (a 1g at slice 2 blocks both 4-slice starts). For one
profile, a card's free slices are fragmented where the largest packing of that profile does
not cover them:

    fragmented(card, p) = free slices - p.size * capacity(card, p)

and a whole-card shape of k cards sees all of a node's free slices as fragmented when fewer
than k cards are empty, else the free slices of its non-empty cards. A node's fragmentation is
the popularity-weighted sum over the workload's shapes; placing where it grows least keeps
what stays free able to host the profiles that are asked for, the largest included.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from elasticgpu.allocator.mig import slots as slot_rules
from elasticgpu.allocator.mig.profiles import MigModel, Profile
from elasticgpu.allocator.mig.slots import EMPTY, Slots


class MigShape(NamedTuple):
    """One shape of the workload on one card model: a profile, on one card (`cards` 0) or the
    largest profile on each of `cards` empty cards of one node."""

    profile: Profile
    cards: int
    weight: float


class CardSlots(NamedTuple):
    """One card as the measure sees it: its model's name, its memory and its slots in use
    (names, not models, so that node signatures hash fast)."""

    model: str
    memory_mib: int
    slots: Slots


class MigFragmentation:
    """Fragmented memory slices of node states, for the shapes of each card model (memoised).

    `register(model, shapes)` gives the workload's shapes on a model; a model registered without
    any counts every profile of its own once (an even workload).
    """

    def __init__(self) -> None:
        self.models: dict[str, MigModel] = {}
        self._shapes: dict[str, list[MigShape]] = {}
        self._cards: dict[tuple[str, Slots], float] = {}
        self._nodes: dict[tuple[CardSlots, ...], float] = {}

    def register(self, model: MigModel, shapes: list[MigShape] | None = None) -> None:
        """Count these shapes on cards of `model` (its every profile once when None or empty)."""
        self.models[model.name] = model
        self._shapes[model.name] = shapes or [MigShape(p, 0, 1.0) for p in model.profiles]
        self._cards.clear()
        self._nodes.clear()

    def shapes(self, model: MigModel) -> list[MigShape]:
        """The shapes the measure counts on cards of `model`."""
        if model.name not in self._shapes:
            self.register(model)
        return self._shapes[model.name]

    def card(self, model: MigModel, slots: Slots) -> float:
        """Fragmented slices of one card for the single-card shapes."""
        key = (model.name, slots)
        value = self._cards.get(key)
        if value is None:
            free = slot_rules.free_memory(model, slots)
            value = 0.0
            for shape in self.shapes(model):
                if shape.cards == 0:
                    hosted = shape.profile.size * slot_rules.capacity(model, slots, shape.profile)
                    value += shape.weight * (free - hosted)
            self._cards[key] = value
        return value

    def node(self, cards: tuple[CardSlots, ...]) -> float:
        """Fragmented slices of a node whose cards (sorted) are in these states."""
        value = self._nodes.get(cards)
        if value is not None:
            return value
        if len(self._nodes) > 1_000_000:  # bound memory on very long runs
            self._nodes.clear()
        value = 0.0
        for model, group in self._by_model(cards):
            free = sum(slot_rules.free_memory(model, c.slots) for c in group)
            empty = sum(1 for c in group if c.slots == EMPTY)
            for card in group:
                value += self.card(model, card.slots)
            for shape in self.shapes(model):
                if shape.cards > 0:
                    usable = model.memory_slices * empty if empty >= shape.cards else 0
                    value += shape.weight * (free - usable)
        self._nodes[cards] = value
        return value

    def _by_model(self, cards: Iterable[CardSlots]) -> list[tuple[MigModel, list[CardSlots]]]:
        groups: dict[str, tuple[MigModel, list[CardSlots]]] = {}
        for card in cards:
            groups.setdefault(card.model, (self.models[card.model], []))[1].append(card)
        return list(groups.values())
