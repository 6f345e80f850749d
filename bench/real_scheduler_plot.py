"""Growth with the cluster (issue 49 item 1): bench/real_scheduler.py's runs at several node counts,
one or more invocations per count (ours and DRA apart where one did not fit), as one picture and one
table: pods/s, pods/s against plain's of the same invocation, and CPU ms per pod (API server,
scheduler, ours, all components) against nodes, one line per kind. Reads each invocation's
runs.json (profiled runs left out; the rounds averaged; a kind in two invocations of one node
count, plain, is their mean).

    python bench/real_scheduler_plot.py --png bench/real_scheduler_growth.png \\
        bench/out/rs-100/runs.json bench/out/rs-500/runs.json bench/out/rs-2000/runs.json bench/out/rs-5000/runs.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

KINDS = ("plain", "ours-whole", "ours-slice", "dra-one", "dra-shared", "claim-floor", "dra-ours", "dra-ours-shared")
CONTROL_PLANE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd")
OURS = ("controller", "webhook", "claim-floor")
PANELS = (
    ("pods scheduled/s", "pods_s"),
    ("pods/s / plain's (same invocation)", "vs_plain"),
    ("API server CPU ms/pod", "kube-apiserver"),
    ("scheduler CPU ms/pod", "kube-scheduler"),
    ("our controller CPU ms/pod", "controller"),
    ("all components CPU ms/pod", "all"),
)
"""(title, key) of each panel; CPU is net of idle, to the last pod scheduled (bench/real_scheduler.py)."""
Figures = dict[int, dict[str, dict[str, float]]]
"""nodes -> kind -> figure key -> mean over the rounds."""


def invocation(path: Path) -> tuple[int, dict[str, dict[str, float]]]:
    """One invocation's runs.json: its node count and kind -> figure key -> mean over its rounds, with
    pods/s against plain's of the same invocation."""
    runs = [r for r in json.loads(path.read_text()) if not r["label"].endswith("(profiled)")]
    out: dict[str, dict[str, float]] = {}
    nodes = runs[0]["nodes"] if runs else 0
    for kind in dict.fromkeys(r["kind"] for r in runs):
        rs = [r for r in runs if r["kind"] == kind]
        ready = all(kind == "plain" or r["ready_claims"] == r["pods"] for r in rs)

        def per_pod(r: dict[str, Any], components: tuple[str, ...]) -> float:
            return 1000 * sum(r["cpu_s"].get(c, 0.0) for c in components) / r["pods"]

        out[kind] = {
            "runs": len(rs),
            "pods": rs[0]["pods"],
            "pods_s": statistics.fmean(r["scheduled_per_s"] for r in rs),
            **{c: statistics.fmean(per_pod(r, (c,)) for r in rs) for c in (*CONTROL_PLANE, "controller")},
            "ours": statistics.fmean(per_pod(r, OURS) for r in rs),
            "apiserver_raw": statistics.fmean(1000 * r["cpu_raw_s"]["kube-apiserver"] / r["pods"] for r in rs),
            "scheduler_raw": statistics.fmean(1000 * r["cpu_raw_s"]["kube-scheduler"] / r["pods"] for r in rs),
            "all": statistics.fmean(per_pod(r, (*CONTROL_PLANE, *OURS)) for r in rs),
            "load": statistics.fmean(r["load"] for r in rs),
            "complete": float(all(r["complete"] for r in rs) and ready),
        }
    plain = out.get("plain", {}).get("pods_s")
    for kind_figures in out.values():
        kind_figures["vs_plain"] = kind_figures["pods_s"] / plain if plain else float("nan")
    return nodes, out


def figures(paths: list[Path]) -> Figures:
    """Every invocation's figures by node count. Where several invocations ran at one node count (ours
    and DRA apart, each with its own plain), a kind in more than one of them (plain) is their mean,
    its runs summed; `/ plain` is always against the plain of the kind's own invocation."""
    merged: dict[int, dict[str, list[dict[str, float]]]] = {}
    for path in paths:
        nodes, kinds = invocation(path)
        for kind, kind_figures in kinds.items():
            merged.setdefault(nodes, {}).setdefault(kind, []).append(kind_figures)
    out: Figures = {}
    for nodes, kinds in merged.items():
        for kind, several in kinds.items():
            mean = {key: statistics.fmean(f[key] for f in several) for key in several[0]}
            mean["runs"] = sum(f["runs"] for f in several)
            mean["complete"] = float(all(f["complete"] for f in several))
            out.setdefault(nodes, {})[kind] = mean
    return out


def earlier(path: Path, data: Figures) -> set[tuple[int, str]]:
    """Add figures of invocations whose runs.json are not in the tree, as bench/README.md's tables give
    them (a JSON list of rows: nodes, kind, source, and the keys it has), where no runs.json gave that
    node count and kind; returns the (nodes, kind) added, drawn hollow."""
    added: set[tuple[int, str]] = set()
    for row in json.loads(path.read_text()):
        nodes, kind = int(row["nodes"]), str(row["kind"])
        if kind in data.get(nodes, {}):
            continue
        data.setdefault(nodes, {})[kind] = {k: float(v) for k, v in row.items() if isinstance(v, (int, float))}
        added.add((nodes, kind))
    return added


def table(data: Figures) -> str:
    lines = ["| nodes | kind | runs x pods | pods/s | / plain | API server | controller manager | scheduler | "
             "our controller | ours in all | etcd | all components | API server, scheduler raw | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for nodes in sorted(data):
        for kind in (k for k in KINDS if k in data[nodes]):
            missing = ("runs", "pods", "kube-controller-manager", "etcd", "ours", "apiserver_raw", "scheduler_raw")
            f = {key: float("nan") for key in missing} | {"complete": 1.0} | data[nodes][kind]
            flag = "" if f["complete"] else " (incomplete)"
            lines.append(f"| {nodes} | {kind} | {f['runs']:.0f} x {f['pods']:.0f} | {f['pods_s']:.1f}{flag} | "
                         f"{f['vs_plain']:.2f} | {f['kube-apiserver']:.1f} | {f['kube-controller-manager']:.1f} | "
                         f"{f['kube-scheduler']:.1f} | {f['controller']:.1f} | {f['ours']:.1f} | {f['etcd']:.1f} | "
                         f"{f['all']:.1f} | {f['apiserver_raw']:.1f}, {f['scheduler_raw']:.1f} | "
                         f"{f['load']:.1f} |")  # fmt: skip
    return "\n".join(lines)


def plot(data: Figures, png: Path, hollow: set[tuple[int, str]] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    sizes = sorted(data)
    for ax, (title, key) in zip(axes.flat, PANELS, strict=True):
        for kind in KINDS:
            points = [(n, data[n][kind].get(key, float("nan"))) for n in sizes if kind in data[n]]
            if not points or (kind == "plain" and key in ("controller", "vs_plain")):
                continue
            style = "--" if kind.startswith("dra-") else ":" if kind in ("plain", "claim-floor") else "-"
            color = f"C{KINDS.index(kind)}"
            ax.plot([p[0] for p in points], [p[1] for p in points], style, label=kind, color=color)
            for n, value in points:
                filled = (n, kind) not in (hollow or set())
                ax.plot([n], [value], "o", color=color, markerfacecolor=color if filled else "white")
        ax.set_xscale("log")
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.set_xlabel("nodes (8 cards each)")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    axes.flat[0].legend()
    caption = ("bench/real_scheduler.py: real kube-scheduler v1.36.3, ours against DRA, by cluster size; shared 2-core "
               "machine, CPU net of idle\none or two invocations per size (ours and DRA apart, each with its own "
               "plain; plain drawn is their mean; / plain against its own invocation's)")  # fmt: skip
    if hollow:
        caption += "\nhollow points: earlier sessions' figures from bench/README.md's tables (runs.json not kept)"
    fig.suptitle(caption)
    fig.tight_layout()
    fig.savefig(png, dpi=80)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="runs.json of each invocation")
    parser.add_argument("--png", type=Path, help="write the picture here")
    parser.add_argument("--earlier", type=Path,
                        help="figures from bench/README.md for sizes and kinds no runs.json gives (drawn hollow)")
    args = parser.parse_args()
    data = figures(args.runs)
    hollow = earlier(args.earlier, data) if args.earlier else set()
    print(table(data))
    if args.png:
        plot(data, args.png, hollow)
        print(f"\npicture: {args.png}")


if __name__ == "__main__":
    main()
