"""API writes per pod, by resource, verb and subresource: bench/real_scheduler.py's runs, counted.

Runs bench/real_scheduler.py (same arguments; its setup and runs, imported, not copied) and
scrapes kube-apiserver's own counter `apiserver_request_total` before each run and after it (plus
`--settle-s`, for the writes that trail the last pod scheduled: Events, claim status). Prints,
per run, the writes per pod by (group/resource/subresource, verb) and their total, and the
kube-apiserver CPU seconds per pod. The counter has no client label, so the nodes' Lease renewals
(the bench's simulated kubelets) and the scheduler's and controller manager's writes are in it:
the `plain` run is the same pods without claims, its writes are the floor every pod pays.

    python bench/writes_per_pod.py --nodes 20 --pods 200
    python bench/writes_per_pod.py --nodes 20 --pods 200 --runs claims --json out.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import real_scheduler

WRITE_VERBS = {"POST", "PUT", "PATCH", "DELETE", "APPLY", "CREATE", "UPDATE"}
_LINE = re.compile(r"^(?P<metric>apiserver_request_total|apiserver_request_duration_seconds_sum|"
                   r"apiserver_watch_events_sizes_sum|apiserver_watch_events_total)\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


Scraped = tuple[Counter[tuple[str, str]], Counter[tuple[str, str]], Counter[str], Counter[str]]


def scrape(api_client: Any) -> Scraped:
    """apiserver_request_total of write verbs, summed over codes and scopes, by (resource, verb); the
    seconds those requests took (apiserver_request_duration_seconds_sum: wall time in the server, a
    proxy for its work per kind of write); watch events sent and their bytes, by resource."""
    response = api_client.call_api("GET", api_client.configuration.host + "/metrics")
    counts: Counter[tuple[str, str]] = Counter()
    seconds: Counter[tuple[str, str]] = Counter()
    watch_events: Counter[str] = Counter()
    watch_bytes: Counter[str] = Counter()
    for line in response.read().decode().splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        if match["metric"].startswith("apiserver_watch_events"):
            kind = f"{labels.get('group') or 'core'}/{labels.get('resource', '')}"
            into = watch_events if match["metric"].endswith("total") else watch_bytes
            into[kind] += float(match["value"])  # type: ignore[assignment]
            continue
        verb = labels.get("verb", "")
        if verb not in WRITE_VERBS:
            continue
        resource = "/".join(p for p in (labels.get("group") or "core", labels.get("resource", ""),
                                        labels.get("subresource", "")) if p)  # fmt: skip
        if match["metric"] == "apiserver_request_total":
            counts[(resource, verb)] += int(float(match["value"]))
        else:
            seconds[(resource, verb)] += float(match["value"])  # type: ignore[assignment]
    return counts, seconds, watch_events, watch_bytes


def delete_all(custom: Any, core: Any, namespace: str, timeout_s: float = 300.0) -> None:
    """Delete every pod of `namespace` (grace 0: no kubelet runs to confirm), 16 at a time; wait until
    the controller has released their claims and reclaimed their ElasticGPUs."""
    from concurrent.futures import ThreadPoolExecutor

    from elasticgpu.api import names

    pods = [p.metadata.name for p in core.list_namespaced_pod(namespace).items]
    with ThreadPoolExecutor(real_scheduler.THREADS) as pool:
        list(pool.map(lambda p: core.delete_namespaced_pod(p, namespace, grace_period_seconds=0), pods))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        claims = custom.list_namespaced_custom_object(names.GROUP, names.VERSION, namespace, names.PLURAL_CLAIM)
        egpus = custom.list_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL_ELASTIC_GPU)
        if not claims["items"] and not egpus["items"]:
            return
        time.sleep(0.5)
    print(f"  (claims or ElasticGPUs left after {timeout_s:.0f} s)", flush=True)


def dump(custom: Any, core: Any, namespace: str, folder: Path) -> None:
    """One pod, claim, ElasticGPU and GPU of the claims run as the API server holds them, with their sizes."""
    from elasticgpu.api import names

    folder.mkdir(parents=True, exist_ok=True)
    pod = core.api_client.sanitize_for_serialization(core.read_namespaced_pod("p00000", namespace))
    claim = custom.get_namespaced_custom_object(names.GROUP, names.VERSION, namespace, names.PLURAL_CLAIM,
                                                "p00000-main")  # fmt: skip
    egpu = custom.get_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL_ELASTIC_GPU,
                                            claim["spec"]["elasticGPUName"])  # fmt: skip
    gpu_name = names.gpu_object_name(egpu["status"]["gpus"][0]) if egpu.get("status", {}).get("gpus") else None
    gpu = custom.get_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL_GPU, gpu_name) if gpu_name else {}
    for kind, body in (("pod", pod), ("claim", claim), ("egpu", egpu), ("gpu", gpu)):
        text = json.dumps(body, indent=1, sort_keys=True)
        (folder / f"{kind}.json").write_text(text)
        managed = len(json.dumps((body.get("metadata") or {}).get("managedFields") or []))
        print(f"  {kind}: {len(json.dumps(body))} bytes, managedFields {managed}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settle-s", type=float, default=5.0, help="wait after each run before the last scrape")
    parser.add_argument("--json", help="write the per-run counts here")
    parser.add_argument("--delete", action="store_true",
                        help="after the claims run, delete its pods (at once, as a node's eviction does) and count"
                        " the writes until their claims and ElasticGPUs are gone")
    parser.add_argument("--dump", help="write one object of each kind the claims run wrote here (JSON, sizes)")
    args, rest = parser.parse_known_args(argv)
    original = real_scheduler.run
    report: dict[str, Any] = {}

    def tell(which: str, pods: int, before: Scraped, after: Scraped, apiserver_cpu: float) -> None:
        """Print and keep the writes, server time and watch events between two scrapes, per pod."""
        (counts_0, seconds_0, events_0, bytes_0), (counts_1, seconds_1, events_1, bytes_1) = before, after
        writes = {f"{r} {v}": (counts_1[(r, v)] - counts_0.get((r, v), 0)) for r, v in counts_1}
        writes = {k: n for k, n in sorted(writes.items()) if n}
        total = sum(writes.values())
        leases = sum(n for k, n in writes.items() if k.startswith("coordination.k8s.io/leases"))
        report[which] = {"pods": pods, "writes": writes, "total": total, "without_leases": total - leases,
                         "apiserver_cpu_s": apiserver_cpu}  # fmt: skip
        ms = {f"{r} {v}": 1000 * (seconds_1[(r, v)] - seconds_0.get((r, v), 0)) / pods for r, v in seconds_1}
        report[which]["server_ms_per_pod"] = {k: round(ms.get(k, 0.0), 3) for k in writes}
        watched = {k: (events_1[k] - events_0.get(k, 0), bytes_1[k] - bytes_0.get(k, 0)) for k in events_1}
        watched = {k: v for k, v in sorted(watched.items()) if v[0]}
        report[which]["watch_events_per_pod"] = {k: round(v[0] / pods, 2) for k, v in watched.items()}
        print(f"\n{which}: writes per pod ({pods} pods; counts, per pod, ms in the server per pod)")
        for key, n in writes.items():
            print(f"  {key:60s} {n:6d}  {n / pods:6.2f}  {ms.get(key, 0.0):7.2f} ms")
        print(f"  {'total':60s} {total:6d}  {total / pods:6.2f}")
        print(f"  {'total without node Leases':60s} {total - leases:6d}  {(total - leases) / pods:6.2f}")
        print("  watch events sent per pod (and KiB per pod), by resource:")
        for key, (n, size) in watched.items():
            print(f"    {key:58s} {n / pods:6.2f}  {size / 1024 / pods:7.2f} KiB")
        print(f"  kube-apiserver CPU {apiserver_cpu:.2f} s = {1000 * apiserver_cpu / pods:.1f} ms per pod", flush=True)

    def counted(custom: Any, core: Any, namespace: str, **kwargs: Any) -> dict[str, Any]:
        before = scrape(custom.api_client)
        result = original(custom, core, namespace, **kwargs)
        time.sleep(args.settle_s)
        after = scrape(custom.api_client)
        # By namespace: a run added to real_scheduler.py (another kind of pod) gets its own rows.
        which = {real_scheduler.CLAIMS_NS: "claims", real_scheduler.PLAIN_NS: "plain"}.get(namespace, namespace)
        pods = kwargs["pods"]
        tell(which, pods, before, after, result["cpu"].get("kube-apiserver", float("nan")))
        report[which]["scheduled_per_s"] = result["scheduled_per_s"]
        if args.dump and which == "claims":
            dump(custom, core, namespace, Path(args.dump))
        if args.delete and which == "claims":
            cpu = kwargs["cpu"]
            before, cpu_before = scrape(custom.api_client), cpu()
            delete_all(custom, core, namespace)
            time.sleep(args.settle_s)
            after = scrape(custom.api_client)
            tell(f"{which} deleted", pods, before, after, cpu()["kube-apiserver"] - cpu_before["kube-apiserver"])
        return result

    real_scheduler.run = counted  # type: ignore[assignment]
    code = real_scheduler.main(rest)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, sort_keys=True))
    return code


if __name__ == "__main__":
    sys.exit(main())
