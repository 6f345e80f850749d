"""The allocator: picks a node and card(s) for a request, fast, without changing anything.

How a decision stays cheap (the cluster is never rescanned in Python per decision):
- every node has a signature (`NodeSig`); signatures are interned to small ints, and an
  array holds the signature id of every node slot (id 0 is "no node here");
- per request shape there is a table: one score per signature id (NaN until needed), so all
  nodes in one state are scored once, and a node that changes only brings a new id; the
  table also keeps a score per slot and the slot's change count it reflects, so a decision
  rescores only the slots that changed since the shape was last used;
- a vectorised test of what can fit at all (free CPU, roomiest card, free cards) keeps the
  nodes that cannot host the shape from being scored;
- a signature the table has not seen is resolved by the policy (`Policy.resolver`), which
  may map states that score alike (for fragmentation: the same free cores per card, free
  CPU in the same bucket) to one cached entry;
- the pick is vectorised: the slot scores, masked by the request's node filter and the pod's
  memory, argmin; ties go to a per-seed node rank, so a run is deterministic for a seed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field

import numpy as np

from elasticgpu.allocator.explain import explain as explain_failure
from elasticgpu.allocator.inventory import CardState, Inventory, NodeState
from elasticgpu.allocator.policies import DEFAULT_POLICY, Policy, make_policy, moves
from elasticgpu.allocator.records import CardShare, Placement, PlacementRequest, Unplaceable
from elasticgpu.allocator.shapes import CardSig, NodeSig, Shape, card_fits, card_sig, node_sig, shape_of, share_memory
from elasticgpu.allocator.topology import TOPOLOGIES, Topology
from elasticgpu.allocator.workloads import Workload
from elasticgpu.api import names

_INF = np.inf
# Bound on interned signatures: past it, the index starts over from the nodes' current states
# (a long-lived controller would otherwise keep every state it ever saw).
_MAX_SIGS = 1 << 20


@dataclass
class _Table:
    """Scores of every interned signature for one shape (NaN: not resolved yet)."""

    scores: np.ndarray
    taken: dict[int, object] = field(default_factory=dict)
    """The policy's token for its move, by signature id (read when a placement is built)."""
    memo: dict[Hashable, tuple[float, object]] = field(default_factory=dict)
    """The policy's cache for this shape: states that score alike share one entry."""
    resolve: Callable[[object, NodeSig], tuple[float, object]] | None = None
    """The policy's resolver for this shape (bound to `memo`)."""
    slot_scores: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Score per node slot (inf where the shape cannot fit), as of `seen`."""
    seen: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Per slot, the allocator's change count that `slot_scores` reflects (-1: never)."""


def node_isolation(node: NodeState) -> frozenset[str]:
    """The isolation modes a node provides: those every card of it lists (none without cards)."""
    if not node.cards:
        return frozenset()
    return frozenset.intersection(*(card.record.isolation for card in node.cards))


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
        self._labels: list[Mapping[str, str]] = []
        self._isolation: list[frozenset[str]] = []  # per slot: the modes every card of the node provides
        capacity = 64
        self._sig_of = np.zeros(capacity, dtype=np.intp)  # interned signature id per slot; 0: no node
        # What each slot has free, for a vectorised test of what can fit at all (most nodes
        # cannot host most shapes once the cluster fills: they are never scored).
        self._cpu = np.full(capacity, -1, dtype=np.int64)
        self._mem = np.full(capacity, -1, dtype=np.int64)
        self._most = np.full(capacity, -1, dtype=np.int64)  # free cores of the emptiest usable card
        self._full = np.full(capacity, -1, dtype=np.int64)  # cards nobody holds
        self._version = np.zeros(capacity, dtype=np.int64)  # changes per slot: tables rescore what moved
        self._rank = np.zeros(capacity, dtype=np.float64)
        self._half_rank = np.zeros(capacity, dtype=np.float64)
        self._tables: dict[Shape, _Table] = {}
        self._masks: dict[tuple[object, ...], np.ndarray] = {}
        self._reset_sigs()
        self.inventory.subscribe(self._on_change)
        for name in self.inventory.node_names():
            self._on_change(name)

    # -- keeping the index in step with the inventory ------------------------------------------

    def _reset_sigs(self) -> None:
        self._sig_ids: dict[NodeSig, int] = {}
        self._sigs: list[NodeSig | None] = [None]
        self._prepared: list[object] = [None]  # the policy's view of each signature
        self._tables.clear()

    def _intern(self, sig: NodeSig) -> int:
        sig_id = self._sig_ids.get(sig)
        if sig_id is None:
            sig_id = len(self._sigs)
            self._sig_ids[sig] = sig_id
            self._sigs.append(sig)
            self._prepared.append(self.policy.prepare(sig))
        return sig_id

    def _grow(self) -> None:
        size = len(self._sig_of) * 2
        self._sig_of = np.resize(self._sig_of, size)
        self._sig_of[size // 2 :] = 0
        for name in ("_cpu", "_mem", "_most", "_full"):
            grown = np.full(size, -1, dtype=np.int64)
            grown[: size // 2] = getattr(self, name)
            setattr(self, name, grown)
        self._version = np.resize(self._version, size)
        self._version[size // 2 :] = 0
        self._rank = np.resize(self._rank, size)
        self._half_rank = np.resize(self._half_rank, size)

    def _on_change(self, name: str) -> None:
        slot = self._index.get(name)
        if name not in self.inventory:
            if slot is not None:
                self._sig_of[slot] = 0
                self._cpu[slot] = self._mem[slot] = self._most[slot] = self._full[slot] = -1
                self._version[slot] += 1
                self._names[slot] = None
                del self._index[name]
                self._masks.clear()
            return
        node = self.inventory.node(name)
        if slot is None:
            slot = len(self._names)
            if slot >= len(self._sig_of):
                self._grow()
            self._index[name] = slot
            self._names.append(name)
            self._labels.append(node.record.labels)
            self._isolation.append(node_isolation(node))
            self._rank[slot] = self._rank_rng.random()
            self._half_rank[slot] = 0.5 * self._rank[slot]
            self._masks.clear()
        else:
            if self._labels[slot] != node.record.labels:
                self._labels[slot] = node.record.labels
                self._masks.clear()
            if self._isolation[slot] != (modes := node_isolation(node)):
                self._isolation[slot] = modes
                self._masks.clear()
        if len(self._sigs) >= _MAX_SIGS:
            self._reset_sigs()
            for other, other_name in enumerate(self._names):
                if other_name is not None and other != slot:
                    self._sig_of[other] = self._intern(node_sig(self.inventory.node(other_name)))
        sig = node_sig(node)
        self._version[slot] += 1
        self._sig_of[slot] = self._intern(sig)
        self._cpu[slot] = sig.cpu_free
        self._mem[slot] = sig.memory_free
        cards = sig.cards
        # Card signatures sort by free cores first: the last is the roomiest.
        self._most[slot] = cards[-1].free_cores if cards else -1
        self._full[slot] = sum(1 for c in cards if c.idle and c.free_cores == names.CORES_PER_CARD) if cards else 0

    # -- deciding ------------------------------------------------------------------------------

    def _scores(self, shape: Shape, n: int, memory: int) -> tuple[np.ndarray, _Table]:
        """Score of every node slot for the shape and the pod's memory (inf: does not fit),
        resolving the states the table has not seen among the nodes that might fit."""
        table = self._tables.get(shape)
        count = len(self._sigs)
        if table is None:
            scores = np.full(max(64, 2 * count), np.nan)
            scores[0] = _INF
            table = _Table(scores)
            table.resolve = self.policy.resolver(shape, table.memo)
            self._tables[shape] = table
        elif len(table.scores) < count:
            old = table.scores
            table.scores = np.full(2 * count, np.nan)
            table.scores[: len(old)] = old
        size = len(self._version)
        if len(table.seen) < size:
            grown = np.full(size, -1, dtype=np.int64)
            grown[: len(table.seen)] = table.seen
            table.seen = grown
            table.slot_scores = np.resize(table.slot_scores, size)
        # Only the slots that changed since this table was last used are scored again.
        version = self._version[:n]
        dirty = np.flatnonzero(table.seen[:n] != version)
        if len(dirty):
            # Necessary conditions of any fit, whatever the policy: the pod's CPU, and a card
            # with room for a share / enough free cards for whole ones.
            fits = self._cpu[dirty] >= shape.cpu_milli
            if shape.cards == 0:
                fits &= self._most[dirty] >= shape.cores
            elif shape.cards > 0:
                fits &= self._full[dirty] >= shape.cards
            ids = self._sig_of[dirty]
            values = table.scores
            scores = values[ids]
            missing = np.flatnonzero(np.isnan(scores) & fits)
            if len(missing):
                resolve = table.resolve
                assert resolve is not None
                sigs = self._sigs
                prepared = self._prepared
                taken = table.taken
                new = ids[missing]
                for sig_id in set(new.tolist()):
                    score, token = resolve(prepared[sig_id], sigs[sig_id])
                    values[sig_id] = score
                    taken[sig_id] = token
                scores[missing] = values[new]
            table.slot_scores[dirty] = np.where(fits, scores, _INF)
            table.seen[dirty] = version[dirty]
        scores = table.slot_scores[:n]
        if memory:
            scores = np.where(self._mem[:n] >= memory, scores, _INF)
        return scores, table

    def _mask(self, request: PlacementRequest) -> np.ndarray | None:
        """Node slots the request's filters allow, or None when it has no filters."""
        mode = request.needs_isolation if request.gpu is not None and not request.gpu.is_whole else ""
        if not request.node_selector and not request.nodes and not mode:
            return None
        key = (tuple(sorted(request.node_selector.items())), request.nodes, mode)
        mask = self._masks.get(key)
        if mask is None:
            mask = np.zeros(len(self._sig_of), dtype=bool)
            for slot, name in enumerate(self._names):
                if name is None or (request.nodes and name not in request.nodes):
                    continue
                labels = self._labels[slot]
                mask[slot] = all(labels.get(k) == v for k, v in request.node_selector.items()) and (
                    not mode or mode in self._isolation[slot])
            self._masks[key] = mask
        return mask

    def place(self, request: PlacementRequest, *, explain: bool = True) -> Placement | Unplaceable:
        """Where `request` would go now, or why it fits nowhere. Changes nothing.

        `explain=False` skips building the explanation (a generic reason is returned), for
        callers that only count failures.

        Whole cards with a required topology (or RDMA NICs) go only to nodes that can meet it;
        several whole cards without one go to a node with a fully NVLinked set when some node
        has one (the policy chooses among those), else wherever the policy says.
        """
        gpu = request.gpu
        if gpu is None or not gpu.is_whole or (gpu.cards < 2 and not request.nics):
            return self._place(request, None, explain=explain)
        topology = _topology(request.topology)
        if topology != "Any" or request.nics:
            allowed = self._topology_nodes(request, topology)
            result = self._place(request, allowed, explain=explain)
            if isinstance(result, Unplaceable) and not allowed:
                wanted = [f"topology {topology}"] if topology != "Any" else []
                wanted += [f"{request.nics} RDMA NIC(s) on the cards' PCIe roots"] if request.nics else []
                return Unplaceable(
                    reason=f"no node has {gpu.cards} free card(s) with {' and '.join(wanted)}"
                    f" (the claim's class asks for it; use topology: Any, or fewer NICs, to relax it)",
                    closest=result.closest,
                )
            return result
        linked = self._topology_nodes(request, "NVLink")
        if linked:
            preferred = self._place(request, linked, explain=False)
            if isinstance(preferred, Placement):
                return preferred
        return self._place(request, None, explain=explain)

    def _topology_nodes(self, request: PlacementRequest, topology: Topology) -> frozenset[str]:
        """Nodes with enough free cards for the request that meet `topology` (and have the
        request's RDMA NICs on the chosen cards' roots)."""
        from elasticgpu.allocator.topology import has_fit

        gpu = request.gpu
        assert gpu is not None
        shape = shape_of(request)
        found: set[str] = set()
        for node in self.inventory.nodes():
            name = node.record.name
            if request.nodes and name not in request.nodes:
                continue
            fitting = [c for c in node.cards if c.healthy and not c.whole and card_fits(shape, card_sig(c))]
            if len(fitting) < gpu.cards or not has_fit(fitting, gpu.cards, topology, request.nics):
                continue
            found.add(name)
        return frozenset(found)

    def _place(
        self, request: PlacementRequest, allowed: frozenset[str] | None, *, explain: bool
    ) -> Placement | Unplaceable:
        """`place` on the nodes of `allowed` only (None: any node)."""
        shape = self.policy.table_shape(shape_of(request))
        n = len(self._names)
        slot = -1
        table: _Table | None = None
        if n:
            # The pod's CPU is part of the shape; its memory is too when the policy scores it,
            # and it filters in any case.
            candidates, table = self._scores(shape, n, request.memory_mib)
            mask = self._mask(request)
            if mask is not None:
                candidates = np.where(mask[:n], candidates, _INF)
            if allowed is not None:
                # Not cached (as _mask is): the set changes with every reservation.
                ok = np.fromiter((name in allowed for name in self._names[:n]), dtype=bool, count=n)
                candidates = np.where(ok, candidates, _INF)
            if self.policy.integral:
                # Whole-number scores: half the per-seed node rank breaks ties in one argmin.
                candidates = candidates + self._half_rank[:n]
                slot = int(np.argmin(candidates))
                if candidates[slot] == _INF:
                    slot = -1
            elif self.policy.randomized:
                feasible = np.flatnonzero(candidates < _INF)
                if len(feasible):
                    slot = int(feasible[self._rng.randrange(len(feasible))])
            else:
                slot = int(np.argmin(candidates))
                best = candidates[slot]
                if best == _INF:
                    slot = -1
                else:
                    ties = np.flatnonzero(candidates == best)
                    if len(ties) > 1:
                        slot = int(ties[np.argmin(self._rank[ties])])
        if slot < 0 or table is None:
            if not explain:
                return Unplaceable(reason="no node fits")
            return explain_failure(self.inventory, request, shape_of(request))
        name = self._names[slot]
        assert name is not None
        sig_id = int(self._sig_of[slot])
        sig = self._sigs[sig_id]
        assert sig is not None
        cards = () if self.policy.randomized else self.policy.cards(sig, shape, table.taken[sig_id])
        return self._build(self.inventory.node(name), sig, shape, request, cards)

    def _build(
        self, node: NodeState, sig: NodeSig, shape: Shape, request: PlacementRequest, taken: tuple[CardSig, ...]
    ) -> Placement:
        """The placement on the chosen node: the policy's best move, mapped to real cards."""
        if self.policy.randomized:
            options = list(moves(sig, shape))
            taken = options[self._rng.randrange(len(options))][0]
        shares: tuple[CardShare, ...]
        if shape.cards < 0:
            shares = ()
        elif shape.cards == 0:
            wanted = taken[0]
            card = next(c for c in node.cards if not c.whole and c.healthy and card_sig(c) == wanted)
            mem = share_memory(shape, card.record.memory_mib)
            shares = (CardShare(uuid=card.record.uuid, cores=shape.cores, memory_mib=mem),)
        else:
            usable = [c for c in node.cards if c.healthy and not c.whole]
            chosen, nics = self._whole_cards(
                usable, shape, taken, _topology(request.topology), request.nics
            )
            shares = tuple(
                CardShare(uuid=c.record.uuid, cores=names.CORES_PER_CARD, memory_mib=c.record.memory_mib, whole=True)
                for c in chosen
            )
            return Placement(
                node=node.record.name, cards=shares, cpu_milli=request.cpu_milli, memory_mib=request.memory_mib,
                nics=nics or (),
            )
        return Placement(
            node=node.record.name, cards=shares, cpu_milli=request.cpu_milli, memory_mib=request.memory_mib
        )

    @staticmethod
    def _whole_cards(
        usable: list[CardState], shape: Shape, taken: tuple[object, ...], topology: Topology, rdma: int
    ) -> tuple[list[CardState], tuple[str, ...] | None]:
        """The cards (and RDMA NICs) of a whole-card placement on one node: the memory sizes the
        policy chose (smallest that fit) when they meet the topology and NICs, else any that fit.
        The NICs are None when the node cannot give them (the node filter has ruled that out)."""
        from elasticgpu.allocator.topology import pick_linked, pick_nics

        fitting = [c for c in usable if card_fits(shape, card_sig(c))]
        sizes = sorted(getattr(t, "memory", 0) for t in taken)
        limit = sizes[-1] if sizes else 0
        preferred = [c for c in fitting if c.record.memory_mib <= limit]
        chosen: list[CardState] = []
        nics: tuple[str, ...] | None = None
        for pool in (preferred, fitting):
            if len(pool) < shape.cards:
                continue
            chosen = pick_linked(pool, shape.cards, topology, rdma) or []
            nics = pick_nics(chosen, rdma) if chosen else None
            if chosen and nics is not None:
                break
        if not chosen:
            # Only reachable without a node filter (topology Any): take the policy's count anyway.
            chosen = pick_linked(fitting, shape.cards) or fitting[: shape.cards]
        return chosen, nics

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


def _topology(value: str) -> Topology:
    """A request's topology as the allocator's literal; an unknown one reads as Any (the API
    validates it, so this only guards callers that build requests by hand)."""
    for known in TOPOLOGIES:
        if value == known:
            return known
    return "Any"
