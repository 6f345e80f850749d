"""The share of 8-card claims placed within one NVLink domain: topology-aware vs topology-blind.

Issue 27 item 4. A derived trace: the whole-card GPU requests of an openb pod list (by default
`multigpu50`: 1, 2, 4 and 8 whole cards; the shares are left out, they take no NVLink) sampled
with replacement, on a cluster of 8-card nodes of two kinds: half "HGX" (one NVSwitch, all 8
cards linked) and half "PCIe" (two NVLink islands of 4, one per NUMA node). Each admitted
claim leaves after a random number of later arrivals (uniform, mean set for `--load` of the
cards), so free cards fragment as in a running cluster. Every variant replays the same stream
(same seed) in one run:

- blind: the allocator is shown no NVLink (what a topology-blind scheduler does: the policy's
  node, the lowest free indices);
- ours: topology Any (the default): fully NVLinked sets preferred, nodes and cards;
- required: the multi-card claims' class says topology: NVLink (they wait rather than break it).

For each it prints, per claim size, the claims placed, those placed within one NVLink domain
(every card linked to every other), and the share; and the claims not placed.

    python bench/topology.py                    # 64 nodes, 20,000 arrivals, 3 seeds
    python bench/topology.py --nodes 16 --arrivals 2000 --seeds 1     # smoke run (the tests)
"""

from __future__ import annotations

import argparse
import csv
import itertools
import random
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from elasticgpu.allocator import Allocator, CardRecord, Inventory, NodeRecord, Placement, PlacementRequest  # noqa: E402
from elasticgpu.allocator.policies import DEFAULT_POLICY  # noqa: E402
from elasticgpu.api.resources import GpuRequest  # noqa: E402

VARIANTS = ("blind", "ours", "required")
CARDS_PER_NODE = 8


@dataclass
class Stats:
    """Counts of one variant over the seeds."""

    placed: Counter[int] = field(default_factory=Counter)
    linked: Counter[int] = field(default_factory=Counter)
    failed: Counter[int] = field(default_factory=Counter)


def load_sizes(path: Path) -> list[int]:
    """The whole-card requests of an openb pod list (num_gpu >= 1, a whole GPU each)."""
    with path.open() as f:
        return [int(r["num_gpu"]) for r in csv.DictReader(f) if int(r["num_gpu"]) >= 1 and int(r["gpu_milli"]) == 1000]


def cluster(nodes: int) -> list[CardRecord]:
    """`nodes` 8-card nodes: even ones HGX (all linked), odd ones two islands of 4 (NUMA 0, 1)."""
    cards = []
    for n in range(nodes):
        name = f"node-{n}"
        island = CARDS_PER_NODE if n % 2 == 0 else CARDS_PER_NODE // 2
        for i in range(CARDS_PER_NODE):
            peers = frozenset(
                f"{name}-gpu{j}" for j in range(CARDS_PER_NODE) if j != i and j // island == i // island
            )
            cards.append(CardRecord(uuid=f"{name}-gpu{i}", node=name, index=i, model="H100", memory_mib=81920,
                                    numa=i * 2 // CARDS_PER_NODE, links=peers))
    return cards


def inventory(cards: list[CardRecord], *, blind: bool) -> Inventory:
    """The allocator's inventory; `blind` hides the NVLinks."""
    inv = Inventory()
    for name in sorted({c.node for c in cards}):
        inv.add_node(NodeRecord(name=name))
    for card in cards:
        inv.add_card(CardRecord(uuid=card.uuid, node=card.node, index=card.index, model=card.model,
                                memory_mib=card.memory_mib, numa=card.numa,
                                links=frozenset() if blind else card.links))
    return inv


def one_domain(uuids: tuple[str, ...], links: dict[str, frozenset[str]]) -> bool:
    """Every card linked to every other (judged on the real links, whatever the allocator saw)."""
    return all(b in links[a] for a, b in itertools.combinations(uuids, 2))


def replay(variant: str, cards: list[CardRecord], sizes: list[int], args: argparse.Namespace, seed: int,
           stats: Stats) -> None:
    """One seed of one variant: arrivals in order, each tried once; departures by lifetime."""
    rng = random.Random(seed)
    stream = [rng.choice(sizes) for _ in range(args.arrivals)]
    mean_size = sum(sizes) / len(sizes)
    # Little's law: mean lifetime (in arrivals) that keeps `load` of the cards requested.
    mean_life = args.load * len(cards) / mean_size
    lives = [rng.randint(1, max(1, int(2 * mean_life))) for _ in stream]
    links = {c.uuid: c.links for c in cards}
    allocator = Allocator(inventory(cards, blind=variant == "blind"), policy=args.policy, seed=seed)
    leaving: dict[int, list[str]] = {}
    for t, (size, life) in enumerate(zip(stream, lives, strict=True)):
        for key in leaving.pop(t, []):
            allocator.release(key)
        topology = "NVLink" if variant == "required" and size > 1 else "Any"
        key = f"c{t}"
        result = allocator.allocate(key, PlacementRequest(gpu=GpuRequest.whole(size), topology=topology),
                                    explain=False)
        if not isinstance(result, Placement):
            stats.failed[size] += 1
            continue
        stats.placed[size] += 1
        stats.linked[size] += one_domain(result.uuids, links)
        leaving.setdefault(t + life, []).append(key)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace-dir", default="../shared/traces/openb", help="relative to the repository root")
    parser.add_argument("--trace", default="multigpu50", help="pod list NAME of openb_pod_list_NAME.csv")
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--arrivals", type=int, default=20_000)
    parser.add_argument("--load", type=float, default=0.9, help="share of the cards requested in steady state")
    parser.add_argument("--policy", default=DEFAULT_POLICY)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    sizes = load_sizes((REPO / args.trace_dir / f"openb_pod_list_{args.trace}.csv").resolve())
    cards = cluster(args.nodes)
    print(f"trace {args.trace}: {len(sizes)} whole-card requests {dict(sorted(Counter(sizes).items()))};"
          f" {args.nodes} nodes x {CARDS_PER_NODE} cards (half one NVLink domain of 8, half two of 4);"
          f" {args.arrivals} arrivals, load {args.load}, policy {args.policy}, {args.seeds} seed(s)")
    results = {v: Stats() for v in VARIANTS}
    for variant in VARIANTS:
        for seed in range(args.seed, args.seed + args.seeds):
            replay(variant, cards, sizes, args, seed, results[variant])
    print(f"{'variant':<10}{'cards':>6}{'placed':>9}{'in one domain':>15}{'share':>8}{'not placed':>12}")
    for variant in VARIANTS:
        stats = results[variant]
        for size in sorted(set(sizes)):
            placed = stats.placed[size]
            share = f"{100 * stats.linked[size] / placed:.1f}%" if placed else "-"
            print(f"{variant:<10}{size:>6}{placed:>9}{stats.linked[size]:>15}{share:>8}{stats.failed[size]:>12}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
