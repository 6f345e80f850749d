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
                                                   per Bound share claim: its request, its last
                                                   measured use, the recommendation (0: none yet)
    elasticgpu_claim_{requested,used,recommended}_memory_bytes{namespace,claim}  the same, bytes
    process_*                                      CPU, RSS, open files of this process
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["SYNC_BUCKETS", "ControllerMetrics"]

SYNC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Seconds. A sync that decides from the picture takes well under a millisecond; one that writes
waits on the API server (a few ms to 10 s, the request timeout): the buckets cover both."""


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
                 free: Callable[[], Mapping[str, FreeCapacity]]) -> None:
        self._claims = claims
        self._free = free

    def collect(self) -> Iterator[Metric]:
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


_MIB = 1024 * 1024


class _ClaimSizesCollector(Collector):
    """Per-claim gauges (issue 17: requested, used, recommended), read at each scrape. Labeled by
    namespace and claim, one series per Bound share claim of a class whose resizePolicy is not
    Off: what a platform team needs to see which claims waste or lack capacity."""

    def __init__(self, sizes: Callable[[], Sequence[ClaimSizes]]) -> None:
        self._sizes = sizes

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
        for entry in self._sizes():
            at = [entry.namespace, entry.name]
            families["requested_cores"].add_metric(at, entry.requested_cores)
            families["used_cores"].add_metric(at, entry.used_cores)
            families["recommended_cores"].add_metric(at, entry.recommended_cores)
            families["requested_memory_bytes"].add_metric(at, entry.requested_memory * _MIB)
            families["used_memory_bytes"].add_metric(at, entry.used_memory * _MIB)
            families["recommended_memory_bytes"].add_metric(at, entry.recommended_memory * _MIB)
        yield from families.values()


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

    def bound(self, *, mode: str) -> None:
        """One claim bound; `mode` "dynamic" (provisioned for it) or "static" (an existing one)."""
        self.binds.labels(mode=mode).inc()

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

    def watch_picture(self, *, claims: Callable[[], Mapping[tuple[str, str], int]],
                      free: Callable[[], Mapping[str, FreeCapacity]]) -> None:
        """Read claims by (phase, class) from `claims()` and free capacity by class from `free()`
        at each scrape (nothing on the hot path)."""
        self.registry.register(_PictureCollector(claims, free))

    def watch_claim_sizes(self, sizes: Callable[[], Sequence[ClaimSizes]]) -> None:
        """Read each claim's requested, used and recommended size from `sizes()` at each scrape."""
        self.registry.register(_ClaimSizesCollector(sizes))
