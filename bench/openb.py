"""Replay the Alibaba openb GPU trace (ATC'23 FGD paper) against the allocator's policies.

Method, as in the paper (Weng et al., USENIX ATC'23; data: ../shared/traces/openb/README.md):
the cluster of `openb_node_list_gpu_node.csv`; the pod list sampled with replacement until the
GPU requests reach 130% of the cluster's GPU capacity, shuffled per seed; each pod is tried
once and fails if it fits nowhere. For each policy it prints the GPU allocation ratio when
100% and 130% of capacity has arrived, the fragmentation ratio (fragmented / free GPU, against
the paper's definition: free GPU the typical tasks cannot use, over free GPU) at 50% and 90%
arrivals, decisions per second (wall clock and per CPU-second) and the p99 decision time,
averaged over the seeds; and it draws allocation against arrivals in a PNG.

    python bench/openb.py                           # default trace, all policies, 5 seeds
    python bench/openb.py --trace gpuspec33 --seeds 3
    python bench/openb.py --no-trace --scale        # 10,000 synthetic nodes of 8 cards, full stream
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

from elasticgpu.allocator import (  # noqa: E402
    Allocator,
    CardRecord,
    Inventory,
    NodeRecord,
    Placement,
    PlacementRequest,
    Policy,
    Workload,
)
from elasticgpu.allocator.policies import Fragmentation  # noqa: E402
from elasticgpu.allocator.shapes import model_matches  # noqa: E402
from elasticgpu.api.resources import GpuRequest  # noqa: E402

# `fgd-paper` is the paper's FGD as its authors' simulator runs it (typical pods covering 95%
# of the pods, scores floor(100 * sigmoid), ties in a fixed node order); the others are the
# allocator's policies of those names.
POLICIES = ("fragmentation", "fgd-paper", "bestfit", "packing", "random")
PAPER_COVERAGE = 0.95
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
    typical: tuple[int, int, int, str] = (0, 0, 0, "")
    """The paper's task type: (cpu_milli, gpu_milli per GPU, num_gpu, gpu_spec)."""


def make_policy(policy: str, pods: list[Pod]) -> str | Policy:
    """The policy of a table row. `fgd-paper` is our FGD with the paper's typical pods (the
    shapes covering 95% of the pods) instead of all of the trace's shapes."""
    if policy == "fgd-paper":
        return Fragmentation(Workload.from_requests((p.request for p in pods), coverage=PAPER_COVERAGE))
    return policy


class PaperFragmentation:
    """The paper's fragmentation ratio (Weng et al., ATC'23, and its simulator): free GPU that
    the typical tasks cannot use, weighted by their popularity, over all free GPU. Typical
    tasks are the most frequent (CPU, GPU per card, cards, model) types covering 95% of the
    pods, CPU-only pods included (all free GPU counts as fragmented for them, as in the
    simulator). A task the node cannot host (GPU, CPU or model) sees all its free GPU as
    fragmented, one it can host the free GPU of the cards too small for it. Main memory is
    not part of this measure."""

    def __init__(self, pods: list[Pod]) -> None:
        counts: dict[tuple[int, int, int, str], int] = {}
        for pod in pods:
            counts[pod.typical] = counts.get(pod.typical, 0) + 1
        total = sum(counts.values())
        chosen: list[tuple[tuple[int, int, int, str], int]] = []
        covered = 0
        for kind, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
            if covered >= PAPER_COVERAGE * total:
                break
            chosen.append((kind, count))
            covered += count
        self.typical = [(kind, count / covered) for kind, count in chosen]

    def ratio(self, inventory: Inventory) -> float:
        """Fragmented free GPU over free GPU, in %."""
        import numpy as np

        nodes = list(inventory.nodes())
        width = max(len(n.cards) for n in nodes)
        free = np.zeros((len(nodes), width))
        cpu = np.zeros(len(nodes))
        models = []
        for i, node in enumerate(nodes):
            for j, card in enumerate(node.cards):
                if not card.whole:
                    free[i, j] = card.free_cores * 10  # milli-GPU
            cpu[i] = node.cpu_free
            models.append(node.cards[0].record.model if node.cards else "")
        total = free.sum(axis=1)
        frag = np.zeros(len(nodes))
        for (cpu_need, milli, count, spec), weight in self.typical:
            if milli == 0:
                frag += weight * total
                continue
            access = np.array([not spec or model_matches(m, (spec,)) for m in models])
            hosts = ((free >= milli).sum(axis=1) >= count) & (cpu >= cpu_need) & access
            small = (free * (free < milli)).sum(axis=1)
            frag += weight * np.where(hosts, small, total)
        return 100.0 * frag.sum() / total.sum() if total.sum() else 0.0


@dataclass
class RunResult:
    policy: str
    seed: int
    alloc: dict[int, float] = field(default_factory=dict)
    frag: dict[int, float] = field(default_factory=dict)
    curve: list[tuple[float, float]] = field(default_factory=list)
    decisions: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    """Process CPU time of the decisions (what other processes on the core do not inflate)."""
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
            pods.append(Pod(row["name"], num_gpu * milli, request, (int(row["cpu_milli"]), milli, num_gpu, spec)))
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


def replay(
    nodes: list[tuple[NodeRecord, list[CardRecord]]],
    pods: list[Pod],
    workload: Workload,
    *,
    policy: str | Policy,
    seed: int,
    measure: PaperFragmentation | None = None,
    max_pods: int | None = None,
    progress: object = None,
    task: object = None,
    label: str = "",
) -> RunResult:
    """Try each pod once, in order; measure allocation, fragmentation and decision time."""
    inventory = build(nodes)
    capacity = sum(len(cards) for _, cards in nodes) * 1000
    allocator = Allocator(inventory, policy=policy, workload=workload, seed=seed)
    result = RunResult(label or str(policy), seed)
    arrived = allocated = 0
    times: list[float] = []
    pending = list(CHECKPOINTS)
    step = max(len(pods) // 200, 1)
    clock = time.perf_counter
    cpu_clock = time.process_time
    cpu_seconds = 0.0
    for i, pod in enumerate(pods[:max_pods]):
        arrived += pod.gpu_milli
        cpu_start = cpu_clock()
        start = clock()
        placed = allocator.allocate(f"{pod.name}#{i}", pod.request, explain=False)
        times.append(clock() - start)
        cpu_seconds += cpu_clock() - cpu_start
        if isinstance(placed, Placement):
            allocated += pod.gpu_milli
        else:
            result.failed += 1
        share = 100.0 * arrived / capacity
        while pending and share >= pending[0]:
            point = pending.pop(0)
            result.alloc[point] = 100.0 * allocated / capacity
            if point in (50, 90) and measure is not None:
                result.frag[point] = measure.ratio(inventory)
        if i % step == 0:
            result.curve.append((share, 100.0 * allocated / capacity))
            if progress is not None:
                progress.update(task, advance=step)  # type: ignore[attr-defined]
    result.curve.append((100.0 * arrived / capacity, 100.0 * allocated / capacity))
    for point in pending:  # a short run (max_pods) never reaches them
        result.alloc[point] = float("nan")
    result.decisions = len(times)
    result.seconds = sum(times)
    result.cpu_seconds = cpu_seconds
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
                "dec/CPU-s": sum(r.decisions for r in runs) / max(sum(r.cpu_seconds for r in runs), 1e-9),
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


TRACE_SOURCE = "https://github.com/alibaba/clusterdata"
"""Where the openb trace is published (the ATC'23 FGD paper's data)."""


def trace_dir(args: argparse.Namespace) -> Path:
    path = Path(args.trace_dir)
    return path if path.is_absolute() else (REPO / path).resolve()


def run_trace(args: argparse.Namespace) -> list[RunResult]:
    from rich.progress import Progress

    nodes = load_nodes(trace_dir(args) / args.node_list)
    pods = load_pods(trace_dir(args) / f"openb_pod_list_{args.trace}.csv")
    workload = Workload.from_requests(p.request for p in pods)
    measure = PaperFragmentation(pods)
    capacity = sum(len(c) for _, c in nodes) * 1000
    results = []
    lists = {seed: inflate(pods, capacity, seed=seed) for seed in range(args.seed, args.seed + args.seeds)}
    total = sum(len(v[: args.max_pods]) for v in lists.values()) * len(args.policies)
    with Progress() as progress:
        task = progress.add_task(f"openb {args.trace}", total=total)
        for policy in args.policies:
            for seed, inflated in lists.items():
                progress.update(task, description=f"{args.trace}: {policy} seed {seed}")
                results.append(
                    replay(
                        nodes,
                        inflated,
                        workload,
                        policy=make_policy(policy, pods),
                        seed=seed,
                        measure=measure,
                        max_pods=args.max_pods,
                        progress=progress,
                        task=task,
                        label=policy,
                    )
                )
    print_table(
        f"openb {args.trace}: {len(nodes)} nodes, {capacity // 1000} GPUs, {args.seeds} seeds "
        f"(alloc: % of GPU capacity allocated when 100% / 130% of it has arrived; frag: the paper's "
        f"fragmentation ratio at 50% / 90% arrivals)",
        summarise(results),
    )
    return results


def run_scale(args: argparse.Namespace) -> None:
    """10,000 synthetic nodes of 8 cards, a full pod stream up to 100% of their GPU capacity
    (or `--scale-pods` pods); decision rate of the default policy."""
    from rich.progress import Progress

    pods = load_pods(trace_dir(args) / f"openb_pod_list_{args.trace}.csv")
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
    with Progress() as progress:
        task = progress.add_task("scale", total=len(inflated))
        result = replay(nodes, inflated, workload, policy="fragmentation", seed=args.seed, progress=progress, task=task)
    wall = time.perf_counter() - start
    arrived = sum(p.gpu_milli for p in inflated)
    print_table(
        f"scale: {args.scale_nodes:,} nodes x 8 cards ({capacity // 1000:,} GPUs), {len(inflated):,} pods "
        f"= {100.0 * arrived / capacity:.1f}% of GPU capacity arrived, every one decided and measured "
        f"({wall:.0f} s with setup)",
        [
            {
                "policy": "fragmentation",
                "decisions": float(result.decisions),
                "placed": float(result.decisions - result.failed),
                "alloc %": result.curve[-1][1],
                "decisions/s": result.decisions / result.seconds,
                "dec/CPU-s": result.decisions / max(result.cpu_seconds, 1e-9),
                "p99 us": result.p99_us,
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
    parser.add_argument(
        "--scale-pods", type=int, default=None, help="stop the scale run after this many pods (default: all, to 100%%)"
    )
    args = parser.parse_args(argv)
    missing = [p for p in (trace_dir(args) / args.node_list, trace_dir(args) / f"openb_pod_list_{args.trace}.csv")
               if not p.is_file()] if not args.no_trace or args.scale else []
    if missing:
        # The trace is data, not code: say where it comes from and how to point at it, in one line.
        print(f"bench/openb.py: no trace file {missing[0]}: the openb trace is cluster-trace-gpu-v2023/csv of"
              f" {TRACE_SOURCE}; put its CSVs in a folder and pass --trace-dir FOLDER (now {args.trace_dir},"
              " relative to the repository root); --no-trace without --scale runs nothing of it", file=sys.stderr)
        return 2
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
