"""The cluster as the allocator sees it: nodes, cards, and what each reservation holds.

State changes are incremental: `reserve` and `release` touch only the cards of one placement
and notify subscribers with the node's name, so the allocator recomputes that node alone and
never rescans the cluster per decision.

Rules kept here, whoever calls (the invariants the property tests check):
- no card ever holds more than 100 cores or more than its memory;
- a card taken whole holds nothing else, and a card holding a share cannot be taken whole;
- `release(key)` restores exactly the state before `reserve(key, ...)`;
- a reservation that would break a rule raises `ReservationConflict` and changes nothing.
Health is not checked on reserve: reservations that exist when a card turns Unhealthy stay
until released (the controller decides what happens to them); new placements avoid the card.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from types import MappingProxyType

from elasticgpu.allocator.errors import DuplicateObject, ReservationConflict, UnknownObject
from elasticgpu.allocator.records import CardRecord, CardShare, Health, NodeRecord, Placement
from elasticgpu.api import names

# CPU and memory of a node whose record gives 0 (untracked): never the limiting resource.
UNTRACKED = 1 << 62

Listener = Callable[[str], None]


class CardState:
    """Mutable state of one card. Read it through `Inventory`; only the inventory writes it."""

    __slots__ = ("free_cores", "free_memory", "holders", "record", "whole")

    def __init__(self, record: CardRecord) -> None:
        self.record = record
        self.free_cores = names.CORES_PER_CARD
        self.free_memory = record.memory_mib
        self.holders: dict[str, CardShare] = {}
        self.whole = False

    @property
    def healthy(self) -> bool:
        """True when new placements may use the card."""
        return self.record.health is Health.HEALTHY


class NodeState:
    """Mutable state of one node: free CPU and memory, and its cards in index order."""

    __slots__ = ("cards", "cpu_free", "holders", "memory_free", "record")

    def __init__(self, record: NodeRecord) -> None:
        self.record = record
        self.cards: list[CardState] = []
        self.cpu_free = record.cpu_milli or UNTRACKED
        self.memory_free = record.memory_mib or UNTRACKED
        self.holders: set[str] = set()


class Inventory:
    """Nodes, cards and reservations, updated incrementally.

    Build it from plain records (`add_node`, `add_card`), then `reserve` / `release` by a stable
    claim key. Subscribers (the allocator's caches) hear the name of every node that changed.
    """

    def __init__(self) -> None:
        self._nodes: dict[str, NodeState] = {}
        self._cards: dict[str, CardState] = {}
        self._reservations: dict[str, Placement] = {}
        self._listeners: list[Listener] = []

    # -- reading -------------------------------------------------------------------------------

    @property
    def reservations(self) -> Mapping[str, Placement]:
        """Every reservation by claim key (read-only view)."""
        return MappingProxyType(self._reservations)

    def node_names(self) -> list[str]:
        """Names of all nodes, in the order they were added."""
        return list(self._nodes)

    def node(self, name: str) -> NodeState:
        """State of one node; raises `UnknownObject` when absent."""
        try:
            return self._nodes[name]
        except KeyError:
            raise UnknownObject(kind="node", name=name) from None

    def card(self, uuid: str) -> CardState:
        """State of one card; raises `UnknownObject` when absent."""
        try:
            return self._cards[uuid]
        except KeyError:
            raise UnknownObject(kind="card", name=uuid) from None

    def nodes(self) -> Iterator[NodeState]:
        """States of all nodes."""
        return iter(self._nodes.values())

    def __contains__(self, node_name: object) -> bool:
        return node_name in self._nodes

    def __len__(self) -> int:
        return len(self._nodes)

    def snapshot(self) -> tuple[object, ...]:
        """A comparable picture of all free capacity and reservations (for tests and checks)."""
        cards = tuple(
            sorted((u, c.free_cores, c.free_memory, c.whole, tuple(sorted(c.holders))) for u, c in self._cards.items())
        )
        nodes = tuple(sorted((n, s.cpu_free, s.memory_free, tuple(sorted(s.holders))) for n, s in self._nodes.items()))
        return cards, nodes, tuple(sorted(self._reservations.items(), key=lambda kv: kv[0]))

    # -- changes to the inventory --------------------------------------------------------------

    def subscribe(self, listener: Listener) -> None:
        """Call `listener(node_name)` after every change to that node (cards, health, holders)."""
        self._listeners.append(listener)

    def _changed(self, node: str) -> None:
        for listener in self._listeners:
            listener(node)

    def add_node(self, record: NodeRecord) -> None:
        """Add a node (no-op when the same record is already there)."""
        existing = self._nodes.get(record.name)
        if existing is not None:
            if existing.record == record:
                return
            raise DuplicateObject(kind="node", name=record.name)
        self._nodes[record.name] = NodeState(record)
        self._changed(record.name)

    def add_card(self, record: CardRecord) -> None:
        """Add a card to a node that exists (no-op when the same record is already there)."""
        existing = self._cards.get(record.uuid)
        if existing is not None:
            if existing.record == record:
                return
            raise DuplicateObject(kind="card", name=record.uuid)
        node = self.node(record.node)
        card = CardState(record)
        node.cards.append(card)
        node.cards.sort(key=lambda c: (c.record.index, c.record.uuid))
        self._cards[record.uuid] = card
        self._changed(record.node)

    def set_health(self, uuid: str, health: Health) -> None:
        """Mark a card Healthy or Unhealthy; new placements avoid Unhealthy cards."""
        card = self.card(uuid)
        if card.record.health is health:
            return
        card.record = replace(card.record, health=health)
        self._changed(card.record.node)

    def remove_card(self, uuid: str) -> tuple[str, ...]:
        """Remove a card; its reservations are dropped. Returns the claim keys that lost it."""
        card = self.card(uuid)
        dropped = tuple(sorted(card.holders))
        for key in dropped:
            self.release(key)
        node = self._nodes[card.record.node]
        node.cards.remove(card)
        del self._cards[uuid]
        self._changed(node.record.name)
        return dropped

    def remove_node(self, name: str) -> tuple[str, ...]:
        """Remove a node and its cards; returns the claim keys whose reservations were dropped."""
        node = self.node(name)
        dropped = tuple(sorted(node.holders))
        for key in dropped:
            self.release(key)
        for card in node.cards:
            del self._cards[card.record.uuid]
        del self._nodes[name]
        self._changed(name)
        return dropped

    # -- reservations --------------------------------------------------------------------------

    def conflict(self, placement: Placement) -> str:
        """Why `placement` cannot be reserved now, or "" when it can."""
        node = self._nodes.get(placement.node)
        if node is None:
            return f"node {placement.node} is not in the inventory"
        if len({share.uuid for share in placement.cards}) != len(placement.cards):
            return "a card appears twice in the placement"
        if placement.cpu_milli > node.cpu_free:
            return f"{node.record.name} has {node.cpu_free}m CPU free, the placement takes {placement.cpu_milli}m"
        if placement.memory_mib > node.memory_free:
            return f"{node.record.name} has {node.memory_free} MiB free, the placement takes {placement.memory_mib}"
        for share in placement.cards:
            card = self._cards.get(share.uuid)
            if card is None:
                return f"card {share.uuid} is not in the inventory"
            where = card.record.describe()
            if card.record.node != placement.node:
                return f"card {share.uuid} is on {card.record.node}, not {placement.node}"
            if share.cores < 0 or share.memory_mib < 0:
                return f"{where}: negative share"
            if card.whole:
                return f"{where} is taken whole by another claim"
            if share.whole and card.holders:
                return f"{where} is shared by {len(card.holders)} claim(s) and cannot be taken whole"
            if share.cores > card.free_cores:
                return f"{where} has {card.free_cores}% cores free, the placement takes {share.cores}%"
            if share.memory_mib > card.free_memory:
                return f"{where} has {card.free_memory} MiB free, the placement takes {share.memory_mib} MiB"
        return ""

    def reserve(self, key: str, placement: Placement) -> None:
        """Record that claim `key` holds `placement`.

        Idempotent: the same key with the same placement again is a no-op. Raises
        `ReservationConflict` (and changes nothing) for another placement under the same key or
        for a placement that no longer fits.
        """
        held = self._reservations.get(key)
        if held is not None:
            if held == placement:
                return
            raise ReservationConflict(key=key, reason=f"already holds {held.describe()}; release it first")
        reason = self.conflict(placement)
        if reason:
            raise ReservationConflict(key=key, reason=reason)
        node = self._nodes[placement.node]
        node.cpu_free -= placement.cpu_milli
        node.memory_free -= placement.memory_mib
        node.holders.add(key)
        for share in placement.cards:
            card = self._cards[share.uuid]
            if share.whole:
                # A whole card is exclusive: its full capacity goes, whatever the share says.
                card.whole = True
            card.free_cores -= share.cores
            card.free_memory -= share.memory_mib
            card.holders[key] = share
        self._reservations[key] = placement
        self._changed(placement.node)

    def release(self, key: str) -> Placement | None:
        """Free what claim `key` holds and return it; an unknown key is a no-op (returns None)."""
        placement = self._reservations.pop(key, None)
        if placement is None:
            return None
        node = self._nodes.get(placement.node)
        if node is None:  # pragma: no cover - remove_node releases before deleting
            return placement
        node.cpu_free += placement.cpu_milli
        node.memory_free += placement.memory_mib
        node.holders.discard(key)
        for share in placement.cards:
            card = self._cards.get(share.uuid)
            if card is None:  # pragma: no cover - remove_card releases before deleting
                continue
            card.free_cores += share.cores
            card.free_memory += share.memory_mib
            del card.holders[key]
            if share.whole:
                card.whole = False
        self._changed(placement.node)
        return placement
