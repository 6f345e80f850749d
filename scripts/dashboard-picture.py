"""Render the dashboard's main panels from a real scrape of the demo (issue 38 item 5).

    .venv/bin/python scripts/dashboard-picture.py [--out docs/img/dashboard.png] [--seconds 40]

Runs the demo's own code (its API server, controller, webhook, two simulated agents, containerd
where the test runtime is built; the scenario applied while a real Prometheus scrapes every
component each second and evaluates the chart's rules: tests/observability/prometheus.py), then
asks Prometheus for the panels below over the run, with the expressions read from the chart's
dashboard JSON by panel title, and draws them with matplotlib (the `bench` extra, not a runtime
dependency). The picture cannot drift from the metrics: a panel whose query returns nothing
stops the script. Needs Debian's Prometheus (`bash testprometheus/build.sh`) and, for the
per-claim series, root and the test containerd (`bash testruntime/build.sh`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from elasticgpu.kubectl_plugin import command  # noqa: E402
from tests.observability import prometheus  # noqa: E402  (the repository's own harness)

PANELS = (
    "Free cores per class (100 = one card)",
    "Claims by phase",
    "Cores reserved per namespace and class",
    "Allocation per card (share of cores reserved)",
    "Cores used per namespace",
    "Memory reserved and used per namespace",
)


def _panel(title: str) -> dict[str, Any]:
    board = json.loads(prometheus.DASHBOARD.read_text())
    for panel in board["panels"]:
        if panel["title"] == title:
            return dict(panel)
    raise SystemExit(f"dashboard-picture: no panel titled {title!r} in {prometheus.DASHBOARD}")


def _legend(template: str, labels: dict[str, str]) -> str:
    text = template
    for key, value in labels.items():
        text = text.replace("{{" + key + "}}", value)
    return text.replace("{{class}}", "") or "value"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "docs" / "img" / "dashboard.png"))
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to scrape after the scenario")
    args = parser.parse_args()
    binaries = prometheus.binaries()
    if isinstance(binaries, str):
        raise SystemExit(f"dashboard-picture: {binaries}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with tempfile.TemporaryDirectory(prefix="egpu-picture-") as directory:
        began = time.time()
        with prometheus.observed_demo(binaries, Path(directory), settle_s=args.seconds, say=print) as (demo, server):
            end = time.time()
            figure, axes = plt.subplots(3, 2, figsize=(13, 10), constrained_layout=True)
            for axis, title in zip(axes.flat, PANELS, strict=True):
                panel = _panel(title)
                unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
                for target in panel["targets"]:
                    # Short, so a rate follows the run; 30 s spans six of the agents' 5 s usage passes.
                    expr = prometheus.for_prometheus(target["expr"], "30s")
                    series = server.query_range(expr, start=began, end=end, step=1.0)
                    if not series:
                        raise SystemExit(f"dashboard-picture: panel {title!r}: {expr} returned nothing")
                    for one in series:
                        xs = [float(t) - began for t, _ in one["values"]]
                        ys = [float(v) for _, v in one["values"]]
                        axis.plot(xs, ys, label=_legend(target.get("legendFormat", ""), one["metric"]))
                        print(f"{title}: {_legend(target.get('legendFormat', ''), one['metric'])} = {ys[-1]:g}")
                axis.set_title(title, fontsize=10)
                axis.set_xlabel("seconds into the demo")
                if unit == "bytes":
                    gib = matplotlib.ticker.FuncFormatter(lambda v, _p: f"{v / 2**30:.0f} GiB")
                    axis.yaxis.set_major_formatter(gib)
                axis.legend(fontsize=7, loc="best")
                axis.grid(alpha=0.3)
            figure.suptitle("elasticgpu dashboard, main panels: a real Prometheus scraping `elasticgpu demo`",
                            fontsize=12)
            out = Path(args.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            figure.savefig(out, dpi=90)
            print(f"wrote {out}")
            # The same run as `kubectl egpu usage` tells it, from Prometheus and from the objects.
            connection = ["--kubeconfig", str(demo.kubeconfig), "-n", demo.scenario.namespace]
            for extra in (["--prometheus", server.url, "--since", "1m"], []):
                print(f"$ kubectl egpu usage -n {demo.scenario.namespace} {' '.join(extra)}".rstrip())
                command.main(["usage", *connection, *extra])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
