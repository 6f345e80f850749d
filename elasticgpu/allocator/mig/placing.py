"""Where a MIG instance goes: card and start slice, chosen so the cards do not fragment.

`MigAllocator` holds the MIG cards of a cluster and the instances reserved on them, and
answers `place(request)` without changing anything; `reserve` records an answer (checking
every slot rule again, so a stale answer is refused, never squeezed in) and `release` frees it.

Policies:
- `fragmentation` (default): of every (card, start) where the request's profile fits, the one
  where the node's MIG fragmentation (`mig.fragmentation`) grows least; ties go to the fuller
  node, then the fuller card, then node order, card index and the lowest start.
- `first-fit`: the first node, card (by index) and start where the profile fits, the way an
  admin or a plain device plugin carves: the baseline of `bench/mig.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from elasticgpu.allocator.errors import DuplicateObject, ReservationConflict, UnknownObject
from elasticgpu.allocator.mig import slots as slot_rules
from elasticgpu.allocator.mig.fragmentation import CardSlots, MigFragmentation, MigShape
from elasticgpu.allocator.mig.profiles import MigModel, Profile, profile_for
from elasticgpu.allocator.mig.slots import EMPTY, Slots
from elasticgpu.api import names

MigPolicy = Literal["fragmentation", "first-fit"]
MIG_POLICIES: tuple[MigPolicy, ...] = ("fragmentation", "first-fit")


@dataclass(frozen=True, kw_only=True)
class MigCard:
    """A card in MIG mode: where it is and which model's tables apply."""

    uuid: str
    node: str
    index: int
    model: MigModel
    memory_mib: int


@dataclass(frozen=True, kw_only=True)
class MigRequest:
    """What a claim asks of a MIG class: a share of one card (`cards` 0), or whole cards."""

    cores: int = 0
    """Percent of one card's compute (a share)."""
    memory_mib: int | None = None
    """MiB of one card's memory; None: in proportion to the cores."""
    cards: int = 0
    """Whole cards on one node (each gets the largest profile); 0 for a share."""

    def profile_on(self, model: MigModel, card_memory_mib: int) -> Profile | None:
        """The profile this request takes on a card (None: no profile of the model covers it)."""
        key = (self, model.name, card_memory_mib)
        if key in _PROFILES:
            return _PROFILES[key]
        if self.cards > 0:
            found: Profile | None = model.largest
        else:
            memory = self.memory_mib if self.memory_mib is not None else card_memory_mib * self.cores // 100
            found = profile_for(model, cores=self.cores, memory_mib=memory, card_memory_mib=card_memory_mib)
        if len(_PROFILES) > 100_000:  # bound memory
            _PROFILES.clear()
        _PROFILES[key] = found
        return found


# Memo of `MigRequest.profile_on` (first-fit asks it of every card it looks at).
_PROFILES: dict[tuple[MigRequest, str, int], Profile | None] = {}


@dataclass(frozen=True)
class MigInstance:
    """One instance of a placement: the card, the profile and its first memory slice."""

    uuid: str
    profile: str
    start: int


@dataclass(frozen=True)
class MigPlacement:
    """The instances a request gets, all on one node."""

    node: str
    instances: tuple[MigInstance, ...]

    def describe(self) -> str:
        """Short human form: `node-1: 3g.40gb at slice 4 of GPU-1`."""
        parts = ", ".join(f"{i.profile} at slice {i.start} of {i.uuid}" for i in self.instances)
        return f"{self.node}: {parts}"


@dataclass(frozen=True)
class MigUnplaceable:
    """No card can take the request now (`never` False) or ever (`never` True); `reason` says why."""

    reason: str
    never: bool = False


@dataclass
class _CardState:
    card: MigCard
    slots: Slots = EMPTY
    holders: dict[str, MigInstance] = field(default_factory=dict)


class MigAllocator:
    """MIG cards and instances, with a placement policy; pure, no I/O."""

    def __init__(
        self, *, policy: MigPolicy = "fragmentation", workload: dict[MigRequest, float] | None = None
    ) -> None:
        if policy not in MIG_POLICIES:
            raise ValueError(f"MIG policy {policy!r}: must be one of {', '.join(MIG_POLICIES)}")
        self.policy = policy
        self._workload = workload or {}
        self._measure = MigFragmentation()
        self._nodes: dict[str, list[_CardState]] = {}
        self._cards: dict[str, _CardState] = {}
        self._reservations: dict[str, MigPlacement] = {}
        self._sigs: dict[str, tuple[CardSlots, ...]] = {}
        self._moves: dict[tuple[tuple[CardSlots, ...], MigRequest], tuple[float, int, CardSlots, int] | None] = {}

    # -- the cards -----------------------------------------------------------------------------

    def add_card(self, card: MigCard) -> None:
        """Add a MIG card (no-op for the same record again)."""
        existing = self._cards.get(card.uuid)
        if existing is not None:
            if existing.card == card:
                return
            raise DuplicateObject(kind="card", name=card.uuid)
        known = self._measure.models.get(card.model.name)
        if known is None:
            self._measure.register(card.model, self._shapes_for(card.model, card.memory_mib))
        elif known != card.model:
            raise DuplicateObject(kind="MIG model", name=card.model.name)
        state = _CardState(card)
        self._cards[card.uuid] = state
        cards = self._nodes.setdefault(card.node, [])
        cards.append(state)
        cards.sort(key=lambda s: (s.card.index, s.card.uuid))
        self._sigs.pop(card.node, None)

    def _shapes_for(self, model: MigModel, card_memory_mib: int) -> list[MigShape]:
        # The workload's requests as this model's shapes; an empty workload counts every profile once.
        shapes: dict[tuple[str, int], MigShape] = {}
        for request, weight in self._workload.items():
            profile = request.profile_on(model, card_memory_mib)
            if profile is None:
                continue
            key = (profile.name, request.cards)
            old = shapes.get(key)
            shapes[key] = MigShape(profile, request.cards, weight + (old.weight if old else 0.0))
        return list(shapes.values())

    def slots(self, uuid: str) -> Slots:
        """The slices of a card in use."""
        return self._card(uuid).slots

    def instances(self, uuid: str) -> dict[str, MigInstance]:
        """The instances on a card, by claim key."""
        return dict(self._card(uuid).holders)

    def cards(self) -> list[MigCard]:
        """Every card, in node order and then index order."""
        return [s.card for cards in self._nodes.values() for s in cards]

    @property
    def reservations(self) -> dict[str, MigPlacement]:
        """Every reservation by claim key (a copy)."""
        return dict(self._reservations)

    def _card(self, uuid: str) -> _CardState:
        try:
            return self._cards[uuid]
        except KeyError:
            raise UnknownObject(kind="card", name=uuid) from None

    def _sig(self, node: str) -> tuple[CardSlots, ...]:
        sig = self._sigs.get(node)
        if sig is None:
            sig = tuple(sorted(CardSlots(s.card.model.name, s.card.memory_mib, s.slots) for s in self._nodes[node]))
            self._sigs[node] = sig
        return sig

    # -- placing -------------------------------------------------------------------------------

    def place(self, request: MigRequest) -> MigPlacement | MigUnplaceable:
        """Where `request` goes now, or why it cannot; changes nothing."""
        if request.cards < 0 or (request.cards == 0 and not 0 < request.cores <= names.CORES_PER_CARD):
            return MigUnplaceable("a MIG request is a share of 1..100 cores or whole cards", never=True)
        never = self._never(request)
        if never:
            return MigUnplaceable(never, never=True)
        found = self._first_fit(request) if self.policy == "first-fit" else self._least_fragmenting(request)
        if found is None:
            return MigUnplaceable(self._why_none(request))
        return found

    def _never(self, request: MigRequest) -> str:
        if not self._cards:
            return "no card is in MIG mode"
        if request.cards > max(len(c) for c in self._nodes.values()):
            return f"no node has {request.cards} MIG cards"
        if any(request.profile_on(s.card.model, s.card.memory_mib) for s in self._cards.values()):
            return ""
        largest = sorted({f"{s.card.model.largest.name} ({s.card.model.name})" for s in self._cards.values()})
        return f"no MIG profile covers {request.cores}% cores and its memory; the largest is {', '.join(largest)}"

    def _why_none(self, request: MigRequest) -> str:
        if request.cards > 0:
            return f"no node has {request.cards} empty MIG card(s) now"
        return "no MIG card has free slices at a start its profile allows now"

    def _first_fit(self, request: MigRequest) -> MigPlacement | None:
        for node, cards in self._nodes.items():
            if request.cards > 0:
                empty = [s for s in cards if s.slots == EMPTY and s.card.model.largest]
                if len(empty) >= request.cards:
                    chosen = empty[: request.cards]
                    return MigPlacement(
                        node, tuple(MigInstance(s.card.uuid, s.card.model.largest.name, 0) for s in chosen)
                    )
                continue
            for state in cards:
                profile = request.profile_on(state.card.model, state.card.memory_mib)
                if profile is None:
                    continue
                starts = slot_rules.free_starts(state.card.model, state.slots, profile)
                if starts:
                    return MigPlacement(node, (MigInstance(state.card.uuid, profile.name, starts[0]),))
        return None

    def _least_fragmenting(self, request: MigRequest) -> MigPlacement | None:
        best: tuple[float, int, int] | None = None
        best_node = ""
        best_move: tuple[float, int, CardSlots, int] | None = None
        for order, node in enumerate(self._nodes):
            sig = self._sig(node)
            key = (sig, request)
            if key in self._moves:
                move = self._moves[key]
            else:
                move = self._best_move(sig, request)
                if len(self._moves) > 1_000_000:  # bound memory on very long runs
                    self._moves.clear()
                self._moves[key] = move
            if move is None:
                continue
            rank = (move[0], move[1], order)
            if best is None or rank < best:
                best, best_node, best_move = rank, node, move
        if best_move is None:
            return None
        _, _, card_slots, start = best_move
        cards = self._nodes[best_node]
        if request.cards > 0:
            chosen = [s for s in cards if s.slots == EMPTY and s.card.model.name == card_slots.model][: request.cards]
            whole = tuple(MigInstance(s.card.uuid, s.card.model.largest.name, 0) for s in chosen)
            return MigPlacement(best_node, whole)
        for state in cards:
            if CardSlots(state.card.model.name, state.card.memory_mib, state.slots) == card_slots:
                profile = request.profile_on(state.card.model, state.card.memory_mib)
                assert profile is not None  # the move was found for this card's model
                return MigPlacement(best_node, (MigInstance(state.card.uuid, profile.name, start),))
        raise AssertionError("a node's signature names a card state it does not have")  # pragma: no cover

    def _best_move(self, sig: tuple[CardSlots, ...], request: MigRequest) -> tuple[float, int, CardSlots, int] | None:
        """(fragmentation growth, free slices left on the node, the card's state, start) of the best
        move of `request` on a node with these cards, or None when it fits nowhere there."""
        before = self._measure.node(sig)
        best: tuple[float, int, int, int] | None = None
        found: tuple[float, int, CardSlots, int] | None = None
        if request.cards > 0:
            for card in dict.fromkeys(sig):
                empties = [i for i, c in enumerate(sig) if c == card and c.slots == EMPTY]
                if len(empties) < request.cards:
                    continue
                model = self._measure.models[card.model]
                largest = model.largest
                full = card._replace(slots=slot_rules.taking(EMPTY, largest, 0))
                after = list(sig)
                for i in empties[: request.cards]:
                    after[i] = full
                new = tuple(sorted(after))
                left = self._free(new)
                rank = (self._measure.node(new) - before, left, 0, 0)
                if best is None or rank < best:
                    best, found = rank, (rank[0], left, card, 0)
            return found
        for position, card in enumerate(sig):
            if position and sig[position - 1] == card:
                continue  # cards in one state move alike
            model = self._measure.models[card.model]
            profile = request.profile_on(model, card.memory_mib)
            if profile is None:
                continue
            for start in slot_rules.free_starts(model, card.slots, profile):
                after = list(sig)
                after[position] = card._replace(slots=slot_rules.taking(card.slots, profile, start))
                new = tuple(sorted(after))
                left = self._free(new)
                card_free = slot_rules.free_memory(model, card.slots)
                rank = (self._measure.node(new) - before, left, card_free, start)
                if best is None or rank < best:
                    best, found = rank, (rank[0], left, card, start)
        return found

    def _free(self, sig: tuple[CardSlots, ...]) -> int:
        models = self._measure.models
        return sum(slot_rules.free_memory(models[c.model], c.slots) for c in sig)

    # -- committing ----------------------------------------------------------------------------

    def conflict(self, placement: MigPlacement) -> str:
        """Why `placement` cannot be reserved now, or "" when it can."""
        if placement.node not in self._nodes:
            return f"node {placement.node} has no MIG card"
        if len({i.uuid for i in placement.instances}) != len(placement.instances):
            return "a card appears twice in the placement"
        for instance in placement.instances:
            state = self._cards.get(instance.uuid)
            if state is None:
                return f"card {instance.uuid} is not in MIG mode here"
            if state.card.node != placement.node:
                return f"card {instance.uuid} is on {state.card.node}, not {placement.node}"
            try:
                profile = state.card.model.profile(instance.profile)
            except KeyError as err:
                return str(err.args[0])
            reason = slot_rules.why_not(state.card.model, state.slots, profile, instance.start)
            if reason:
                return f"card {instance.uuid}: {reason}"
        return ""

    def reserve(self, key: str, placement: MigPlacement) -> None:
        """Record that claim `key` holds `placement`; idempotent for the same placement. Raises
        `ReservationConflict` (changing nothing) when it no longer fits or `key` holds another."""
        held = self._reservations.get(key)
        if held is not None:
            if held == placement:
                return
            raise ReservationConflict(key=key, reason=f"already holds {held.describe()}; release it first")
        reason = self.conflict(placement)
        if reason:
            raise ReservationConflict(key=key, reason=reason)
        for instance in placement.instances:
            state = self._cards[instance.uuid]
            state.slots = slot_rules.taking(state.slots, state.card.model.profile(instance.profile), instance.start)
            state.holders[key] = instance
        self._reservations[key] = placement
        self._sigs.pop(placement.node, None)

    def release(self, key: str) -> MigPlacement | None:
        """Free what `key` holds and return it; an unknown key is a no-op (None)."""
        placement = self._reservations.pop(key, None)
        if placement is None:
            return None
        for instance in placement.instances:
            state = self._cards[instance.uuid]
            profile = state.card.model.profile(instance.profile)
            state.slots = slot_rules.giving_back(state.slots, profile, instance.start)
            del state.holders[key]
        self._sigs.pop(placement.node, None)
        return placement

    def allocate(self, key: str, request: MigRequest) -> MigPlacement | MigUnplaceable:
        """`place` and `reserve` in one call."""
        found = self.place(request)
        if isinstance(found, MigPlacement):
            self.reserve(key, found)
        return found
