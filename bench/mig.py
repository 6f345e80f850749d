"""MIG placement on a trace derived from Alibaba's openb GPU trace: how many requests fit.

Data: ../shared/traces/openb/ (cluster-trace-gpu-v2023, Weng et al., "Beware of
Fragmentation", USENIX ATC'23; research use, cite the paper; nothing is copied here).

The MIG trace, derived on the fly:
- the cluster of `openb_node_list_gpu_node.csv` (1213 nodes, 6212 cards), every card taken as
  a MIG card of `--model` (A100-80GB by default; the trace's own models are undisclosed or not
  MIG-capable);
- each GPU pod of the pod list becomes a MIG request: a fractional GPU (gpu_milli < 1000) the
  smallest profile covering its cores and memory in proportion (0.32 GPU -> 3g.40gb, 0.47 ->
  4g.40gb, 0.81 -> 7g.80gb), N whole GPUs N cards of the largest profile (7g) on one node;
  CPU-only pods are left out (MIG does not see them), CPU and main memory are not counted;
- the requests sampled with replacement, shuffled per seed, until the memory slices they ask
  for reach 100% of the cluster's slices; each is tried once, in order, and fails if it fits
  nowhere (no departures).

Policies, each on the same sequence per seed:
- `first-fit`: the first node, card and start where the profile fits (an admin carving by hand,
  or a plugin creating instances on demand without a placement model);
- `fixed <layout>`: every card pre-carved into one of NVIDIA's standard layouts (as
  nvidia-mig-parted configures them); a request takes a free pre-carved instance of the
  smallest profile that covers it (larger ones allowed, which favours this baseline);
  `fixed mixed` carves the cards of each node in turn as all-7g, 4g+3g and 3g+2g+1g+1g;
- `fragmentation`: ours (`elasticgpu.allocator.mig`), with the trace's request mix as workload.

Offline rows, fill only (they see the whole sequence at once, so there is no churn figure):
- `offline first-fit decreasing`: the fill sequence sorted by size (memory slices, then compute
  slices, largest first), then first-fit;
- `upper bound`: no placement at all, online or offline, fits more requests than this. It is
  the optimum of an integer program (`upper_bound`): each card holds one set of instances the
  slot rules allow (a "configuration", all of them enumerated from the placement tables), a
  request counts when an instance of its profile is in some card's configuration, and each
  node hosts one pattern of N-card requests (N >= 2) whose cards fit in it. Only the order of
  arrival and which node a single card is on are relaxed away, so every real placement is a
  solution of it and its optimum bounds every policy. Solved exactly with HiGHS
  (scipy.optimize.milp).
- `upper bound at ours' whole cards`: the same, among placements that place at least as many
  whole-card requests (7g, and N cards) as `fragmentation` did in its fill. The best placement
  of all refuses early whole-card requests to fit more small ones later; a placer that places
  each request that fits when it arrives cannot. Where this bound equals ours, ours lost no
  request to placement: what separates it from `upper bound` is which requests were admitted.

Prints, per policy and averaged over the seeds, the share of requests that fit and the share
of memory slices in use when 100% of capacity has arrived.

    python bench/mig.py                     # default trace, 3 seeds
    python bench/mig.py --trace gpushare100 --seeds 5 --model H200-141GB
"""

from __future__ import annotations

import argparse
import csv
import heapq
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from elasticgpu.allocator.mig import (  # noqa: E402
    EMPTY,
    MigAllocator,
    MigCard,
    MigModel,
    MigPlacement,
    MigRequest,
    Profile,
    Slots,
    by_name,
)
from elasticgpu.allocator.mig import slots as slot_rules  # noqa: E402

# NVIDIA's standard layouts, by profile size (the names of each model follow its memory).
LAYOUTS: dict[str, tuple[tuple[int, int], ...]] = {
    # (compute slices, memory slices) of each instance, first to last slice
    "all-7g": ((7, 8),),
    "4g+3g": ((4, 4), (3, 4)),
    "3g+2g+1g+1g": ((3, 4), (2, 2), (1, 1), (1, 1)),
    "all-2g+1g": ((2, 2), (2, 2), (2, 2), (1, 1)),
    "all-1g": ((1, 1),) * 7,
}
MIXED = ("all-7g", "4g+3g", "3g+2g+1g+1g")
FIXED = (*LAYOUTS, "mixed")
POLICIES = ("first-fit", *(f"fixed {name}" for name in FIXED), "fragmentation")
OFFLINE = ("offline first-fit decreasing", "upper bound", "upper bound at ours' whole cards")
ROWS = (*POLICIES, *OFFLINE)


@dataclass(frozen=True)
class Request:
    name: str
    request: MigRequest
    slices: int
    """Memory slices the request takes (its profile's size, times its cards)."""
    seconds: int
    """How long the pod ran in the trace (deletion - creation), capped (see `load_requests`)."""


def load_nodes(path: Path) -> list[tuple[str, int]]:
    """(node name, cards) of the nodes with GPUs."""
    with path.open() as f:
        return [(row["sn"], int(row["gpu"])) for row in csv.DictReader(f) if int(row["gpu"]) > 0]


def load_requests(path: Path, model: MigModel, memory_mib: int) -> list[Request]:
    """The GPU pods of a pod list as MIG requests (CPU-only pods left out). Durations are capped
    at the trace's 90th percentile so that the churn replay reaches a steady state in a few
    cluster lifetimes (a handful of pods ran for months); pods without times get the median."""
    rows = []
    with path.open() as f:
        for row in csv.DictReader(f):
            num_gpu, milli = int(row["num_gpu"]), int(row["gpu_milli"])
            if num_gpu == 0:
                continue
            if num_gpu == 1 and milli < 1000:
                request = MigRequest(cores=max(milli // 10, 1))
            else:
                request = MigRequest(cores=100, cards=num_gpu)
            profile = request.profile_on(model, memory_mib)
            assert profile is not None  # every share of one card is covered by 7g at worst
            created, deleted = row.get("creation_time") or "", row.get("deletion_time") or ""
            seconds = int(deleted) - int(created) if created and deleted else -1
            rows.append((row["name"], request, profile.size * max(request.cards, 1), seconds))
    known = sorted(r[3] for r in rows if r[3] > 0) or [1]
    cap, median = known[int(0.90 * (len(known) - 1))], known[len(known) // 2]
    return [Request(n, r, s, min(d, cap) if d > 0 else median) for n, r, s, d in rows]


def inflate(requests: list[Request], capacity: int, *, seed: int, share: float = 1.0) -> list[Request]:
    """Sample with replacement until the requests' slices reach `share` x the cluster's slices."""
    rng = random.Random(seed)
    out: list[Request] = []
    total = 0
    while total < share * capacity:
        pick = requests[rng.randrange(len(requests))]
        out.append(pick)
        total += pick.slices
    return out


class Placer(Protocol):
    def allocate(self, key: str, item: Request) -> int:
        """Slices taken (0: it did not fit)."""

    def release(self, key: str) -> None:
        """Free what `key` holds."""


class Ours:
    """`MigAllocator` under one of its policies."""

    def __init__(self, policy: str, nodes: list[tuple[str, int]], model: MigModel, memory_mib: int,
                 workload: dict[MigRequest, float]) -> None:
        self.allocator = MigAllocator(policy=policy, workload=workload)  # type: ignore[arg-type]
        for node, count in nodes:
            for i in range(count):
                card = MigCard(uuid=f"{node}-gpu{i}", node=node, index=i, model=model, memory_mib=memory_mib)
                self.allocator.add_card(card)

    def allocate(self, key: str, item: Request) -> int:
        return item.slices if isinstance(self.allocator.allocate(key, item.request), MigPlacement) else 0

    def release(self, key: str) -> None:
        self.allocator.release(key)


def _carve(model: MigModel, layout: str) -> list[Profile]:
    by_shape = {(p.compute, p.size): p for p in model.profiles}
    return [by_shape[shape] for shape in LAYOUTS[layout]]


class Fixed:
    """Every card pre-carved (`layout`, or `mixed`); a request takes the smallest free
    pre-carved instance that covers it, the first in node and card order."""

    def __init__(self, layout: str, nodes: list[tuple[str, int]], model: MigModel, memory_mib: int) -> None:
        self.model, self.memory_mib, self.full = model, memory_mib, model.largest
        # Free instances per profile as heaps of (node, instance id); whole-card requests need
        # k free 7g on one node, counted per node.
        self.free: dict[Profile, list[tuple[int, int]]] = {p: [] for p in model.profiles}
        self.whole = [0] * len(nodes)
        for n, (_, count) in enumerate(nodes):
            for c in range(count):
                name = MIXED[c % len(MIXED)] if layout == "mixed" else layout
                for slot, profile in enumerate(_carve(model, name)):
                    self.free[profile].append((n, c * 8 + slot))
                    self.whole[n] += profile is self.full
        for heap in self.free.values():
            heapq.heapify(heap)
        self.held: dict[str, list[tuple[Profile, tuple[int, int]]]] = {}
        self.order = sorted(model.profiles, key=lambda p: (p.size, p.compute))

    def allocate(self, key: str, item: Request) -> int:
        request = item.request
        if request.cards > 0:
            node = next((n for n, free in enumerate(self.whole) if free >= request.cards), None)
            if node is None:
                return 0
            heap = self.free[self.full]
            mine = [w for w in heap if w[0] == node][: request.cards]
            for where in mine:
                heap.remove(where)
            heapq.heapify(heap)
            self.whole[node] -= request.cards
            self.held[key] = [(self.full, w) for w in mine]
            return item.slices
        need = request.profile_on(self.model, self.memory_mib)
        assert need is not None
        for profile in self.order:
            if profile.compute >= need.compute and profile.size >= need.size and self.free[profile]:
                where = heapq.heappop(self.free[profile])
                if profile is self.full:
                    self.whole[where[0]] -= 1
                self.held[key] = [(profile, where)]
                return profile.size  # a larger instance holds all its slices
        return 0

    def release(self, key: str) -> None:
        for profile, where in self.held.pop(key, []):
            heapq.heappush(self.free[profile], where)
            if profile is self.full:
                self.whole[where[0]] += 1


def make(policy: str, nodes: list[tuple[str, int]], model: MigModel, memory_mib: int,
         workload: dict[MigRequest, float]) -> Placer:
    """The placer a policy name stands for."""
    if policy.startswith("fixed "):
        return Fixed(policy.removeprefix("fixed "), nodes, model, memory_mib)
    return Ours(policy, nodes, model, memory_mib, workload)


def fill(placer: Placer, sequence: list[Request], accepted: Counter[tuple[str, int]] | None = None,
         model: MigModel | None = None, memory_mib: int = 0) -> tuple[int, int]:
    """No departures: (requests that fit, slices in use at the end). `accepted`, with `model`:
    counts the requests placed by (profile name, cards)."""
    placed = used = 0
    for i, item in enumerate(sequence):
        taken = placer.allocate(f"{item.name}#{i}", item)
        placed += taken > 0
        used += taken
        if taken and accepted is not None and model is not None:
            profile = item.request.profile_on(model, memory_mib)
            assert profile is not None
            accepted[profile.name, max(item.request.cards, 1)] += 1
    return placed, used


def decreasing(sequence: list[Request], model: MigModel, memory_mib: int) -> list[Request]:
    """The sequence largest first (memory slices, then compute slices), stable otherwise."""

    def size(item: Request) -> tuple[int, int]:
        profile = item.request.profile_on(model, memory_mib)
        assert profile is not None
        return item.slices, profile.compute * max(item.request.cards, 1)

    return sorted(sequence, key=size, reverse=True)


def configurations(model: MigModel) -> set[tuple[int, ...]]:
    """Every set of instances one card can hold at once (slot rules: allowed starts, no shared
    memory slice, compute within the card), as counts per profile of `model.profiles`."""
    found: set[tuple[int, ...]] = set()
    instances = [(i, p, s) for i, p in enumerate(model.profiles) for s in p.starts]

    def grow(first: int, slots: Slots, counts: tuple[int, ...]) -> None:
        found.add(counts)
        for n in range(first, len(instances)):
            i, profile, start = instances[n]
            if slot_rules.fits(model, slots, profile, start):
                grown = (*counts[:i], counts[i] + 1, *counts[i + 1:])
                grow(n + 1, slot_rules.taking(slots, profile, start), grown)

    grow(0, EMPTY, (0,) * len(model.profiles))
    return found


def _patterns(cards: int, sizes: list[int]) -> list[tuple[int, ...]]:
    """Every way one node of `cards` cards can host multi-card requests: counts per size of
    `sizes`, their cards summing to at most `cards` (the empty way included)."""
    found: list[tuple[int, ...]] = []

    def grow(i: int, left: int, counts: tuple[int, ...]) -> None:
        if i == len(sizes):
            found.append(counts)
            return
        for n in range(left // sizes[i] + 1):
            grow(i + 1, left - n * sizes[i], (*counts, n))

    grow(0, cards, ())
    return found


def upper_bound(sequence: list[Request], node_cards: list[int], model: MigModel, memory_mib: int, *,
                at_least: dict[tuple[str, int], int] | None = None) -> int:
    """The most requests of `sequence` any placement fits on empty nodes of `node_cards` cards of
    `model`: the optimum of an integer program every real placement is a solution of (see the
    module docstring). Variables:
    - x_c: cards in configuration c (a set of instances one card can hold; a whole-card request
      of one card counts as an instance of the largest profile);
    - w_(g,m): nodes of g cards hosting the multi-card requests of pattern m (counts per size);
    - y_p: requests of profile p placed; z_k: requests of k >= 2 cards placed.
    Maximise sum(y) + sum(z) subject to: sum(x) + cards the patterns take <= cards of the cluster;
    y_p <= sum_c count_c(p) x_c; z_k <= sum_(g,m) m_k w_(g,m); sum_m w_(g,m) = nodes of g cards;
    y_p <= requests of p, z_k <= requests of k cards. Relaxed: the order of arrival, and which
    node a single-card instance's card is on. `at_least` (profile name, cards) -> count: place at
    least that many of those requests (the bound of placements that accept what a policy accepted)."""
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp

    profiles = list(model.profiles)
    shares = Counter(r.request.profile_on(model, memory_mib) for r in sequence if r.request.cards <= 1)
    wholes = Counter(r.request.cards for r in sequence if r.request.cards > 1)
    configs = sorted(configurations(model))
    sizes = sorted(wholes)
    kinds = Counter(node_cards)
    patterns = [(g, m) for g in sorted(kinds) for m in _patterns(g, sizes)]
    nc, npf, nk, nw = len(configs), len(profiles), len(sizes), len(patterns)
    n = nc + npf + nk + nw
    rows: list[Any] = []
    low: list[float] = []
    high: list[float] = []

    def add(row: Any, lo: float, hi: float) -> None:
        rows.append(row)
        low.append(lo)
        high.append(hi)

    row = np.zeros(n)
    row[:nc] = 1
    row[nc + npf + nk:] = [sum(k * c for k, c in zip(sizes, m, strict=True)) for _g, m in patterns]
    add(row, -np.inf, sum(node_cards))
    for p in range(npf):  # y_p - sum_c count_c(p) x_c <= 0
        row = np.zeros(n)
        row[:nc] = [-c[p] for c in configs]
        row[nc + p] = 1
        add(row, -np.inf, 0)
    for k in range(nk):  # z_k - sum m_k w <= 0
        row = np.zeros(n)
        row[nc + npf + k] = 1
        row[nc + npf + nk:] = [-m[k] for _g, m in patterns]
        add(row, -np.inf, 0)
    for g, count in kinds.items():  # every node has one pattern
        row = np.zeros(n)
        row[nc + npf + nk:] = [1 if h == g else 0 for h, _m in patterns]
        add(row, count, count)
    upper = ([np.inf] * nc + [shares.get(p, 0) for p in profiles] + [wholes[k] for k in sizes]
             + [np.inf] * nw)
    lower = np.zeros(n)
    for (name, count), least in (at_least or {}).items():
        if count > 1:
            lower[nc + npf + sizes.index(count)] = least
        else:
            lower[nc + profiles.index(model.profile(name))] += least
    objective = np.concatenate([np.zeros(nc), -np.ones(npf + nk), np.zeros(nw)])
    result = milp(objective, constraints=LinearConstraint(np.array(rows), low, high),
                  integrality=np.ones(n), bounds=Bounds(lower, np.array(upper, dtype=float)))
    if not result.success:
        raise RuntimeError(f"the bound's integer program was not solved: {result.message}")
    return round(-result.fun)


def churn(placer: Placer, sequence: list[Request], capacity: int, *, seed: int) -> tuple[int, int]:
    """Departures at 100% offered load: requests arrive as a Poisson stream whose rate times the
    mean (slices x seconds) equals the cluster's slices, each holds its trace duration, and one
    that does not fit at arrival is lost. Returns (requests that fit, requests counted): the
    first half of the stream warms the cluster up and is not counted."""
    rng = random.Random(seed)
    rate = capacity / statistics.fmean(r.slices * r.seconds for r in sequence)
    now = 0.0
    leaving: list[tuple[float, str]] = []
    placed = counted = 0
    warm = len(sequence) // 2
    for i, item in enumerate(sequence):
        now += rng.expovariate(rate)
        while leaving and leaving[0][0] <= now:
            placer.release(heapq.heappop(leaving)[1])
        key = f"{item.name}#{i}"
        fits = placer.allocate(key, item) > 0
        if fits:
            heapq.heappush(leaving, (now + item.seconds, key))
        if i >= warm:
            counted += 1
            placed += fits
    return placed, counted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace-dir", default="../shared/traces/openb", help="relative to the repository root")
    parser.add_argument("--trace", default="default", help="pod list NAME of openb_pod_list_NAME.csv")
    parser.add_argument("--node-list", default="openb_node_list_gpu_node.csv")
    parser.add_argument("--model", default="A100-80GB", help="MIG model of every card (A100-80GB, H200-141GB, ...)")
    parser.add_argument("--policies", nargs="+", default=list(ROWS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--churn", type=float, default=4.0, help="arrivals of the churn run, x the cluster's slices")
    parser.add_argument("--max-nodes", type=int, default=None, help="use the first N nodes only (smoke)")
    args = parser.parse_args(argv)
    traces = (REPO / args.trace_dir).resolve()
    model = by_name(args.model)
    memory_mib = model.memory_gb * 1024
    nodes = load_nodes(traces / args.node_list)[: args.max_nodes]
    requests = load_requests(traces / f"openb_pod_list_{args.trace}.csv", model, memory_mib)
    capacity = sum(count for _, count in nodes) * model.memory_slices
    mix = Counter(r.request for r in requests)
    workload = {request: float(count * max(request.cards, 1)) for request, count in mix.items()}
    profiles = Counter(
        (r.request.profile_on(model, memory_mib).name, max(r.request.cards, 1)) for r in requests  # type: ignore[union-attr]
    )
    shares = ", ".join(f"{name} x{k}: {100 * n / len(requests):.1f}%" for (name, k), n in profiles.most_common())
    cards = sum(c for _, c in nodes)
    print(f"MIG trace from openb {args.trace}: {len(requests)} GPU pods on {cards} {model.name} cards;"
          f" profiles: {shares}")
    results: dict[str, list[tuple[float, float, float | None, float]]] = {p: [] for p in args.policies}
    for seed in range(args.seed, args.seed + args.seeds):
        sequence = inflate(requests, capacity, seed=seed)
        stream = inflate(requests, capacity, seed=seed, share=args.churn)
        for policy in args.policies:
            start = time.perf_counter()
            if policy == "upper bound":
                placed, used = upper_bound(sequence, [c for _, c in nodes], model, memory_mib), 0
                churned: float | None = None
            elif policy == "upper bound at ours' whole cards":
                accepted: Counter[tuple[str, int]] = Counter()
                fill(make("fragmentation", nodes, model, memory_mib, workload), sequence, accepted, model, memory_mib)
                whole = {key: n for key, n in accepted.items() if key[0] == model.largest.name}
                placed = upper_bound(sequence, [c for _, c in nodes], model, memory_mib, at_least=whole)
                used, churned = 0, None
            elif policy == "offline first-fit decreasing":
                placed, used = fill(make("first-fit", nodes, model, memory_mib, workload),
                                    decreasing(sequence, model, memory_mib))
                churned = None
            else:
                placed, used = fill(make(policy, nodes, model, memory_mib, workload), sequence)
                fitted, counted = churn(make(policy, nodes, model, memory_mib, workload), stream, capacity, seed=seed)
                churned = 100.0 * fitted / counted
            results[policy].append((100.0 * placed / len(sequence), 100.0 * used / capacity, churned,
                                    time.perf_counter() - start))
    print(f"\n{args.seeds} seed(s) from {args.seed}, mean. fill: no departures, at 100% arrivals (the"
          f" requests' slices reach the cluster's); churn: departures, 100% offered load, {args.churn:g}x the"
          " cluster's slices arriving in all (the first half warms up); the offline rows see the whole fill"
          " sequence, the upper bound is what no placement can beat:\n")
    print("| policy | fill: requests fit % | fill: slices in use % | churn: requests fit % | seconds |")
    print("|---|---|---|---|---|")
    for policy, rows in results.items():
        fit, used, secs = (statistics.fmean(r[k] for r in rows) for k in (0, 1, 3))
        churns = [r[2] for r in rows if r[2] is not None]
        used_text = "-" if policy.startswith("upper bound") else f"{used:.2f}"
        churn_text = f"{statistics.fmean(churns):.2f}" if churns else "-"
        print(f"| {policy} | {fit:.2f} | {used_text} | {churn_text} | {secs:.1f} |")
    if "upper bound" in results and len(results) > 1:
        print("\nper seed, fill: requests fit % (upper bound first):")
        for i in range(args.seeds):
            line = ", ".join(f"{policy} {results[policy][i][0]:.2f}" for policy in
                             sorted(results, key=lambda p: p != "upper bound"))
            print(f"  seed {args.seed + i}: {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
