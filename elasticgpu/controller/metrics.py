"""The controller's Prometheus metrics (prometheus-client), served on `/metrics` by `health.py`.

One `ControllerMetrics` per process holds every metric in its own `CollectorRegistry` (not the
library's global one), so that two controllers in one test process do not collide and a test
reads exactly the figures of the controller it started. The controller's modules receive the
object and call its methods; nothing else here knows about the controller.

    elasticgpu_claims_bound_total{mode}            claims bound (mode: dynamic | static)
    elasticgpu_elasticgpus_provisioned_total       ElasticGPUs created for a claim
    elasticgpu_elasticgpus_released_total          ElasticGPUs released after their claim went
    elasticgpu_conflicts_total{resource}           409s on writes (expected with two controllers)
    elasticgpu_api_errors_total{code,verb}         failed API calls; code "none" = no answer
    elasticgpu_work_queue_depth                    keys waiting in the work queue (read at scrape)
    elasticgpu_sync_duration_seconds{kind,outcome} one sync of one key
    elasticgpu_leader                              1 while this process holds the Lease
    elasticgpu_claims{phase,class}                 claims by phase (Pending, Bound, Lost) and the
                                                   class their spec names ("" none); read at scrape
    elasticgpu_class_free_cores{class}             free cores (percent of a card, summed over the
                                                   healthy cards the class may use; 100 = a card)
    elasticgpu_class_free_memory_bytes{class}      free memory on those cards, bytes
    elasticgpu_class_free_cards{class}             those cards nobody holds any of (whole cards)
    elasticgpu_claim_{requested,used,recommended}_cores{namespace,claim}
                                                   per Bound share claim of a class that opts in
                                                   (annotation elasticgpu.io/per-claim-metrics):
                                                   its request, its last measured use, the
                                                   recommendation (0: none yet)
    elasticgpu_claim_{requested,used,recommended}_memory_bytes{namespace,claim}  the same, bytes
    elasticgpu_namespace_{recommendable_requested,recommended}_{cores,memory_bytes}{namespace,class}
                                                   the same summed over the claims that have a
                                                   recommendation, for every class
    elasticgpu_reserved_{core,memory_byte,card}_seconds_total{namespace,claim,class,elasticgpu}
                                                   per ElasticGPU of a class that opts in: what it
                                                   reserved since its first bind (leader only)
    elasticgpu_namespace_reserved_{core,memory_byte,card}_seconds_total{namespace,class}
                                                   the same summed per namespace and class, since
                                                   this replica began to lead (leader only)

Per-claim series are opt-in per class (issue 49): at 50,000 claims they were 450,000 series and a
scrape of tens of MB; the totals are a few series per namespace and class whatever the count.
    process_*                                      CPU, RSS, open files of this process
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from elasticgpu.api import ElasticGPU, accounting, timestamps

__all__ = ["ACCOUNTING_LINGER_S", "SYNC_BUCKETS", "WAIT_BUCKETS", "ControllerMetrics"]

SYNC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Seconds. A sync that decides from the picture takes well under a millisecond; one that writes
waits on the API server (a few ms to 10 s, the request timeout): the buckets cover both."""

WAIT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
"""Seconds a claim waits for its bind or a pod for its gate lift: well under a second when
capacity is free, minutes to hours when it waits for room (a preemption, a release)."""


class FreeCapacity(Protocol):
    """What `watch_picture`'s `free` reports per class (`decisions.capacity.Free`)."""

    @property
    def cores(self) -> int: ...
    @property
    def memory_mib(self) -> int: ...
    @property
    def cards(self) -> int: ...


class _PictureCollector(Collector):
    """The gauges read from the picture at each scrape. Labels: phase and class, not namespace
    or claim: a few series per class, however many claims and namespaces there are."""

    def __init__(self, claims: Callable[[], Mapping[tuple[str, str], int]],
                 free: Callable[[], Mapping[str, FreeCapacity]],
                 waiting: Callable[[], Sequence[tuple[str, str, str | None]]] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self._claims = claims
        self._free = free
        self._waiting = waiting
        self._clock = clock

    def _pending(self) -> Iterator[Metric]:
        """Waiting claims by class and reason, and the longest wait per class (the alert on
        claims Pending with capacity free reads it)."""
        by_reason = GaugeMetricFamily("elasticgpu_claims_pending", "Claims that wait (Pending or no phase yet) by"
                                      ' class ("": the default) and status.reason ("": none yet).',
                                      labels=["class", "reason"])
        oldest = GaugeMetricFamily("elasticgpu_claims_pending_longest_seconds", "Seconds the longest-waiting claim"
                                   " of the class has existed without being bound.", labels=["class"])
        counts: dict[tuple[str, str], int] = {}
        longest: dict[str, float] = {}
        now = self._clock()
        for class_name, reason, created in self._waiting() if self._waiting is not None else []:
            counts[(class_name, reason)] = counts.get((class_name, reason), 0) + 1
            began = timestamps.epoch_seconds(created)
            waited = 0.0 if began is None else max(0.0, now - began)
            longest[class_name] = max(longest.get(class_name, 0.0), waited)
        for (class_name, reason), count in sorted(counts.items()):
            by_reason.add_metric([class_name, reason], count)
        for class_name, waited in sorted(longest.items()):
            oldest.add_metric([class_name], waited)
        yield from (by_reason, oldest)

    def collect(self) -> Iterator[Metric]:
        yield from self._pending()
        by_phase = GaugeMetricFamily("elasticgpu_claims", "Claims by phase and by the class their spec names"
                                     ' ("": none, the default class).', labels=["phase", "class"])
        for (phase, class_name), count in sorted(self._claims().items()):
            by_phase.add_metric([phase, class_name], count)
        yield by_phase
        free = sorted(self._free().items())
        cores = GaugeMetricFamily("elasticgpu_class_free_cores", "Free cores (percent of one card, summed) on"
                                  " the healthy cards a class may use; 100 is one card.", labels=["class"])
        memory = GaugeMetricFamily("elasticgpu_class_free_memory_bytes", "Free memory on the healthy cards a"
                                   " class may use, in bytes.", labels=["class"])
        cards = GaugeMetricFamily("elasticgpu_class_free_cards", "Healthy cards a class may use that nobody"
                                  " holds any of (what a whole-card claim can get).", labels=["class"])
        for class_name, room in free:
            cores.add_metric([class_name], room.cores)
            memory.add_metric([class_name], room.memory_mib * 1024 * 1024)
            cards.add_metric([class_name], room.cards)
        yield from (cores, memory, cards)


class _QuotaCollector(Collector):
    """How full each ElasticGPUQuota is, per key of its spec.hard (the quota-near-full alert)."""

    def __init__(self, fill: Callable[[], Sequence[tuple[str, str, str, int, int]]]) -> None:
        self._fill = fill

    def collect(self) -> Iterator[Metric]:
        ratio = GaugeMetricFamily("elasticgpu_quota_used_ratio", "Share of an ElasticGPUQuota's limit its namespace's"
                                  " claims hold, per key of spec.hard (1: full; a hard limit of 0 is left out).",
                                  labels=["namespace", "quota", "resource"])
        for namespace, name, key, used, hard in self._fill():
            if hard > 0:
                ratio.add_metric([namespace, name, key], used / hard)
        yield ratio


class ClaimSizes(Protocol):
    """What `watch_claim_sizes` reports per claim (`flow.elastic.recommending.ClaimSizes`)."""

    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def requested_cores(self) -> int: ...
    @property
    def requested_memory(self) -> int: ...
    @property
    def used_cores(self) -> int: ...
    @property
    def used_memory(self) -> int: ...
    @property
    def recommended_cores(self) -> int: ...
    @property
    def recommended_memory(self) -> int: ...
    @property
    def class_name(self) -> str: ...


_MIB = 1024 * 1024


class _ClaimSizesCollector(Collector):
    """Claim sizes (issue 17: requested, used, recommended) of the Bound share claims of classes
    whose resizePolicy is not Off, read at each scrape: per claim (labels namespace, claim) for
    the classes that opt in (`per_claim()`, issue 49), and always per namespace and class, over
    the claims that have a recommendation, so the two sums compare (what resizing would save)."""

    def __init__(self, sizes: Callable[[], Sequence[ClaimSizes]], per_claim: Callable[[], set[str]]) -> None:
        self._sizes = sizes
        self._per_claim = per_claim

    def collect(self) -> Iterator[Metric]:
        labels = ["namespace", "claim"]
        # Literal names: tests/docs reads them from this source to check docs/metrics.md.
        families = {
            "requested_cores": GaugeMetricFamily(
                "elasticgpu_claim_requested_cores", "Cores (percent of one card) the claim requests.", labels=labels),
            "used_cores": GaugeMetricFamily(
                "elasticgpu_claim_used_cores", "Cores (percent of one card) the claim used at its last measurement.",
                labels=labels),
            "recommended_cores": GaugeMetricFamily(
                "elasticgpu_claim_recommended_cores", "Cores (percent of one card) recommended from the measured"
                " peak (0: none yet).", labels=labels),
            "requested_memory_bytes": GaugeMetricFamily(
                "elasticgpu_claim_requested_memory_bytes", "Memory the claim requests, bytes.", labels=labels),
            "used_memory_bytes": GaugeMetricFamily(
                "elasticgpu_claim_used_memory_bytes", "Memory the claim used at its last measurement, bytes.",
                labels=labels),
            "recommended_memory_bytes": GaugeMetricFamily(
                "elasticgpu_claim_recommended_memory_bytes", "Memory recommended from the measured peak, bytes"
                " (0: none yet).", labels=labels),
        }
        total_labels = ["namespace", "class"]
        totals = {
            "requested_cores": GaugeMetricFamily(
                "elasticgpu_namespace_recommendable_requested_cores", "Cores the namespace's claims of the class"
                " that have a recommendation request (percent of one card, summed).", labels=total_labels),
            "recommended_cores": GaugeMetricFamily(
                "elasticgpu_namespace_recommended_cores", "Cores recommended for those claims, summed.",
                labels=total_labels),
            "requested_memory_bytes": GaugeMetricFamily(
                "elasticgpu_namespace_recommendable_requested_memory_bytes", "Memory those claims request, bytes.",
                labels=total_labels),
            "recommended_memory_bytes": GaugeMetricFamily(
                "elasticgpu_namespace_recommended_memory_bytes", "Memory recommended for those claims, bytes.",
                labels=total_labels),
        }
        opted = self._per_claim()
        sums: dict[tuple[str, str], list[int]] = {}
        for entry in self._sizes():
            if entry.recommended_cores or entry.recommended_memory:
                row = sums.setdefault((entry.namespace, entry.class_name), [0, 0, 0, 0])
                row[0] += entry.requested_cores
                row[1] += entry.recommended_cores
                row[2] += entry.requested_memory * _MIB
                row[3] += entry.recommended_memory * _MIB
            if entry.class_name not in opted:
                continue
            at = [entry.namespace, entry.name]
            families["requested_cores"].add_metric(at, entry.requested_cores)
            families["used_cores"].add_metric(at, entry.used_cores)
            families["recommended_cores"].add_metric(at, entry.recommended_cores)
            families["requested_memory_bytes"].add_metric(at, entry.requested_memory * _MIB)
            families["used_memory_bytes"].add_metric(at, entry.used_memory * _MIB)
            families["recommended_memory_bytes"].add_metric(at, entry.recommended_memory * _MIB)
        for key, row in sorted(sums.items()):
            for family, value in zip(totals.values(), row, strict=True):
                family.add_metric(list(key), value)
        yield from families.values()
        yield from totals.values()


ACCOUNTING_LINGER_S = 600.0
"""Seconds an ElasticGPU's final accrued value stays exported after its deletion: many scrapes see
it, so the time between the last scrape and its release is not lost to Prometheus."""

ElasticGPUsChanged = Callable[[Mapping[str, str | None]], Iterable[tuple[str, str | None, accounting.Charge | None]]]
"""`Picture.elastic_gpus_changed`: (name, resourceVersion, charge) of each, charge None where
the mapping passed has that name at that version (`accounting.Charge`, read at take-in)."""


Labels = tuple[str, str, str, str]
"""namespace, claim, class, elasticgpu."""


def _accounting_labels(egpu: ElasticGPU) -> Labels:
    ref = egpu.spec.claim_ref
    return (ref.namespace or "" if ref is not None else "", ref.name or "" if ref is not None else "",
            egpu.spec.elastic_gpu_class_name or "", egpu.metadata.name or "")


Triple = accounting.Triple


class _Tracked:
    """One ElasticGPU as the accounting collector last read it."""

    __slots__ = ("base", "charge", "first", "key", "last", "version")

    def __init__(self, version: str | None, charge: accounting.Charge, tenure: int) -> None:
        self.first = charge
        """The version first tracked: its labels stay those of this one."""
        self.key = (charge.namespace, charge.class_name)
        self.version = version
        self.charge = charge
        self.base = charge.at_second(tenure)
        """Its value when this process began to lead (0 for one bound since): the namespace
        totals count only what accrued during this tenure."""
        self.last = self.base
        """Its value at the last scrape (folded into the closed totals if it vanishes unseen)."""

    @property
    def labels(self) -> Labels:
        return self.first.labels

    def read(self, version: str | None, charge: accounting.Charge) -> None:
        """A newer version."""
        self.version = version
        self.charge = charge


def _accrued(value: Triple) -> accounting.Accrued:
    return accounting.Accrued(*value)


def _minus(a: accounting.Accrued, b: accounting.Accrued) -> accounting.Accrued:
    """`a - b`, never below 0 per unit (a total must never go down)."""
    return accounting.Accrued(max(0, a.core_seconds - b.core_seconds),
                              max(0, a.memory_mib_seconds - b.memory_mib_seconds),
                              max(0, a.card_seconds - b.card_seconds))


class _AccountingCollector(Collector):
    """What the ElasticGPUs reserved (issue 38, `api.accounting`), exported only while this
    process leads, so that a plain `sum(increase(...))` over the replicas counts each once:

    - always, per namespace and class (issue 49): what accrued since this process began to lead,
      a counter that starts at 0 with each tenure (Prometheus reads that as a reset); a few
      series per namespace, however many claims;
    - per ElasticGPU, for the classes that opt in (`per_claim()`), its absolute value from its
      own status: the same whichever replica computes it, before or after a restart.

    Each ElasticGPU's status is parsed once per resourceVersion, when the picture takes that
    version in (`accounting.Charge`): a scrape of 50,000, the first after a start or a leader
    change included, costs a multiplication each, no body parsed and no model built."""

    def __init__(self, elastic_gpus: ElasticGPUsChanged, leading: Callable[[], bool],
                 clock: Callable[[], float], per_claim: Callable[[], set[str]]) -> None:
        self._elastic_gpus = elastic_gpus
        self._leading = leading
        self._clock = clock
        self._per_claim = per_claim
        self._lock = threading.Lock()
        self._gone: dict[str, tuple[Labels, accounting.Accrued, float]] = {}
        """Deleted ElasticGPUs of opted-in classes: labels, final value, until when to export it."""
        self._since: float | None = None
        """When this tenure began (`clock`), None while not leading."""
        self._tracked: dict[str, _Tracked] = {}
        self._closed: dict[tuple[str, str], accounting.Accrued] = {}
        """What ElasticGPUs gone during this tenure accrued in it, by (namespace, class)."""
        self._ended: set[str] = set()
        """ElasticGPUs whose end `gone` counted, while a listing taken before may still hold them."""

    def lead(self, leading: bool) -> None:
        """A tenure begins (the totals start at 0) or ends (nothing is exported)."""
        with self._lock:
            if leading and self._since is None:
                self._since = self._clock()
            elif not leading:
                self._since = None
                self._tracked.clear()
                self._closed.clear()
                self._ended.clear()

    def _close(self, labels: Labels, value: accounting.Accrued, base: accounting.Accrued) -> None:
        key = (labels[0], labels[2])
        self._closed[key] = self._closed.get(key, accounting.Accrued()) + _minus(value, base)

    def gone(self, body: Mapping[str, Any]) -> None:
        """The watch's last body of a deleted ElasticGPU: its final value goes into the totals,
        and, for an opted-in class, stays exported `ACCOUNTING_LINGER_S`."""
        if not body.get("status"):
            return  # a relist's head without status: nothing to compute from
        try:
            egpu = ElasticGPU.model_validate(body)
        except ValueError:
            return
        now = self._clock()
        final = accounting.accrued(body, now=now)
        name = egpu.metadata.name or ""
        labels = _accounting_labels(egpu)
        opted = labels[2] in self._per_claim()  # before our lock: the picture's is never taken inside it
        with self._lock:
            tracked = self._tracked.pop(name, None)
            if self._since is not None and labels[1]:
                base = _accrued(tracked.base) if tracked is not None else accounting.period_of(body).at(self._since)
                self._close(labels, final, base)
                self._ended.add(name)
            if opted:
                self._gone[name] = (labels, final, now + ACCOUNTING_LINGER_S)

    def _read(self, listed: Iterable[tuple[str, str | None, accounting.Charge | None]], now: float, opted: set[str]
              ) -> tuple[dict[tuple[str, str], list[int]], dict[str, tuple[Labels, Triple]]]:
        """Bring `_tracked` up to date from `listed`: the totals by (namespace, class), and the
        labels and value of each claimed ElasticGPU of an `opted` class."""
        tenure = accounting.now_seconds(self._since if self._since is not None else now)
        second = accounting.now_seconds(now)
        totals: dict[tuple[str, str], list[int]] = {}
        rows: dict[str, tuple[Labels, Triple]] = {}
        seen: set[str] = set()
        ended, tracked_by_name = self._ended, self._tracked
        for name, version, held in listed:
            seen.add(name)
            if name in ended:
                continue
            tracked = tracked_by_name.get(name)
            if held is not None:
                if not held.charged:
                    continue
                if tracked is None:
                    tracked = tracked_by_name[name] = _Tracked(version, held, tenure)
                else:
                    tracked.read(version, held)
            if tracked is None:
                continue
            last = tracked.last = tracked.charge.at_second(second)
            base = tracked.base
            total = totals.get(tracked.key)
            if total is None:
                total = totals[tracked.key] = [0, 0, 0]
            # Never below 0 per unit: a total must never go down.
            total[0] += max(0, last[0] - base[0])
            total[1] += max(0, last[1] - base[1])
            total[2] += max(0, last[2] - base[2])
            if tracked.first.class_name in opted:
                rows[name] = (tracked.labels, last)
        for name in set(tracked_by_name) - seen:
            # Gone without its last body (a relist missed the delete): keep what it had accrued.
            vanished = tracked_by_name.pop(name)
            self._close(vanished.labels, _accrued(vanished.last), _accrued(vanished.base))
        ended &= seen
        # The closed part last: it includes those that vanished just now (no dip in between).
        for key, value in self._closed.items():
            total = totals.setdefault(key, [0, 0, 0])
            total[0] += value.core_seconds
            total[1] += value.memory_mib_seconds
            total[2] += value.card_seconds
        return totals, rows

    def collect(self) -> Iterator[Metric]:
        accounting_labels = ["namespace", "claim", "class", "elasticgpu"]
        cores = CounterMetricFamily(
            "elasticgpu_reserved_core_seconds", "Card-core seconds the ElasticGPU reserved for its claim while Bound"
            " (100 = one card for one second), since its first bind.", labels=accounting_labels)
        memory = CounterMetricFamily(
            "elasticgpu_reserved_memory_byte_seconds", "GPU memory the ElasticGPU reserved for its claim while Bound,"
            " in byte-seconds, since its first bind.", labels=accounting_labels)
        cards = CounterMetricFamily(
            "elasticgpu_reserved_card_seconds", "Whole-card seconds the ElasticGPU reserved for its claim while Bound"
            " (slices count 0 here, their cores count above), since its first bind.", labels=accounting_labels)
        total_labels = ["namespace", "class"]
        total_cores = CounterMetricFamily(
            "elasticgpu_namespace_reserved_core_seconds", "Card-core seconds the namespace's ElasticGPUs of the class"
            " reserved while Bound (100 = one card for one second), since this replica began to lead.",
            labels=total_labels)
        total_memory = CounterMetricFamily(
            "elasticgpu_namespace_reserved_memory_byte_seconds", "GPU memory byte-seconds the namespace's"
            " ElasticGPUs of the class reserved while Bound, since this replica began to lead.", labels=total_labels)
        total_cards = CounterMetricFamily(
            "elasticgpu_namespace_reserved_card_seconds", "Whole-card seconds the namespace's ElasticGPUs of the"
            " class reserved while Bound, since this replica began to lead.", labels=total_labels)
        if self._leading():
            now = self._clock()
            opted = self._per_claim()
            with self._lock:
                if self._since is None:
                    self._since = now
                known = {name: t.version for name, t in self._tracked.items()}
            # Outside our lock: the listing takes the picture's, and `gone` is called under it.
            listed = list(self._elastic_gpus(known))
            with self._lock:
                rows: dict[str, tuple[Labels, Triple]] = {}
                for name, (at, final, until) in list(self._gone.items()):
                    if until < now:
                        del self._gone[name]
                    else:
                        rows[name] = (at, (final.core_seconds, final.memory_mib_seconds, final.card_seconds))
                totals, live = self._read(listed, now, opted)
                rows.update(live)
            for _, (at, value) in sorted(rows.items()):
                cores.add_metric(list(at), value[0])
                memory.add_metric(list(at), value[1] * accounting.MIB)
                cards.add_metric(list(at), value[2])
            for (namespace, class_name), total in sorted(totals.items()):
                total_cores.add_metric([namespace, class_name], total[0])
                total_memory.add_metric([namespace, class_name], total[1] * accounting.MIB)
                total_cards.add_metric([namespace, class_name], total[2])
        yield from (cores, memory, cards, total_cores, total_memory, total_cards)


class _WhileLeading(Collector):
    """`collector`'s series only while this process leads. A standby keeps a warm picture (it
    lists and watches before it leads), so without this it would export the leader's claims,
    free capacity and sizes a second time, and `sum()` over the replicas would count them twice."""

    def __init__(self, collector: Collector, leading: Callable[[], bool]) -> None:
        self._collector = collector
        self._leading = leading

    def collect(self) -> Iterator[Metric]:
        if self._leading():
            yield from self._collector.collect()


class ControllerMetrics:
    """Every metric of one controller, registered in `registry` (a fresh one by default)."""

    def __init__(self, registry: CollectorRegistry | None = None, *, process: bool = True) -> None:
        """`process`: also export CPU and memory of this process (`process_*`, Linux only)."""
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        if process:
            ProcessCollector(registry=self.registry)
        self.binds = Counter("elasticgpu_claims_bound", "Claims bound to an ElasticGPU.", ["mode"],
                             registry=self.registry)
        self.provisions = Counter("elasticgpu_elasticgpus_provisioned", "ElasticGPUs created for a claim.",
                                  registry=self.registry)
        self.releases = Counter("elasticgpu_elasticgpus_released",
                                "ElasticGPUs released after their claim was deleted.", registry=self.registry)
        self.preemptions = Counter("elasticgpu_claims_preempted",
                                   "Claims preempted for a claim of higher priority (their ElasticGPU failed,"
                                   " reason Preempted).", registry=self.registry)
        self.conflicts = Counter("elasticgpu_conflicts",
                                 "Writes refused with 409 Conflict (a stale resourceVersion or a name taken).",
                                 ["resource"], registry=self.registry)
        self.api_errors = Counter("elasticgpu_api_errors",
                                  'Failed API calls by HTTP status ("none": no answer, the connection failed).',
                                  ["code", "verb"], registry=self.registry)
        self.queue_depth = Gauge("elasticgpu_work_queue_depth", "Keys waiting in the work queue.",
                                 registry=self.registry)
        self.sync_seconds = Histogram("elasticgpu_sync_duration_seconds", "Seconds one sync of one key took.",
                                      ["kind", "outcome"], buckets=SYNC_BUCKETS, registry=self.registry)
        self.leader = Gauge("elasticgpu_leader", "1 while this process holds the leader Lease, else 0.",
                            registry=self.registry)
        self._leads = False
        self._told = False
        """Whether `leading` was ever called: a metrics object of a test or a bench that nobody
        elects exports the picture's series as a single replica would."""
        self._accounting: _AccountingCollector | None = None
        self.bind_seconds = Histogram("elasticgpu_claim_bind_duration_seconds",
                                      "Seconds from a claim's creation to its bind.", ["mode"],
                                      buckets=WAIT_BUCKETS, registry=self.registry)
        for mode in ("dynamic", "static"):
            # Series that exist from the start at 0: Prometheus's rate() cannot see the first
            # event of a series that appears with it (the demo's binds all came first).
            self.binds.labels(mode=mode)
            self.bind_seconds.labels(mode=mode)
        self.gate_seconds = Histogram("elasticgpu_pod_gate_lift_duration_seconds",
                                      "Seconds from a pod's creation to the lift of its scheduling gate.",
                                      buckets=WAIT_BUCKETS, registry=self.registry)

    def bound(self, *, mode: str, waited_s: float | None = None) -> None:
        """One claim bound; `mode` "dynamic" (provisioned for it) or "static" (an existing one);
        `waited_s`: seconds from the claim's creation to its bind (None: unknown)."""
        self.binds.labels(mode=mode).inc()
        if waited_s is not None:
            self.bind_seconds.labels(mode=mode).observe(waited_s)

    def gate_lifted(self, *, waited_s: float) -> None:
        """One pod's scheduling gate lifted, `waited_s` seconds after the pod was created."""
        self.gate_seconds.observe(waited_s)

    def provisioned(self) -> None:
        """One ElasticGPU created for a claim."""
        self.provisions.inc()

    def released(self) -> None:
        """One ElasticGPU released (its claim is gone)."""
        self.releases.inc()

    def preempted(self) -> None:
        """One claim preempted (docs/preemption.md)."""
        self.preemptions.inc()

    def conflict(self, *, resource: str) -> None:
        """One 409 on a write to `resource` (plural, e.g. "gpus")."""
        self.conflicts.labels(resource=resource).inc()

    def api_error(self, *, code: int | None, verb: str) -> None:
        """One failed API call: `code` the HTTP status, None when no answer came; `verb` as in
        RBAC (get, list, watch, create, update, patch, delete)."""
        self.api_errors.labels(code="none" if code is None else str(code), verb=verb).inc()

    def observe_sync(self, *, kind: str, seconds: float, outcome: str = "ok") -> None:
        """One sync of a key of `kind` ("claim", "elasticgpu", ...) that took `seconds`;
        `outcome` "ok", "requeued" or "error"."""
        self.sync_seconds.labels(kind=kind, outcome=outcome).observe(seconds)

    def watch_queue(self, depth: Callable[[], float]) -> None:
        """Read the queue depth from `depth()` at each scrape (no bookkeeping on the hot path)."""
        self.queue_depth.set_function(depth)

    def leading(self, is_leader: bool) -> None:
        """Record whether this process holds the leader Lease."""
        self.leader.set(1 if is_leader else 0)
        self._leads = is_leader
        self._told = True
        if self._accounting is not None:
            self._accounting.lead(is_leader)

    def _exports_picture(self) -> bool:
        return self._leads or not self._told

    def watch_accounting(self, elastic_gpus: ElasticGPUsChanged, *, per_claim: Callable[[], set[str]],
                         clock: Callable[[], float] = time.time) -> Callable[[Mapping[str, Any]], None]:
        """Export what the ElasticGPUs of `elastic_gpus` reserved, at each scrape while this
        process leads: totals per namespace and class always, per ElasticGPU for the classes
        named by `per_claim()`; the function returned takes the last body of a deleted one."""
        collector = _AccountingCollector(elastic_gpus, lambda: self._leads, clock, per_claim)
        collector.lead(self._leads)
        self._accounting = collector
        self.registry.register(collector)
        return collector.gone

    def watch_picture(self, *, claims: Callable[[], Mapping[tuple[str, str], int]],
                      free: Callable[[], Mapping[str, FreeCapacity]],
                      waiting: Callable[[], Sequence[tuple[str, str, str | None]]] | None = None) -> None:
        """Read claims by (phase, class) from `claims()`, free capacity by class from `free()` and
        the waiting claims' (class, reason, creationTimestamp) from `waiting()` at each scrape
        (nothing on the hot path)."""
        self.registry.register(_WhileLeading(_PictureCollector(claims, free, waiting), self._exports_picture))

    def watch_quotas(self, fill: Callable[[], Sequence[tuple[str, str, str, int, int]]]) -> None:
        """Read each quota's (namespace, quota, key, used, hard) from `fill()` at each scrape."""
        self.registry.register(_WhileLeading(_QuotaCollector(fill), self._exports_picture))

    def watch_claim_sizes(self, sizes: Callable[[], Sequence[ClaimSizes]], *,
                          per_claim: Callable[[], set[str]]) -> None:
        """Read each claim's requested, used and recommended size from `sizes()` at each scrape;
        per claim for the classes named by `per_claim()`, per namespace and class always."""
        self.registry.register(_WhileLeading(_ClaimSizesCollector(sizes, per_claim), self._exports_picture))
