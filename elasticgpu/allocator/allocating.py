"""The allocator: picks a node and card(s) for a request, fast, without changing anything.

How a decision stays cheap (the cluster is never rescanned per decision):
- every node has a signature (`NodeSig`); signatures are interned to small ints;
- per request shape there is a table: one score per node slot, and a memo from signature id
  to score, so nodes in the same state are scored once;
- the inventory tells us which node changed; a table recomputes only the nodes that changed
  since it was last used (a change log with one read position per table);
- the pick itself is a vectorised argmin over the table masked by the request's node filter
  (selector, node names) and the pod's CPU and memory; ties go to a per-seed node rank, so a
  run is deterministic for a given seed.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from elasticgpu.allocator.explain import explain as explain_failure
from elasticgpu.allocator.inventory import CardState, Inventory, NodeState
from elasticgpu.allocator.policies import DEFAULT_POLICY, Policy, make_policy, moves
from elasticgpu.allocator.records import CardShare, Placement, PlacementRequest, Unplaceable
from elasticgpu.allocator.shapes import NodeSig, Shape, card_fits, card_sig, node_sig, shape_of, share_memory
from elasticgpu.allocator.workloads import Workload
from elasticgpu.api import names

_INF = np.inf


@dataclass
class _Table:
    """Scores of every node slot for one shape."""

    scores: np.ndarray
    memo: dict[int, float] = field(default_factory=dict)
    position: int = -1
    """How far into the change log this table is; -1 means "recompute every slot"."""


class Allocator:
    """Places requests on an `Inventory` under a policy.

    `place` never mutates; `reserve` / `release` go through to the inventory (which notifies
    this allocator, as it notifies every subscriber, of the node that changed).
    """

    def __init__(
        self,
        inventory: Inventory | None = None,
        *,
        policy: str | Policy = DEFAULT_POLICY,
        workload: Workload | None = None,
        seed: int = 0,
    ) -> None:
        self.inventory = inventory if inventory is not None else Inventory()
        self.policy = make_policy(policy, workload=workload) if isinstance(policy, str) else policy
        self._rng = random.Random(seed)
        self._rank_rng = random.Random(f"rank-{seed}")
        self._index: dict[str, int] = {}
        self._names: list[str | None] = []
        self._sig_of: list[int] = []  # interned signature id per slot; -1 for a removed node
        self._sig_ids: dict[NodeSig, int] = {}
        self._sigs: list[NodeSig] = []
        self._labels: list[Mapping[str, str]] = []
        capacity = 64
        self._cpu = np.zeros(capacity, dtype=np.int64)
        self._mem = np.zeros(capacity, dtype=np.int64)
        self._rank = np.zeros(capacity, dtype=np.float64)
        self._changes: list[int] = []
        self._tables: dict[Shape, _Table] = {}
        self._masks: dict[tuple[object, ...], np.ndarray] = {}
        self.inventory.subscribe(self._on_change)
        for name in self.inventory.node_names():
            self._on_change(name)

    # -- keeping the index in step with the inventory ------------------------------------------

    def _grow(self) -> None:
        size = len(self._cpu) * 2
        self._cpu = np.resize(self._cpu, size)
        self._mem = np.resize(self._mem, size)
        self._rank = np.resize(self._rank, size)
        for table in self._tables.values():
            old = table.scores
            table.scores = np.full(size, _INF)
            table.scores[: len(old)] = old

    def _on_change(self, name: str) -> None:
        slot = self._index.get(name)
        if name not in self.inventory:
            if slot is not None:
                self._sig_of[slot] = -1
                self._names[slot] = None
                del self._index[name]
                self._changes.append(slot)
                self._masks.clear()
            return
        node = self.inventory.node(name)
        if slot is None:
            slot = len(self._names)
            if slot >= len(self._cpu):
                self._grow()
            self._index[name] = slot
            self._names.append(name)
            self._sig_of.append(-1)
            self._labels.append(node.record.labels)
            self._rank[slot] = self._rank_rng.random()
            self._masks.clear()
        elif self._labels[slot] != node.record.labels:
            self._labels[slot] = node.record.labels
            self._masks.clear()
        self._cpu[slot] = node.cpu_free
        self._mem[slot] = node.memory_free
        sig = node_sig(node)
        sig_id = self._sig_ids.get(sig)
        if sig_id is None:
            sig_id = len(self._sigs)
            self._sig_ids[sig] = sig_id
            self._sigs.append(sig)
        if sig_id != self._sig_of[slot]:
            self._sig_of[slot] = sig_id
            self._changes.append(slot)
        if len(self._changes) > 8 * len(self._cpu) + 4096:
            # Keep the log bounded: tables start over with a full (memoised) recompute.
            self._changes.clear()
            for table in self._tables.values():
                table.position = -1

    # -- deciding ------------------------------------------------------------------------------

    def _table(self, shape: Shape) -> _Table:
        table = self._tables.get(shape)
        if table is None:
            table = _Table(np.full(len(self._cpu), _INF))
            self._tables[shape] = table
        if table.position < 0:
            slots: object = range(len(self._names))
        else:
            slots = set(self._changes[table.position :])
        memo = table.memo
        scores = table.scores
        sig_of = self._sig_of
        for slot in slots:  # type: ignore[attr-defined]
            sig_id = sig_of[slot]
            if sig_id < 0:
                scores[slot] = _INF
                continue
            score = memo.get(sig_id)
            if score is None:
                score = self.policy.best(self._sigs[sig_id], shape)[0]
                memo[sig_id] = score
            scores[slot] = score
        table.position = len(self._changes)
        return table

    def _mask(self, request: PlacementRequest) -> np.ndarray | None:
        """Node slots the request's filters allow, or None when it has no filters."""
        if not request.node_selector and not request.nodes:
            return None
        key = (tuple(sorted(request.node_selector.items())), request.nodes)
        mask = self._masks.get(key)
        if mask is None:
            mask = np.zeros(len(self._cpu), dtype=bool)
            for slot, name in enumerate(self._names):
                if name is None or (request.nodes and name not in request.nodes):
                    continue
                labels = self._labels[slot]
                mask[slot] = all(labels.get(k) == v for k, v in request.node_selector.items())
            self._masks[key] = mask
        return mask

    def place(self, request: PlacementRequest, *, explain: bool = True) -> Placement | Unplaceable:
        """Where `request` would go now, or why it fits nowhere. Changes nothing.

        `explain=False` skips building the explanation (a generic reason is returned), for
        callers that only count failures.
        """
        shape = shape_of(request)
        n = len(self._names)
        scores = self._table(shape).scores[:n]
        candidates = scores
        mask = self._mask(request)
        if mask is not None:
            candidates = np.where(mask[:n], candidates, _INF)
        if request.cpu_milli or request.memory_mib:
            fits = (self._cpu[:n] >= request.cpu_milli) & (self._mem[:n] >= request.memory_mib)
            candidates = np.where(fits, candidates, _INF)
        if n == 0:
            slot = -1
        elif self.policy.randomized:
            feasible = np.flatnonzero(candidates < _INF)
            slot = int(feasible[self._rng.randrange(len(feasible))]) if len(feasible) else -1
        else:
            slot = int(np.argmin(candidates))
            best = candidates[slot]
            if best == _INF:
                slot = -1
            else:
                ties = np.flatnonzero(candidates == best)
                if len(ties) > 1:
                    slot = int(ties[np.argmin(self._rank[ties])])
        if slot < 0:
            if not explain:
                return Unplaceable(reason="no node fits")
            return explain_failure(self.inventory, request, shape)
        name = self._names[slot]
        assert name is not None
        return self._build(self.inventory.node(name), shape, request)

    def _build(self, node: NodeState, shape: Shape, request: PlacementRequest) -> Placement:
        """The placement on the chosen node: the policy's best move, mapped to real cards."""
        sig = self._sigs[self._sig_of[self._index[node.record.name]]]
        if self.policy.randomized:
            options = list(moves(sig, shape))
            taken = options[self._rng.randrange(len(options))][0]
        else:
            taken = self.policy.best(sig, shape)[1]
        usable = [c for c in node.cards if c.healthy and not c.whole]
        shares: tuple[CardShare, ...]
        if shape.cards < 0:
            shares = ()
        elif shape.cards == 0:
            wanted = taken[0]
            card = next(c for c in usable if card_sig(c) == wanted)
            mem = share_memory(shape, card.record.memory_mib)
            shares = (CardShare(uuid=card.record.uuid, cores=shape.cores, memory_mib=mem),)
        else:
            shares = tuple(
                CardShare(uuid=c.record.uuid, cores=names.CORES_PER_CARD, memory_mib=c.record.memory_mib, whole=True)
                for c in self._whole_cards(usable, shape, taken)
            )
        return Placement(
            node=node.record.name, cards=shares, cpu_milli=request.cpu_milli, memory_mib=request.memory_mib
        )

    @staticmethod
    def _whole_cards(usable: list[CardState], shape: Shape, taken: tuple[object, ...]) -> list[CardState]:
        from elasticgpu.allocator.topology import pick_linked

        fitting = [c for c in usable if card_fits(shape, card_sig(c))]
        # Keep the memory sizes the policy chose (smallest that fit), then prefer NVLink/NUMA.
        sizes = sorted(getattr(t, "memory", 0) for t in taken)
        limit = sizes[-1] if sizes else 0
        preferred = [c for c in fitting if c.record.memory_mib <= limit]
        pool = preferred if len(preferred) >= shape.cards else fitting
        return pick_linked(pool, shape.cards)

    # -- committing ----------------------------------------------------------------------------

    def reserve(self, key: str, placement: Placement) -> None:
        """Record a placement under a claim key (see `Inventory.reserve`)."""
        self.inventory.reserve(key, placement)

    def release(self, key: str) -> Placement | None:
        """Free a claim key's reservation (see `Inventory.release`)."""
        return self.inventory.release(key)

    def allocate(self, key: str, request: PlacementRequest, *, explain: bool = True) -> Placement | Unplaceable:
        """`place` then `reserve` under `key`: the one call a simulation or `plan` needs.
        A key that already holds a reservation gets it back unchanged."""
        held = self.inventory.reservations.get(key)
        if held is not None:
            return held
        result = self.place(request, explain=explain)
        if isinstance(result, Placement):
            self.inventory.reserve(key, result)
        return result
