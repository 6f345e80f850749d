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
_LINE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(api_client: Any) -> Counter[tuple[str, str]]:
    """apiserver_request_total of write verbs, summed over codes and scopes, by (resource, verb)."""
    response = api_client.call_api("GET", api_client.configuration.host + "/metrics")
    counts: Counter[tuple[str, str]] = Counter()
    for line in response.read().decode().splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        verb = labels.get("verb", "")
        if verb not in WRITE_VERBS:
            continue
        resource = "/".join(p for p in (labels.get("group") or "core", labels.get("resource", ""),
                                        labels.get("subresource", "")) if p)  # fmt: skip
        counts[(resource, verb)] += int(float(match["value"]))
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settle-s", type=float, default=5.0, help="wait after each run before the last scrape")
    parser.add_argument("--json", help="write the per-run counts here")
    args, rest = parser.parse_known_args(argv)
    original = real_scheduler.run
    report: dict[str, Any] = {}

    def counted(custom: Any, core: Any, namespace: str, **kwargs: Any) -> dict[str, Any]:
        before = scrape(custom.api_client)
        result = original(custom, core, namespace, **kwargs)
        time.sleep(args.settle_s)
        after = scrape(custom.api_client)
        which = "claims" if kwargs.get("claims") else "plain"
        pods = kwargs["pods"]
        writes = {f"{r} {v}": (after[(r, v)] - before.get((r, v), 0)) for r, v in after}
        writes = {k: n for k, n in sorted(writes.items()) if n}
        total = sum(writes.values())
        leases = sum(n for k, n in writes.items() if k.startswith("coordination.k8s.io/leases"))
        apiserver_cpu = result["cpu"].get("kube-apiserver", float("nan"))
        report[which] = {"pods": pods, "writes": writes, "total": total, "without_leases": total - leases,
                         "apiserver_cpu_s": apiserver_cpu, "scheduled_per_s": result["scheduled_per_s"]}  # fmt: skip
        print(f"\n{which}: writes per pod ({pods} pods; counts / pods)")
        for key, n in writes.items():
            print(f"  {key:60s} {n:6d}  {n / pods:6.2f}")
        print(f"  {'total':60s} {total:6d}  {total / pods:6.2f}")
        print(f"  {'total without node Leases':60s} {total - leases:6d}  {(total - leases) / pods:6.2f}")
        print(f"  kube-apiserver CPU {apiserver_cpu:.2f} s = {1000 * apiserver_cpu / pods:.1f} ms per pod", flush=True)
        return result

    real_scheduler.run = counted  # type: ignore[assignment]
    code = real_scheduler.main(rest)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, sort_keys=True))
    return code


if __name__ == "__main__":
    sys.exit(main())
