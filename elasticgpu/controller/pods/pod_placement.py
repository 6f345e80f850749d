"""Where a pod's WaitForFirstConsumer claims go: pure decisions over nodes, pods and the
allocator's picture of the cards. No I/O.

A pod whose claims wait for their first consumer needs one node that:
1. the pod may run on: its `nodeSelector`, its required node affinity (any term, each term all
   of its requirements), no NoSchedule/NoExecute taint it does not tolerate, not cordoned
   (`node_filter`);
2. has what the pod requests: allocatable minus the requests of the non-terminated pods on it,
   for CPU, memory and every other resource the node reports, and room for one more pod
   (`fits_resources`; the pod sync lists them for the one node it
   checks, plus the pods it pinned there itself that the scheduler has not bound yet), and may
   join the pods there: host ports, required pod (anti-)affinity (`pod_neighbours`);
3. can take all of the pod's claims at once (`propose`): the allocator places the largest claim
   among the candidates (its policy picks the node), then every claim is placed on that node in
   turn, each tentatively reserved so the next sees it, all released again before returning.
   A claim of a `partitioning: MIG` class is planned as its Immediate bind is
   (`flow/mig_binding.place_on`: profile, card and start slot among the MIG cards of the node),
   beside the instances the pod's earlier claims were given in the same pass.

`propose` answers one node at a time, so that the caller can check resources (which takes a list
of that node's pods) without holding the picture's lock, and rule the node out if it falls short.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from elasticgpu.allocator import Placement, PlacementRequest, ReservationConflict, Unplaceable
from elasticgpu.api.gpu import GPUPartition
from elasticgpu.controller.decisions import pod_gate
from elasticgpu.controller.flow import mig_binding
from elasticgpu.controller.picture.reservations import Ledger

Body = dict[str, Any]
MIB = 1024 * 1024
_SUFFIXES = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9, "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")
_NO_SCHEDULE = ("NoSchedule", "NoExecute")
MAX_REASONS = 8
"""Nodes named in an explanation at most (a user reads it in `kubectl describe pod`)."""


# -- resources ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resources:
    """CPU (milli-cores), memory (MiB, rounded up) and every other resource by its name
    (ephemeral-storage and hugepages in bytes, extended resources such as `example.com/fpga` in
    units), as the scheduler's NodeResourcesFit counts them."""

    cpu_milli: int = 0
    memory_mib: int = 0
    others: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def __add__(self, other: Resources) -> Resources:
        names = self.others.keys() | other.others.keys()
        return Resources(self.cpu_milli + other.cpu_milli, self.memory_mib + other.memory_mib,
                         {n: self.others.get(n, 0) + other.others.get(n, 0) for n in names})  # fmt: skip

    def __sub__(self, other: Resources) -> Resources:
        names = self.others.keys() | other.others.keys()
        return Resources(self.cpu_milli - other.cpu_milli, self.memory_mib - other.memory_mib,
                         {n: self.others.get(n, 0) - other.others.get(n, 0) for n in names})  # fmt: skip


POD_COUNT = "pods"
"""The allocatable entry that bounds how many pods a node runs (kubelet's maxPods, 110 by default)."""


def quantity(value: object) -> Decimal:
    """A Kubernetes quantity (`500m`, `2`, `1.5Gi`, `129e6`) as a number; 0 when unreadable."""
    match = _QUANTITY.match(str(value).strip())
    if match is None or match.group(2) not in _SUFFIXES:
        return Decimal(0)
    try:
        return Decimal(match.group(1)) * _SUFFIXES[match.group(2)]
    except InvalidOperation:
        return Decimal(0)


def _resources(values: Mapping[str, Any] | None) -> Resources:
    values = values or {}
    others = {str(name): math.ceil(quantity(amount)) for name, amount in values.items()
              if name not in ("cpu", "memory", POD_COUNT)}  # fmt: skip
    return Resources(
        cpu_milli=math.ceil(quantity(values.get("cpu", 0)) * 1000),
        memory_mib=math.ceil(quantity(values.get("memory", 0)) / MIB),
        others={name: amount for name, amount in others.items() if amount},
    )


def _max(a: Resources, b: Resources) -> Resources:
    names = a.others.keys() | b.others.keys()
    return Resources(max(a.cpu_milli, b.cpu_milli), max(a.memory_mib, b.memory_mib),
                     {n: max(a.others.get(n, 0), b.others.get(n, 0)) for n in names})  # fmt: skip


def pod_requests(pod: Mapping[str, Any]) -> Resources:
    """What the scheduler counts for a pod: the sum of its containers' requests (restartable
    init containers, i.e. sidecars, included), at least the largest ordinary init container's,
    plus the pod overhead."""
    spec = pod.get("spec") or {}
    total = Resources()
    sidecars = Resources()
    largest_init = Resources()
    for container in spec.get("initContainers") or []:
        requests = _resources((container.get("resources") or {}).get("requests"))
        if container.get("restartPolicy") == "Always":
            sidecars = sidecars + requests
        else:
            largest_init = _max(largest_init, sidecars + requests)
    for container in spec.get("containers") or []:
        total = total + _resources((container.get("resources") or {}).get("requests"))
    return _max(total + sidecars, largest_init) + _resources(spec.get("overhead"))


def allocatable(node: Mapping[str, Any]) -> Resources | None:
    """The node's allocatable resources; None when it reports none (nothing to check)."""
    values = (node.get("status") or {}).get("allocatable") or {}
    if not values:
        return None
    return _resources(values)


def fits_resources(pod: Mapping[str, Any], node: Mapping[str, Any], others: Iterable[Mapping[str, Any]]) -> str:
    """Why the pod's requests do not fit on `node` next to `others` (the pods on it; terminated
    ones and the pod itself are skipped), or "" when they fit. Every resource the node reports
    is checked (CPU, memory, ephemeral storage, hugepages, extended resources, the pod count);
    a resource the pod requests that the node does not have at all does not fit either."""
    reported = (node.get("status") or {}).get("allocatable") or {}
    total = allocatable(node)
    if total is None:
        return ""
    uid = (pod.get("metadata") or {}).get("uid")
    used = Resources()
    seen: set[str] = set()
    for other in others:
        other_uid = str((other.get("metadata") or {}).get("uid", ""))
        if other_uid == uid or other_uid in seen or pod_gate.is_terminated(other):
            continue
        seen.add(other_uid)
        used = used + pod_requests(other)
    free = total - used
    wanted = pod_requests(pod)
    problems = []
    # As the scheduler: a resource the pod does not request is not checked (a node already
    # over-committed on it still takes the pod).
    if "cpu" in reported and 0 < wanted.cpu_milli > free.cpu_milli:
        problems.append(f"{max(free.cpu_milli, 0) / 1000:g} CPU free, the pod requests {wanted.cpu_milli / 1000:g}")
    if "memory" in reported and 0 < wanted.memory_mib > free.memory_mib:
        problems.append(f"{max(free.memory_mib, 0)} MiB memory free, the pod requests {wanted.memory_mib} MiB")
    for name, amount in sorted(wanted.others.items()):
        if name not in reported:
            problems.append(f"no {name} on the node, the pod requests {amount}")
        elif amount > free.others.get(name, 0):
            problems.append(f"{max(free.others.get(name, 0), 0)} {name} free, the pod requests {amount}")
    if POD_COUNT in reported and len(seen) + 1 > math.floor(quantity(reported[POD_COUNT])):
        problems.append(f"already runs {len(seen)} pods of at most {reported[POD_COUNT]}")
    return "; ".join(problems)


# -- node filters ---------------------------------------------------------------------------------


def _requirement_matches(requirement: Mapping[str, Any], value: str | None) -> bool:
    operator = requirement.get("operator")
    values = [str(v) for v in requirement.get("values") or []]
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            have, limit = int(value), int(values[0])
        except ValueError:
            return False
        return have > limit if operator == "Gt" else have < limit
    return False


def _term_matches(term: Mapping[str, Any], name: str, labels: Mapping[str, str]) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term matches no node (as the scheduler reads it)
    return all(_requirement_matches(r, labels.get(str(r.get("key")))) for r in expressions) and all(
        _requirement_matches(r, name if r.get("key") == pod_gate.NODE_FIELD else None) for r in fields)


def _tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    for toleration in tolerations:
        effect = toleration.get("effect")
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key")
        if not key:
            if toleration.get("operator") == "Exists":
                return True
            continue
        if key != taint.get("key"):
            continue
        if toleration.get("operator") == "Exists" or (toleration.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def node_filter(pod: Mapping[str, Any], name: str, node: Mapping[str, Any] | None) -> str:
    """Why the pod may not run on node `name` (`node`: its body, None when the cluster has no Node
    object for it: then only its name can be checked), or "" when it may."""
    spec = pod.get("spec") or {}
    labels: Mapping[str, str] = ((node or {}).get("metadata") or {}).get("labels") or {}
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return f"does not match the pod's nodeSelector {key}={value}"
    terms = pod_gate.required_terms(pod)
    if terms and not any(_term_matches(term, name, labels) for term in terms):
        return "does not match the pod's required node affinity"
    node_spec = (node or {}).get("spec") or {}
    tolerations = spec.get("tolerations") or []
    if node_spec.get("unschedulable") and not _tolerates(
            tolerations, {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}):
        return "is cordoned (spec.unschedulable)"
    for taint in node_spec.get("taints") or []:
        if taint.get("effect") in _NO_SCHEDULE and not _tolerates(tolerations, taint):
            value = f"={taint['value']}" if taint.get("value") else ""
            return f"has the taint {taint.get('key')}{value}:{taint.get('effect')}, which the pod does not tolerate"
    return ""


# -- claims on one node ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Wanted:
    """One claim to place: its reservation key (`egpu-<claim uid>`), request and policy."""

    claim: str
    key: str
    request: PlacementRequest
    policy: str
    mig: bool = False
    """Its class has `partitioning: MIG`: it gets a MIG instance (`flow/mig_binding`)."""


@dataclass(frozen=True)
class Proposal:
    """A node that can take every claim, with each claim's placement (by reservation key) and,
    for MIG claims, the partition (profile, start) of each of its cards."""

    node: str
    placements: Mapping[str, Placement]
    partitions: Mapping[str, Mapping[str, GPUPartition]] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class NoNode:
    """No candidate takes all the claims: the allocator's reason, for the user."""

    reason: str


def largest_first(wanted: Sequence[Wanted]) -> list[Wanted]:
    """The claims hardest to place first: the allocator picks the node for the first."""

    def size(w: Wanted) -> tuple[int, int, int]:
        gpu = w.request.gpu
        return (0, 0, 0) if gpu is None else (gpu.cards, gpu.cores, gpu.memory_mib or 0)

    return sorted(wanted, key=size, reverse=True)


def _place_mig(ledger: Ledger, one: Wanted, nodes: Iterable[str],
               taken: Sequence[mig_binding.MigPlan]) -> mig_binding.MigPlan | mig_binding.MigWait:
    assert one.request.gpu is not None  # a claim's request always has its GPU part
    return mig_binding.place_on(ledger, one.request.gpu, models=one.request.models,
                                node_selector=dict(one.request.node_selector or {}), nodes=frozenset(nodes),
                                taken=taken)


def place_all_on(ledger: Ledger, wanted: Sequence[Wanted], node: str) -> Proposal | str:
    """Each claim's placement on `node`, all together (each tentatively reserved while the next
    is placed; every tentative reservation released before returning), or why they do not fit."""
    placements: dict[str, Placement] = {}
    partitions: dict[str, Mapping[str, GPUPartition]] = {}
    instances: list[mig_binding.MigPlan] = []
    reserved: list[str] = []
    try:
        for one in wanted:
            if one.key in ledger.inventory.reservations:
                # Reserved in the inventory but not on a GPU (a batch's write in flight): not
                # ours to place again, nor to release below.
                return f"cannot take claim {one.claim} now: its capacity is being reserved"
            if one.mig:
                planned = _place_mig(ledger, one, {node}, instances)
                if isinstance(planned, mig_binding.MigWait):
                    return f"cannot take claim {one.claim} ({one.request.describe()}): {planned.message}"
                instances.append(planned)
                placements[one.key], partitions[one.key] = planned.placement, planned.partitions
                continue
            request = dataclasses.replace(one.request, nodes=frozenset({node}))
            result = ledger.place(request, policy=one.policy)
            if isinstance(result, Unplaceable):
                return f"cannot take claim {one.claim} ({one.request.describe()}): {result.reason}"
            try:
                ledger.inventory.reserve(one.key, result)
            except ReservationConflict as err:  # held under its key already: the caller handles held keys
                return f"cannot take claim {one.claim}: {err}"
            reserved.append(one.key)
            placements[one.key] = result
        return Proposal(node, placements, partitions)
    finally:
        for key in reserved:
            ledger.inventory.release(key)


def propose(ledger: Ledger, wanted: Sequence[Wanted], candidates: Iterable[str]) -> tuple[Proposal | NoNode,
                                                                                          dict[str, str]]:
    """The allocator's best node among `candidates` for all of `wanted`, and the candidates it
    tried and ruled out on the way (name -> why). Call under the picture's lock."""
    remaining = set(candidates)
    ruled_out: dict[str, str] = {}
    ordered = largest_first(wanted)
    first = ordered[0]
    while remaining:
        if first.mig:
            planned = _place_mig(ledger, first, remaining, ())
            if isinstance(planned, mig_binding.MigWait):
                return NoNode(f"claim {first.claim} ({first.request.describe()}): {planned.message}"), ruled_out
            node = planned.placement.node
        else:
            result = ledger.place(dataclasses.replace(first.request, nodes=frozenset(remaining)), policy=first.policy)
            if isinstance(result, Unplaceable):
                why = result.reason + (f" (closest: {result.closest})" if result.closest else "")
                return NoNode(f"claim {first.claim} ({first.request.describe()}): {why}"), ruled_out
            node = result.node
        placed = place_all_on(ledger, ordered, node)
        if isinstance(placed, str):
            ruled_out[node] = placed
            remaining.discard(node)
            continue
        return placed, ruled_out
    return NoNode("no candidate node is left"), ruled_out


def explain(reason: str, ruled_out: Mapping[str, str]) -> str:
    """One message for the pod's Event and condition: the allocator's reason and the nodes ruled
    out, each with why (at most `MAX_REASONS` named)."""
    if not ruled_out:
        return reason
    named = sorted(ruled_out.items())
    parts = [f"{node} {why}" for node, why in named[:MAX_REASONS]]
    more = f" and {len(named) - MAX_REASONS} more" if len(named) > MAX_REASONS else ""
    return f"{reason}; ruled out: " + "; ".join(parts) + more
