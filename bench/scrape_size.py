"""The controller's /metrics at fleet size (issue 49 item 3): how many series, how many bytes, how
long one scrape takes, in-process and as the real Prometheus of the tests sees it.

The controller's own code builds the figures: a `Picture` that took in N Bound ElasticGPUs (one
per claim, spread over namespaces, as the watch delivers them) and its classes, the
`ControllerMetrics` collectors reading it at each scrape (claims by phase and class, accounting,
claim sizes), served by the controller's `HealthServer`. The claim sizes are what the
recommender holds for Bound share claims of classes with resizePolicy not Off: every claim here,
the worst case. `--per-claim-share` is the share of claims whose class carries the annotation
`elasticgpu.io/per-claim-metrics: "true"` (1.0: every claim has its per-claim series, as every
claim had before issue 49).

    python bench/scrape_size.py                           # 50,000 claims, totals only
    python bench/scrape_size.py --per-claim-share 1       # every class opted in
    python bench/scrape_size.py --claims 2000 --no-prometheus   # smoke run (tests/bench)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import resource
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from elasticgpu.api import names, timestamps  # noqa: E402
from elasticgpu.controller.flow.elastic.recommending import ClaimSizes  # noqa: E402
from elasticgpu.controller.metrics import ControllerMetrics  # noqa: E402
from elasticgpu.controller.picture.picture import Picture  # noqa: E402
from elasticgpu.controller.process import garbage  # noqa: E402
from elasticgpu.controller.process.health import HealthServer  # noqa: E402

OPTED = "detailed"
PLAIN = "shared"


def _klass(name: str, *, opted: bool) -> dict[str, object]:
    annotations = {names.ANNOTATION_PER_CLAIM_METRICS: "true"} if opted else {}
    return {"apiVersion": names.API_VERSION, "kind": names.KIND_CLASS,
            "metadata": {"name": name, "annotations": annotations, "resourceVersion": "1"},
            "provisioner": names.PROVISIONER_GPUSHARE, "parameters": {}, "resizePolicy": "Recommend"}


def _egpu(index: int, *, namespace: str, class_name: str, since: int) -> dict[str, object]:
    capacity = {names.RESOURCE_CORE: 25, names.RESOURCE_MEMORY: "10Gi"}
    return {
        "apiVersion": names.API_VERSION, "kind": names.KIND_ELASTIC_GPU,
        "metadata": {"name": f"egpu-{index:06d}", "uid": f"uid-e-{index}", "resourceVersion": str(100 + index),
                     "creationTimestamp": timestamps.format_epoch(since)},
        "spec": {"capacity": capacity, "gpuShare": {"gpuName": f"gpu-{index // 4:06d}"},
                 "claimRef": {"namespace": namespace, "name": f"claim-{index:06d}", "uid": f"uid-c-{index}"},
                 "elasticGPUClassName": class_name, "reclaimPolicy": "Delete"},
        "status": {"phase": "Bound", "capacity": capacity,
                   "accounting": {"since": timestamps.format_epoch(since), "coreSeconds": 25 * 3600,
                                  "memoryMibSeconds": 10240 * 3600, "cardSeconds": 0}},
    }


@dataclasses.dataclass(frozen=True)
class Scrape:
    seconds: float
    cpu_seconds: float
    bytes: int
    samples: int


def _scrape(url: str) -> Scrape:
    """One GET of /metrics: wall seconds, and CPU seconds of this process (the server's thread
    does the work; on a shared machine the wall clock waits for a core, the CPU time does not)."""
    began, cpu = time.perf_counter(), time.process_time()
    with urllib.request.urlopen(url, timeout=300) as answer:
        body = answer.read()
    took, cpu_took = time.perf_counter() - began, time.process_time() - cpu
    samples = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    return Scrape(took, cpu_took, len(body), samples)


def _prometheus(address: str, directory: Path, interval_s: float) -> dict[str, float]:
    """Let the tests' real Prometheus (testprometheus/build.sh) scrape `address` every
    `interval_s` (timeout the same) three times; its own figures of those scrapes."""
    from tests.observability import prometheus as real

    found = real.binaries()
    if isinstance(found, str):
        raise SystemExit(found)
    port = real._free_port()
    config = {"global": {"scrape_interval": f"{interval_s:g}s", "scrape_timeout": f"{interval_s:g}s"},
              "scrape_configs": [{"job_name": "controller", "static_configs": [{"targets": [address]}]}]}
    (directory / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    with (directory / "prometheus.log").open("wb") as log:
        process = subprocess.Popen(
            [str(found.prometheus), f"--config.file={directory / 'prometheus.yml'}",
             f"--storage.tsdb.path={directory / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/api/v1/query?"

    def value(expr: str) -> float:
        with urllib.request.urlopen(url + urllib.parse.urlencode({"query": expr}), timeout=30) as answer:
            result = json.load(answer)["data"]["result"]
        return float(result[0]["value"][1]) if result else float("nan")

    try:
        deadline = time.monotonic() + interval_s * 4 + 120
        scrapes = 0.0
        while time.monotonic() < deadline and not scrapes >= 3:
            time.sleep(interval_s / 2)
            with contextlib.suppress(OSError, KeyError, ValueError):
                scrapes = value('count_over_time(scrape_duration_seconds{job="controller"}[1h])')
        window = "[1h]"
        return {"scrapes": scrapes,
                "max_s": value(f'max_over_time(scrape_duration_seconds{{job="controller"}}{window})'),
                "min_s": value(f'min_over_time(scrape_duration_seconds{{job="controller"}}{window})'),
                "up_min": value(f'min_over_time(up{{job="controller"}}{window})'),
                "samples": value('scrape_samples_scraped{job="controller"}'),
                "series": value('count({job="controller"})')}
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--claims", type=int, default=50_000)
    parser.add_argument("--namespaces", type=int, default=500)
    parser.add_argument("--per-claim-share", type=float, default=0.0,
                        help="share of claims in a class that opts in to per-claim series (0..1)")
    parser.add_argument("--scrapes", type=int, default=3)
    parser.add_argument("--no-prometheus", action="store_true", help="scrape in-process only")
    parser.add_argument("--interval", type=float, default=10.0, help="Prometheus scrape interval, seconds")
    args = parser.parse_args()

    now = int(time.time())
    picture = Picture()
    picture.observe("class", "ADDED", _klass(OPTED, opted=True))
    picture.observe("class", "ADDED", _klass(PLAIN, opted=False))
    opted_claims = round(args.claims * args.per_claim_share)
    sizes: list[ClaimSizes] = []
    began, began_cpu = time.perf_counter(), time.process_time()
    for index in range(args.claims):
        namespace = f"team-{index % args.namespaces:04d}"
        class_name = OPTED if index < opted_claims else PLAIN
        picture.observe("egpu", "ADDED", _egpu(index, namespace=namespace, class_name=class_name, since=now - 7200))
        sizes.append(ClaimSizes(namespace, f"claim-{index:06d}", f"uid-c-{index}", 25, 10240, 12, 4000,
                                15, 5120, class_name))
    took_in, took_in_cpu = time.perf_counter() - began, time.process_time() - began_cpu
    sizes.sort(key=lambda e: (e.namespace, e.name))
    # What the controller does after its first list (`process.starting`): no automatic full
    # collection from then on, the picture frozen. Without it, a full collection that falls due
    # lands in whichever scrape allocates at that moment, and walks the whole picture.
    garbage.take_over_full_collections()
    garbage.collect_and_freeze()

    metrics = ControllerMetrics()
    metrics.watch_picture(claims=lambda: {("Bound", PLAIN): args.claims - opted_claims, ("Bound", OPTED): opted_claims},
                          free=dict, waiting=list)
    metrics.watch_claim_sizes(lambda: sizes, per_claim=picture.per_claim_metric_classes)
    picture.on_egpu_gone = metrics.watch_accounting(picture.elastic_gpus_changed,
                                                    per_claim=picture.per_claim_metric_classes)
    metrics.leading(True)
    server = HealthServer(registry=metrics.registry, host="127.0.0.1", port=0).start()
    url = f"http://127.0.0.1:{server.port}/metrics"
    scrapes = [_scrape(url) for _ in range(args.scrapes)]
    # Another replica led a while, then this one again: a new tenure, which knows no ElasticGPU.
    metrics.leading(False)
    metrics.leading(True)
    after_change = _scrape(url)
    figures: dict[str, object] = {
        "claims": args.claims, "namespaces": args.namespaces, "per_claim_share": args.per_claim_share,
        "take_in_s": round(took_in, 1), "take_in_cpu_s": round(took_in_cpu, 2),
        "first_scrape_s": round(scrapes[0].seconds, 3), "first_scrape_cpu_s": round(scrapes[0].cpu_seconds, 3),
        "after_leader_change_cpu_s": round(after_change.cpu_seconds, 3),
        "scrape_s": round(min(s.seconds for s in scrapes[1:] or scrapes), 3),
        "scrape_cpu_s": round(min(s.cpu_seconds for s in scrapes[1:] or scrapes), 3),
        "bytes": scrapes[-1].bytes, "samples": scrapes[-1].samples,
        "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }
    if not args.no_prometheus:
        # Its first scrape is then the first of a tenure, the costliest: its max_s counts it.
        metrics.leading(False)
        metrics.leading(True)
        with tempfile.TemporaryDirectory(prefix="scrape-size-") as directory:
            figures["prometheus"] = _prometheus(f"127.0.0.1:{server.port}", Path(directory), args.interval)
    server.stop()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
