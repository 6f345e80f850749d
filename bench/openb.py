"""Replay the Alibaba openb GPU trace (ATC'23 FGD paper) against the allocator's policies.

Method, as in the paper (Weng et al., USENIX ATC'23; data: ../shared/traces/openb/README.md):
the cluster of `openb_node_list_gpu_node.csv`; the pod list sampled with replacement until the
GPU requests reach 130% of the cluster's GPU capacity, shuffled per seed; each pod is tried
once and fails if it fits nowhere. For each policy it prints the GPU allocation ratio when
100% and 130% of capacity has arrived, the fragmentation ratio (fragmented / free GPU, against
the trace's own shape popularity) at 50% and 90% arrivals, decisions per second and the p99
decision time, averaged over the seeds; and it draws allocation against arrivals in a PNG.

    python bench/openb.py                           # default trace, all policies, 5 seeds
    python bench/openb.py --trace gpuspec33 --seeds 3
    python bench/openb.py --scale                   # also 10,000 synthetic nodes of 8 cards
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from elasticgpu.allocator import Allocator, CardRecord, Inventory, NodeRecord, Placement, PlacementRequest, Workload  # noqa: E402
from elasticgpu.allocator.fragmentation import FragmentationModel  # noqa: E402
from elasticgpu.allocator.shapes import node_sig  # noqa: E402
from elasticgpu.api.resources import GpuRequest  # noqa: E402

POLICIES = ("fragmentation", "bestfit", "packing", "random")
# The trace gives no card memory; requests are in proportion to cores, so any size works.
# These are the public sizes where known (G1-G3 are undisclosed).
CARD_MEMORY_MIB = {"T4": 15360, "P100": 16384, "V100M16": 16384, "V100M32": 32768, "A10": 24576}
DEFAULT_CARD_MEMORY_MIB = 32768
CHECKPOINTS = (50, 90, 100, 130)


@dataclass
class Pod:
    name: str
    gpu_milli: int
    """Total GPU request in milli-GPU (num_gpu * gpu_milli)."""
    request: PlacementRequest


@dataclass
class RunResult:
    policy: str
    seed: int
    alloc: dict[int, float] = field(default_factory=dict)
    frag: dict[int, float] = field(default_factory=dict)
    curve: list[tuple[float, float]] = field(default_factory=list)
    decisions: int = 0
    seconds: float = 0.0
    p99_us: float = 0.0
    failed: int = 0


def load_nodes(path: Path) -> list[tuple[NodeRecord, list[CardRecord]]]:
    """Nodes with GPUs of a node list CSV, as records."""
    out = []
    with path.open() as f:
        for row in csv.DictReader(f):
            count = int(row["gpu"])
            if count == 0:
                continue
            model = row["model"]
            node = NodeRecord(
                name=row["sn"],
                cpu_milli=int(row["cpu_milli"]),
                memory_mib=int(row["memory_mib"]),
                labels={"gpu-model": model},
            )
            memory = CARD_MEMORY_MIB.get(model, DEFAULT_CARD_MEMORY_MIB)
            cards = [
                CardRecord(
                    uuid=f"{row['sn']}-gpu{i}",
                    node=row["sn"],
                    index=i,
                    model=model,
                    memory_mib=memory,
                    numa=i * 2 // count,
                )
                for i in range(count)
            ]
            out.append((node, cards))
    return out


def load_pods(path: Path) -> list[Pod]:
    """Pods of a pod list CSV, as placement requests."""
    pods = []
    with path.open() as f:
        for row in csv.DictReader(f):
            num_gpu, milli = int(row["num_gpu"]), int(row["gpu_milli"])
            if num_gpu == 0:
                gpu = None
            elif num_gpu == 1 and milli < 1000:
                gpu = GpuRequest.share(milli // 10)
            else:
                gpu = GpuRequest.whole(num_gpu)
            spec = row.get("gpu_spec") or ""
            models = tuple(m for m in spec.split("|") if m)
            request = PlacementRequest(
                gpu=gpu, models=models, cpu_milli=int(row["cpu_milli"]), memory_mib=int(row["memory_mib"])
            )
            pods.append(Pod(row["name"], num_gpu * milli, request))
    return pods


def inflate(pods: list[Pod], capacity_milli: int, *, seed: int, tune: float = 1.3) -> list[Pod]:
    """Sample pods with replacement until their GPU requests reach `tune` x capacity."""
    rng = random.Random(seed)
    out: list[Pod] = []
    total = 0
    while total < tune * capacity_milli:
        pod = pods[rng.randrange(len(pods))]
        out.append(pod)
        total += pod.gpu_milli
    return out


def build(nodes: list[tuple[NodeRecord, list[CardRecord]]]) -> Inventory:
    inventory = Inventory()
    for node, cards in nodes:
        inventory.add_node(node)
        for card in cards:
            inventory.add_card(card)
    return inventory


def frag_ratio(inventory: Inventory, model: FragmentationModel) -> float:
    """Fragmented free GPU over all free GPU, in %."""
    frag = free = 0.0
    for node in inventory.nodes():
        sig = node_sig(node)
        frag += model.node(sig.cards, sig.cpu_free, sig.memory_free)
        free += sum(c.free_cores for c in sig.cards)
    return 100.0 * frag / free if free else 0.0


def replay(
    nodes: list[tuple[NodeRecord, list[CardRecord]]],
    pods: list[Pod],
    workload: Workload,
    *,
    policy: str,
    seed: int,
    max_pods: int | None = None,
    progress: object = None,
    task: object = None,
) -> RunResult:
    """Try each pod once, in order; measure allocation, fragmentation and decision time."""
    inventory = build(nodes)
    capacity = sum(len(cards) for _, cards in nodes) * 1000
    allocator = Allocator(inventory, policy=policy, workload=workload, seed=seed)
    measure = FragmentationModel(workload)
    result = RunResult(policy, seed)
    arrived = allocated = 0
    times: list[float] = []
    pending = list(CHECKPOINTS)
    step = max(len(pods) // 200, 1)
    clock = time.perf_counter
    for i, pod in enumerate(pods[:max_pods]):
        arrived += pod.gpu_milli
        start = clock()
        placed = allocator.allocate(f"{pod.name}#{i}", pod.request, explain=False)
        times.append(clock() - start)
        if isinstance(placed, Placement):
            allocated += pod.gpu_milli
        else:
            result.failed += 1
        share = 100.0 * arrived / capacity
        while pending and share >= pending[0]:
            point = pending.pop(0)
            result.alloc[point] = 100.0 * allocated / capacity
            if point in (50, 90):
                result.frag[point] = frag_ratio(inventory, measure)
        if i % step == 0:
            result.curve.append((share, 100.0 * allocated / capacity))
            if progress is not None:
                progress.update(task, advance=step)  # type: ignore[attr-defined]
    result.curve.append((100.0 * arrived / capacity, 100.0 * allocated / capacity))
    for point in pending:  # a short run (max_pods) never reaches them
        result.alloc[point] = float("nan")
    result.decisions = len(times)
    result.seconds = sum(times)
    result.p99_us = sorted(times)[int(0.99 * (len(times) - 1))] * 1e6 if times else 0.0
    return result


def summarise(results: list[RunResult]) -> list[dict[str, float | str]]:
    rows = []
    for policy in dict.fromkeys(r.policy for r in results):
        runs = [r for r in results if r.policy == policy]

        def mean(values: list[float]) -> float:
            return statistics.fmean(values) if values else float("nan")

        rows.append(
            {
                "policy": policy,
                "alloc@100": mean([r.alloc[100] for r in runs]),
                "alloc@130": mean([r.alloc[130] for r in runs]),
                "frag@50": mean([r.frag.get(50, float("nan")) for r in runs]),
                "frag@90": mean([r.frag.get(90, float("nan")) for r in runs]),
                "decisions/s": sum(r.decisions for r in runs) / sum(r.seconds for r in runs),
                "p99 us": mean([r.p99_us for r in runs]),
                "failed": mean([float(r.failed) for r in runs]),
            }
        )
    return rows


def print_table(title: str, rows: list[dict[str, float | str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in rows[0]:
        table.add_column(column, justify="left" if column == "policy" else "right")
    for row in rows:
        table.add_row(*(v if isinstance(v, str) else f"{v:,.2f}" for v in row.values()))
    Console(width=160).print(table)


def plot(results: list[RunResult], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4.5))
    grid = np.linspace(0, 130, 261)
    for policy in dict.fromkeys(r.policy for r in results):
        curves = [np.interp(grid, *zip(*r.curve, strict=True)) for r in results if r.policy == policy]
        ax.plot(grid, np.mean(curves, axis=0), label=policy)
    ax.plot(grid, np.minimum(grid, 100), color="grey", linestyle=":", label="ideal")
    ax.set_xlabel("arrived GPU workload (% of capacity)")
    ax.set_ylabel("GPU allocation ratio (%)")
    ax.set_title(title)
    ax.set_xlim(0, 130)
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def run_trace(args: argparse.Namespace) -> list[RunResult]:
    from rich.progress import Progress

    trace_dir = Path(args.trace_dir)
    if not trace_dir.is_absolute():
        trace_dir = (REPO / trace_dir).resolve()
    nodes = load_nodes(trace_dir / args.node_list)
    pods = load_pods(trace_dir / f"openb_pod_list_{args.trace}.csv")
    workload = Workload.from_requests(p.request for p in pods)
    capacity = sum(len(c) for _, c in nodes) * 1000
    results = []
    lists = {seed: inflate(pods, capacity, seed=seed) for seed in range(args.seed, args.seed + args.seeds)}
    total = sum(len(v[: args.max_pods]) for v in lists.values()) * len(args.policies)
    with Progress(transient=True) as progress:
        task = progress.add_task(f"openb {args.trace}", total=total)
        for policy in args.policies:
            for seed, inflated in lists.items():
                progress.update(task, description=f"{args.trace}: {policy} seed {seed}")
                results.append(
                    replay(
                        nodes,
                        inflated,
                        workload,
                        policy=policy,
                        seed=seed,
                        max_pods=args.max_pods,
                        progress=progress,
                        task=task,
                    )
                )
    print_table(
        f"openb {args.trace}: {len(nodes)} nodes, {capacity // 1000} GPUs, {args.seeds} seeds", summarise(results)
    )
    return results


def run_scale(args: argparse.Namespace) -> None:
    """10,000 synthetic nodes of 8 cards; decision rate of the default policy."""
    trace_dir = Path(args.trace_dir)
    if not trace_dir.is_absolute():
        trace_dir = (REPO / trace_dir).resolve()
    pods = load_pods(trace_dir / f"openb_pod_list_{args.trace}.csv")
    models = ("G2", "G3", "V100M32", "A10")
    nodes = []
    for n in range(args.scale_nodes):
        model = models[n % len(models)]
        name = f"synthetic-{n:05d}"
        node = NodeRecord(name=name, cpu_milli=128000, memory_mib=786432, labels={"gpu-model": model})
        memory = CARD_MEMORY_MIB.get(model, DEFAULT_CARD_MEMORY_MIB)
        cards = [
            CardRecord(uuid=f"{name}-gpu{i}", node=name, index=i, model=model, memory_mib=memory, numa=i // 4)
            for i in range(8)
        ]
        nodes.append((node, cards))
    workload = Workload.from_requests(p.request for p in pods)
    capacity = args.scale_nodes * 8 * 1000
    inflated = inflate(pods, capacity, seed=args.seed, tune=1.0)[: args.scale_pods]
    start = time.perf_counter()
    result = replay(nodes, inflated, workload, policy="fragmentation", seed=args.seed)
    wall = time.perf_counter() - start
    print_table(
        f"scale: {args.scale_nodes} nodes x 8 cards, {len(inflated)} pods ({wall:.0f} s with setup)",
        [
            {
                "policy": "fragmentation",
                "decisions/s": result.decisions / result.seconds,
                "p99 us": result.p99_us,
                "placed": float(result.decisions - result.failed),
            }
        ],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace-dir", default="../shared/traces/openb", help="relative to the repository root")
    parser.add_argument("--trace", default="default", help="pod list NAME of openb_pod_list_NAME.csv")
    parser.add_argument("--node-list", default="openb_node_list_gpu_node.csv")
    parser.add_argument("--policies", nargs="+", default=list(POLICIES))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=42, help="first seed (the paper uses 42-51)")
    parser.add_argument("--max-pods", type=int, default=None, help="stop each run after this many pods (smoke)")
    parser.add_argument("--out", default=str(REPO / "bench" / "out"))
    parser.add_argument("--no-trace", action="store_true", help="skip the trace replay")
    parser.add_argument("--scale", action="store_true", help="also run 10,000 synthetic nodes of 8 cards")
    parser.add_argument("--scale-nodes", type=int, default=10_000)
    parser.add_argument("--scale-pods", type=int, default=20_000, help="decisions measured in the scale run")
    args = parser.parse_args(argv)
    if not args.no_trace:
        results = run_trace(args)
        png = Path(args.out) / f"openb-{args.trace}.png"
        plot(results, png, f"openb {args.trace}: allocation vs arrivals (mean of {args.seeds} seeds)")
        print(f"plot: {png}")
    if args.scale:
        run_scale(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
