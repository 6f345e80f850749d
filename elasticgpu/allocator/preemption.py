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
  victims, then the youngest (the least work lost), then the first node/card by name;
- a claim group (a gang) is a victim as a whole: all of its members together or none, wherever they
  are (as KAI preempts a gang: a group left partial holds cards for a job that cannot run), and only
  when every member is of lower priority. It counts once in the total priority (at its highest
  member's) and each of its members in the number of victims.

Up to `EXACT_LIMIT` victims (a group is one) on a card or node the search is exact (every subset, smallest first; a
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
    group: str = ""
    """The claim group it belongs to ("" for none): a group's members are victims together or not at all."""


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


Atom = tuple[str, ...]
"""What is preempted as one: a claim's key, or the keys of all the members of a claim group (sorted)."""


def cost(victims: Iterable[Candidate]) -> tuple[int, int, float, tuple[str, ...]]:
    """How bad preempting `victims` is (smaller is better): total priority (a group once, at its highest
    member's), how many claims, minus the sum of their creation times (younger first: less work lost), then
    their keys (a deterministic tie-break)."""
    chosen = sorted(victims, key=lambda c: c.key)
    groups: dict[str, int] = {}
    for c in chosen:
        if c.group:
            groups[c.group] = max(groups.get(c.group, c.priority), c.priority)
    total = sum(c.priority for c in chosen if not c.group) + sum(groups.values())
    return (total, len(chosen), -sum(c.created for c in chosen), tuple(c.key for c in chosen))


def _atoms(candidates: Iterable[Candidate], inventory: Inventory, priority: int) -> dict[str, Atom]:
    """Each candidate that may be a victim of `priority`, by key, with what goes with it (its group). A group
    with a member of `priority` or above is no victim at all."""
    eligible = {c.key: c for c in candidates if c.key in inventory.reservations}
    members: dict[str, list[str]] = {}
    for c in eligible.values():
        if c.group:
            members.setdefault(c.group, []).append(c.key)
    atoms: dict[str, Atom] = {}
    for key, c in eligible.items():
        atom = tuple(sorted(members[c.group])) if c.group else (key,)
        if all(eligible[k].priority < priority for k in atom):
            atoms[key] = atom
    return atoms


def _keys(atoms: Iterable[Atom]) -> tuple[str, ...]:
    return tuple(sorted({key for atom in atoms for key in atom}))


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
           atoms: Mapping[str, Atom]) -> list[tuple[str, str, tuple[Atom, ...]]]:
    """(node, card uuid or "", victims) for every card (a slice) or node (whole cards) holding a candidate;
    a group there is one victim, with its members elsewhere."""
    whole = request.gpu is not None and request.gpu.is_whole
    units: list[tuple[str, str, tuple[Atom, ...]]] = []
    for node_name in sorted(inventory.node_names()):
        if request.nodes and node_name not in request.nodes:
            continue  # the request may not go there at all (e.g. nodes kept for a claim group)
        node = inventory.node(node_name)
        holders = [node.holders] if whole else [card.holders for card in node.cards]
        uuids = [""] if whole else [card.record.uuid for card in node.cards]
        for uuid, held in zip(uuids, holders, strict=True):
            found = tuple(sorted({atoms[k] for k in held if k in atoms}))
            if found:
                units.append((node_name, uuid, found))
    return units


def _exact(scratch: _Scratch, atoms: tuple[Atom, ...],
           eligible: Mapping[str, Candidate]) -> tuple[tuple[str, ...], Placement] | None:
    """The minimal set of `atoms` of least `cost` whose release makes the request fit, trying every subset."""
    solutions: list[frozenset[Atom]] = []
    best: tuple[tuple[int, int, float, tuple[str, ...]], tuple[str, ...], Placement] | None = None
    for size in range(1, len(atoms) + 1):
        for subset in itertools.combinations(atoms, size):
            chosen = frozenset(subset)
            if any(found <= chosen for found in solutions):
                continue  # a superset of a solution: not minimal
            keys = _keys(subset)
            placement = scratch.fits_without(keys)
            if placement is None:
                continue
            solutions.append(chosen)
            score = cost(eligible[k] for k in keys)
            if best is None or score < best[0]:
                best = (score, keys, placement)
    return None if best is None else (best[1], best[2])


def _greedy(scratch: _Scratch, atoms: tuple[Atom, ...],
            eligible: Mapping[str, Candidate]) -> tuple[tuple[str, ...], Placement] | None:
    """All of `atoms`, then spare the most valuable (highest priority, oldest) while the request still fits."""
    chosen = list(atoms)
    placement = scratch.fits_without(_keys(chosen))
    if placement is None:
        return None

    def value(atom: Atom) -> tuple[int, float, Atom]:
        return (-max(eligible[k].priority for k in atom), min(eligible[k].created for k in atom), atom)

    for atom in sorted(atoms, key=value):
        trial = [a for a in chosen if a != atom]
        fits = scratch.fits_without(_keys(trial))
        if fits is not None:
            chosen, placement = trial, fits
    return _keys(chosen), placement


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
    those of equal or higher priority, are never chosen), with every member of a claim group that may be a
    victim (a group with a member missing here is the caller's to leave out). Changes nothing."""
    given = list(candidates)
    atoms = _atoms(given, inventory, priority)
    if not atoms:
        return NoPreemption(f"no claim of priority below {priority} holds a card")
    eligible = {c.key: c for c in given if c.key in atoms}
    scratches: dict[str, _Scratch] = {}
    best: tuple[tuple[int, int, float, tuple[str, ...]], str, str, tuple[str, ...], Placement] | None = None
    for node, card, found_atoms in _units(inventory, request, atoms):
        scratch = scratches.get(node)
        if scratch is None:
            scratch = scratches[node] = _Scratch(inventory, node, request, policy)
        search = _exact if len(found_atoms) <= exact_limit else _greedy
        found = search(scratch, found_atoms, eligible)
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
