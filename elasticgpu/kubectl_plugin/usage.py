"""`kubectl egpu usage`: per namespace and class, what was reserved, what was used, and the waste.

Two sources, one table:

- `--prometheus URL`: the accounting counters over `--since` (default 24h): card-hours and
  GiB-hours reserved (`elasticgpu_reserved_*_total`, from the ElasticGPUs' `status.accounting`)
  and used (`elasticgpu_agent_claim_used_*_total`, the agents' measurements). Reserved is taken
  per ElasticGPU as its last value minus its last value before the window: the counters are
  totals since each bind that any controller replica reports alike, so a leader change or a
  restart inside the window neither drops nor doubles anything (docs/accounting.md).
- no URL: what the cluster's objects say now: the cores and memory Bound ElasticGPUs hold, what
  the agents last measured in each claim's `status.usage`, and the card-hours reserved since
  each bind (`status.accounting`). There is no window then: `--since` needs Prometheus.

WASTE is 1 - used/reserved, on cores: the share of what the namespace reserved that it left idle.
"""

from __future__ import annotations

import argparse
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any

from elasticgpu import user_errors
from elasticgpu.api import accounting, format_memory, names
from elasticgpu.kubectl_plugin import cluster, table

GIB = 1024**3
CARD_SECONDS_PER_HOUR = names.CORES_PER_CARD * 3600
PROMETHEUS_TIMEOUT_S = 30.0
WINDOW = re.compile(r"^[0-9]+[smhdwy]$")
LOOKBACK = "1h"
"""How far before the window to look for each ElasticGPU's last value (one sample is enough)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `usage` (beyond the plugin's common ones; -n limits it to one namespace)."""
    parser.add_argument("--prometheus", metavar="URL",
                        help="read the accounting counters from this Prometheus (e.g. http://prometheus:9090);"
                             " without it, what the cluster's objects say now")
    parser.add_argument("--since", metavar="WINDOW",
                        help="the window with --prometheus, as PromQL writes it: 24h (default), 7d, 30m")
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table", help="table (default) or json")


@dataclass
class Row:
    """One namespace and class. Seconds are card-core seconds (100 = one card for a second) and
    memory byte-seconds over the window (Prometheus) or since each bind (objects)."""

    namespace: str
    class_name: str
    reserved_core_seconds: float = 0.0
    used_core_seconds: float | None = None
    reserved_memory_byte_seconds: float = 0.0
    used_memory_byte_seconds: float | None = None
    reserved_cores_now: int | None = None
    used_cores_now: int | None = None
    reserved_memory_mib_now: int | None = None
    used_memory_mib_now: int | None = None
    claims: int | None = None

    @property
    def waste(self) -> float | None:
        """1 - used/reserved on cores (None: nothing reserved, or no measurement)."""
        reserved: float = self.reserved_core_seconds
        used: float | None = self.used_core_seconds
        if self.reserved_cores_now is not None:
            reserved, used = float(self.reserved_cores_now), self.used_cores_now
        if not reserved or used is None:
            return None
        return max(0.0, 1.0 - used / reserved)


def _prometheus_query(url: str, expr: str) -> list[dict[str, Any]]:
    address = f"{url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': expr, 'time': time.time()})}"
    try:
        with urllib.request.urlopen(address, timeout=PROMETHEUS_TIMEOUT_S) as answer:
            body = json.load(answer)
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace")[:300]
        raise user_errors.UserError(
            f"Prometheus at {url} refused the accounting query ({err.code}: {detail}); check that --prometheus"
            " names a Prometheus and --since a window like 24h") from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        raise user_errors.UserError(f"Prometheus at {url} does not answer ({reason}): check --prometheus (its base"
                                    " URL, e.g. http://prometheus.monitoring:9090)") from None
    if body.get("status") != "success":
        raise user_errors.UserError(f"Prometheus at {url} answered {body.get('error') or body}: check --prometheus")
    return list((body.get("data") or {}).get("result") or [])


def _selector(namespace: str | None) -> str:
    return f'{{namespace="{namespace}"}}' if namespace else ""


def reserved_query(metric: str, window: str, namespace: str | None) -> str:
    """PromQL: what each (namespace, class) reserved in the last `window`. Where the class has
    per-ElasticGPU series (it opts in, docs/metrics.md): per ElasticGPU its last value minus its
    last value before the window (0 for one bound inside it), then summed; each replica reports
    the same absolute value, so `max by` merges the series of two replicas. Other classes: the
    increase of the namespace totals (`elasticgpu_namespace_reserved_*`, leader only)."""
    series = f"{metric}{_selector(namespace)}"
    by = "max by (namespace, class, elasticgpu)"
    last = f"{by} (max_over_time({series}[{window}]))"
    before = f"{by} (max_over_time({series}[{LOOKBACK}] offset {window}))"
    totals = metric.replace("elasticgpu_reserved_", "elasticgpu_namespace_reserved_", 1) + _selector(namespace)
    return (f"sum by (namespace, class) ({last} - ({before} or {last} * 0))"
            f" or sum by (namespace, class) (increase({totals}[{window}]))")


def used_query(metric: str, window: str, namespace: str | None) -> str:
    """PromQL: what each (namespace, class) used in the last `window`: the agents' counters
    (`increase` reads their restarts as resets), each claim's class from the reserved series."""
    classes = (f"group by (namespace, claim, class) (max_over_time(elasticgpu_reserved_core_seconds_total"
               f"{_selector(namespace)}[{window}]))")
    return (f"sum by (namespace, class) (increase({metric}{_selector(namespace)}[{window}])"
            f" * on (namespace, claim) group_left (class) {classes})")


def from_prometheus(url: str, window: str, namespace: str | None) -> list[Row]:
    """The rows of `window` from the Prometheus at `url`."""
    if not WINDOW.match(window):
        raise user_errors.UserError(f"--since {window}: not a window; write it as PromQL does, e.g. 24h, 7d, 90m")
    rows: dict[tuple[str, str], Row] = {}

    def take(expr: str, field: str) -> None:
        for sample in _prometheus_query(url, expr):
            labels = sample.get("metric") or {}
            key = (str(labels.get("namespace", "")), str(labels.get("class", "")))
            row = rows.setdefault(key, Row(namespace=key[0], class_name=key[1]))
            setattr(row, field, float(sample["value"][1]))

    take(reserved_query("elasticgpu_reserved_core_seconds_total", window, namespace), "reserved_core_seconds")
    take(reserved_query("elasticgpu_reserved_memory_byte_seconds_total", window, namespace),
         "reserved_memory_byte_seconds")
    take(used_query("elasticgpu_agent_claim_used_core_seconds_total", window, namespace), "used_core_seconds")
    take(used_query("elasticgpu_agent_claim_used_memory_byte_seconds_total", window, namespace),
         "used_memory_byte_seconds")
    return sorted(rows.values(), key=lambda r: (r.namespace, r.class_name))


def from_objects(view: cluster.Cluster, namespace: str | None, *, now: float) -> list[Row]:
    """The rows of what the ElasticGPUs and claims say now."""
    usage = {(c.metadata.namespace or "", c.metadata.name or ""): c.status.usage for c in view.claims()}
    rows: dict[tuple[str, str], Row] = {}
    for egpu in view.elastic_gpus():
        ref = egpu.spec.claim_ref
        if ref is None or not ref.name or (namespace and ref.namespace != namespace):
            continue
        bound = egpu.status.phase == accounting.OPEN_PHASE
        if not bound and egpu.status.accounting is None:
            continue  # never bound: nothing reserved
        key = (ref.namespace or "", egpu.spec.elastic_gpu_class_name or "")
        row = rows.setdefault(key, Row(namespace=key[0], class_name=key[1], reserved_cores_now=0, used_cores_now=0,
                                       reserved_memory_mib_now=0, used_memory_mib_now=0, claims=0))
        accrued = accounting.accrued(accounting.view(egpu), now=now)
        row.reserved_core_seconds += accrued.core_seconds
        row.reserved_memory_byte_seconds += accrued.memory_byte_seconds
        if bound:
            size = accounting.size_of(egpu.status.capacity)
            measured = usage.get((ref.namespace or "", ref.name))
            row.claims = (row.claims or 0) + 1
            row.reserved_cores_now = (row.reserved_cores_now or 0) + size.cores
            row.reserved_memory_mib_now = (row.reserved_memory_mib_now or 0) + size.memory_mib
            row.used_cores_now = (row.used_cores_now or 0) + (measured.cores_used if measured else 0)
            row.used_memory_mib_now = (row.used_memory_mib_now or 0) + (measured.memory_used if measured else 0)
    return sorted(rows.values(), key=lambda r: (r.namespace, r.class_name))


def _hours(seconds: float | None, per_hour: float) -> str:
    if seconds is None:
        return "-"
    hours = seconds / per_hour
    # Two decimals hide a short window's figures (a card for a minute is 0.0167 h): four below 0.1.
    return f"{hours:.4f}" if 0 < hours < 0.1 else f"{hours:.2f}"


def _percent(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio * 100:.0f}%"


def render(rows: list[Row], *, window: str | None) -> str:
    """The table: a window's totals (Prometheus), or now and since each bind (objects)."""
    header: tuple[str, ...]
    lines: list[tuple[str, ...]]
    if window is not None:
        header = ("NAMESPACE", "CLASS", "RESERVED-CARD-H", "USED-CARD-H", "WASTE", "RESERVED-GIB-H", "USED-GIB-H")
        lines = [(r.namespace, r.class_name or "-", _hours(r.reserved_core_seconds, CARD_SECONDS_PER_HOUR),
                  _hours(r.used_core_seconds, CARD_SECONDS_PER_HOUR), _percent(r.waste),
                  _hours(r.reserved_memory_byte_seconds, GIB * 3600), _hours(r.used_memory_byte_seconds, GIB * 3600))
                 for r in rows]
        note = f"over the last {window}; card-hours of cores (100 cores for an hour = 1), from Prometheus"
    else:
        header = ("NAMESPACE", "CLASS", "CLAIMS", "CORES", "CORES-USED", "WASTE", "MEMORY", "MEMORY-USED",
                  "CARD-H-SINCE-BIND")
        lines = [(r.namespace, r.class_name or "-", str(r.claims or 0), str(r.reserved_cores_now or 0),
                  str(r.used_cores_now or 0), _percent(r.waste), format_memory(r.reserved_memory_mib_now or 0),
                  format_memory(r.used_memory_mib_now or 0), _hours(r.reserved_core_seconds, CARD_SECONDS_PER_HOUR))
                 for r in rows]
        note = ("now, from the cluster's objects (CORES: 100 = one card; USED: the agents' last measurement);"
                " --prometheus URL --since 24h for a window")
    if not rows:
        return f"no reserved GPUs {note.split(';')[0]}\n"
    return table.render(header, lines) + f"\n{note}\n"


def run(args: argparse.Namespace, view: cluster.Cluster) -> int:
    """Print the usage table (or JSON) of every namespace, or of `-n NAMESPACE`."""
    namespace: str | None = args.namespace  # None: every namespace (-n not given)
    if args.prometheus:
        window = args.since or "24h"
        rows = from_prometheus(args.prometheus, window, namespace)
    else:
        if args.since:
            raise user_errors.UserError(
                f"--since {args.since} needs --prometheus URL: the cluster's objects hold what each ElasticGPU"
                " reserved since its bind, not per window")
        window = None
        rows = from_objects(view, namespace, now=time.time())
    if args.output == "json":
        out = [{**{k: v for k, v in asdict(r).items() if v is not None}, "waste": r.waste} for r in rows]
        print(json.dumps({"source": "prometheus" if window else "objects", "window": window, "rows": out}, indent=2))
    else:
        print(render(rows, window=window), end="")
    return 0
