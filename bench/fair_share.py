"""Fair share under contention: Jain's fairness index of cores held per namespace, FIFO vs FairShare.

A saturating stream of claims from ten namespaces goes through the pure allocator and the bind
order (`elasticgpu.controller.decisions.bind_order`), as the controller runs them when capacity
frees: each tick some claims arrive, some bound claims finish, then one bind pass tries every
waiting claim in the class's `bindOrder`. Namespaces submit at very different rates (namespace i
keeps 2*(i+1) claims waiting, topping up each tick: every namespace always wants more than an equal
share, the heavier ones queue more), so FIFO hands the cluster out by queue length; FairShare by
what each namespace already holds. The n-th claim of a namespace has the same size and lifetime
under both orders (same seed).

Claim sizes are the GPU requests of the Alibaba openb trace (cluster-trace-gpu-v2023, Weng et
al., "Beware of Fragmentation", USENIX ATC'23; `../shared/traces/openb/`, research use, cite the
paper): `num_gpu` x `gpu_milli` as a share of one card or whole cards. Without the trace a fixed
mix is used. Printed, per order: Jain's index of cores held per namespace (1 = equal; 1/10 = one
namespace holds all), averaged over the ticks after warm-up and at the end; cores held per
namespace at the end; cluster utilisation; binds.

    python bench/fair_share.py                       # 16 nodes x 8 cards, 400 ticks, seed 42
    python bench/fair_share.py --ticks 100 --nodes 4 # smoke run
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from elasticgpu.allocator import (  # noqa: E402
    Allocator,
    CardRecord,
    Inventory,
    NodeRecord,
    Placement,
    PlacementRequest,
)
from elasticgpu.api.gpu_class import BindOrder  # noqa: E402
from elasticgpu.api.resources import GpuRequest  # noqa: E402
from elasticgpu.controller.decisions import bind_order  # noqa: E402

NAMESPACES = [f"team-{i}" for i in range(10)]
CARDS_PER_NODE = 8
FALLBACK_SIZES = [(0, 25), (0, 50), (0, 81), (0, 47), (1, 100), (2, 200)]
"""(whole cards, cores) used when the trace is missing."""


def trace_sizes(trace_dir: Path, *, max_cards: int) -> list[tuple[int, int]]:
    """(whole cards, cores) of each GPU pod of the default openb pod list; [] when it is missing."""
    path = trace_dir / "openb_pod_list_default.csv"
    if not path.exists():
        return []
    sizes = []
    with path.open() as rows:
        for row in csv.DictReader(rows):
            count, milli = int(row["num_gpu"]), int(row["gpu_milli"])
            if count == 0 or count > max_cards:
                continue
            if count == 1 and milli < 1000:
                sizes.append((0, max(1, milli // 10)))  # a share: percent of one card
            else:
                sizes.append((count, 100 * count))
    return sizes


def jain(values: list[float]) -> float:
    """Jain's fairness index: (sum x)^2 / (n * sum x^2); 1 when all are equal."""
    total = sum(values)
    squares = sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares else 1.0


@dataclass
class Run:
    """One order's run over the stream."""

    order: BindOrder
    nodes: int
    alloc: Allocator = field(init=False)
    waiting: list[bind_order.Waiting] = field(default_factory=list)
    requests: dict[str, PlacementRequest] = field(default_factory=dict)
    ends: dict[str, int] = field(default_factory=dict)
    held: dict[str, tuple[str, int]] = field(default_factory=dict)
    use: dict[str, float] = field(default_factory=lambda: dict.fromkeys(NAMESPACES, 0.0))
    binds: int = 0
    jains: list[float] = field(default_factory=list)
    utilisation: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        inventory = Inventory()
        for n in range(self.nodes):
            inventory.add_node(NodeRecord(name=f"node-{n}", cpu_milli=0, memory_mib=0))
            for i in range(CARDS_PER_NODE):
                inventory.add_card(CardRecord(uuid=f"GPU-{n}-{i}", node=f"node-{n}", index=i, model="G2",
                                              memory_mib=32768, numa=i // 4, links=frozenset()))
        self.alloc = Allocator(inventory, policy="fragmentation", seed=0)

    def arrive(self, claim: bind_order.Waiting, size: tuple[int, int], lifetime: int) -> None:
        gpu = GpuRequest.whole(size[0]) if size[0] else GpuRequest.share(size[1])
        self.requests[claim.name] = PlacementRequest(gpu=gpu)
        self.ends[claim.name] = lifetime
        self.waiting.append(claim)

    def try_bind(self, claim: bind_order.Waiting) -> bool:
        result = self.alloc.place(self.requests[claim.name], explain=False)
        if not isinstance(result, Placement):
            return False
        self.alloc.reserve(claim.name, result)
        self.held[claim.name] = (claim.namespace, claim.cores)
        self.use[claim.namespace] += claim.cores
        self.binds += 1
        return True

    def tick(self, now: int, *, warm: bool) -> None:
        for name in [n for n in self.held if self.ends[n] <= now]:
            namespace, cores = self.held.pop(name)
            self.alloc.release(name)
            self.use[namespace] -= cores
        bound = bind_order.bind_pass(self.waiting, try_bind=self.try_bind, use={"": self.use})
        done = {c.name for c in bound}
        self.waiting = [c for c in self.waiting if c.name not in done]
        for claim in bound:
            self.ends[claim.name] += now  # the lifetime starts at the bind
        if warm:
            self.jains.append(jain([self.use[ns] for ns in NAMESPACES]))
            self.utilisation.append(sum(self.use.values()) / (100 * CARDS_PER_NODE * self.nodes))


def main(argv: list[str] | None = None) -> int:
    """Run both orders over the stream and print the table; 0."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--ticks", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=50, help="ticks before fairness is sampled")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--lifetime", type=int, default=30, help="mean ticks a bound claim runs")
    parser.add_argument("--backlog", type=int, default=2, help="team-i keeps backlog*(i+1) claims waiting")
    parser.add_argument("--trace-dir", type=Path, default=REPO.parent / "shared" / "traces" / "openb")
    args = parser.parse_args(argv)

    sizes = trace_sizes(args.trace_dir, max_cards=CARDS_PER_NODE) or FALLBACK_SIZES
    source = "openb default trace" if len(sizes) > len(FALLBACK_SIZES) else "fixed mix (trace not found)"
    print(f"fair share: {args.nodes} nodes x {CARDS_PER_NODE} cards, {args.ticks} ticks, sizes from {source}"
          f" ({len(sizes)} pods), team-i keeps {args.backlog}*(i+1) claims waiting, mean lifetime {args.lifetime}"
          f" ticks, seed {args.seed}")
    print(f"{'order':<10} {'jain(mean)':>10} {'jain(end)':>10} {'util%':>6} {'binds':>6}  cores held per namespace"
          " at the end (team-0..team-9)")
    for order in ("FIFO", "FairShare"):
        run = Run(order, args.nodes)
        # The n-th claim of a namespace has the same size and lifetime under both orders.
        draws = {ns: random.Random(f"{args.seed}-{ns}") for ns in NAMESPACES}
        counts = dict.fromkeys(NAMESPACES, 0)
        serial = 0
        for now in range(args.ticks):
            waiting: dict[str, int] = {}
            for claim in run.waiting:
                waiting[claim.namespace] = waiting.get(claim.namespace, 0) + 1
            for i, namespace in enumerate(NAMESPACES):
                # Saturating: every namespace always wants more than its equal share; the heavier
                # ones queue more claims, so they are ahead in a FIFO queue more often.
                for _ in range(args.backlog * (i + 1) - waiting.get(namespace, 0)):
                    serial += 1
                    counts[namespace] += 1
                    rng = draws[namespace]
                    size = rng.choice(sizes)
                    lifetime = max(1, round(rng.expovariate(1 / args.lifetime)))
                    claim = bind_order.Waiting(namespace=namespace, name=f"{namespace}-{counts[namespace]}",
                                               created=f"{now:08d}", arrival=serial, cores=size[1], order=order)
                    run.arrive(claim, size, lifetime)
            run.tick(now, warm=now >= args.warmup)
        end = [int(run.use[ns]) for ns in NAMESPACES]
        print(f"{order:<10} {statistics.fmean(run.jains):>10.3f} {run.jains[-1]:>10.3f}"
              f" {100 * statistics.fmean(run.utilisation):>6.1f} {run.binds:>6}  {end}")
        for namespace in NAMESPACES:
            if run.use[namespace] == 0:
                sizes_waiting = sorted(c.cores for c in run.waiting if c.namespace == namespace)
                print(f"{'':<10} {namespace} holds nothing at the end; its waiting claims: {sizes_waiting} cores")
    return 0

if __name__ == "__main__":
    sys.exit(main())
