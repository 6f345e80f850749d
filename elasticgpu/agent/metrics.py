"""The agent's Prometheus endpoint: read at scrape time from what the loops already hold.

Nothing is updated per sample: a scrape walks inventory's cards and GPU objects, the usage loop's
last pass, the XID counts and the write counters, so metrics cost nothing between scrapes.
Base units (bytes, ratios 0..1); every metric is listed in docs/metrics.md (a test checks it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from elasticgpu.agent.health import HealthTracker
from elasticgpu.agent.inventory import Inventory
from elasticgpu.agent.kube import AgentKube
from elasticgpu.agent.ledger.store import LedgerStore
from elasticgpu.agent.usage import UsageLoop
from elasticgpu.api import names

logger = logging.getLogger(__name__)

MIB = 1024 * 1024
PREFIX = "elasticgpu_agent_"


@dataclass
class Sources:
    """What the collector reads."""

    inventory: Inventory
    usage: UsageLoop
    health: HealthTracker
    ledger: LedgerStore
    kube: AgentKube


def _allocated(obj: dict[str, Any]) -> tuple[int, int]:
    cores = memory = 0
    for allocation in (obj.get("status") or {}).get("allocations") or []:
        cores += int(allocation.get("cores") or 0)
        memory += int(allocation.get("memory") or 0)
    return cores, memory


class AgentCollector(Collector):
    """Builds every metric family at scrape time."""

    def __init__(self, sources: Sources | Callable[[], Sources | None]) -> None:
        self._sources = sources

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """The metric families, with the values of now (none while the agent's parts are not open)."""
        s = self._sources() if callable(self._sources) else self._sources
        if s is None:
            return
        node = s.kube.node_name  # one agent per node: a node label joins the card to its Node
        card_labels = ["node", "gpu", "index", "model"]
        total = GaugeMetricFamily(PREFIX + "gpu_memory_total_bytes", "Memory of the card.", labels=card_labels)
        used = GaugeMetricFamily(PREFIX + "gpu_memory_used_bytes", "Memory in use by the card's processes.",
                                 labels=["node", "gpu"])
        utilisation = GaugeMetricFamily(PREFIX + "gpu_utilization_ratio",
                                        "Share of the card's SM time its processes used (0..1).",
                                        labels=["node", "gpu"])
        cores = GaugeMetricFamily(PREFIX + "gpu_allocated_cores_ratio",
                                  "Share of the card's compute reserved by claims (0..1).", labels=["node", "gpu"])
        memory = GaugeMetricFamily(PREFIX + "gpu_allocated_memory_bytes", "Memory of the card reserved by claims.",
                                   labels=["node", "gpu"])
        healthy = GaugeMetricFamily(PREFIX + "gpu_healthy",
                                    "1 when the card is healthy (no recent fatal XID, present), else 0.",
                                    labels=["node", "gpu"])
        present = {card.uuid: card for card in s.inventory.snapshot.cards}
        objects = {str((o.get("spec") or {}).get("uuid", "")): o for o in s.inventory.objects().values()}
        for uuid in sorted(set(present) | set(objects)):
            card = present.get(uuid)
            if card is not None:
                total.add_metric([node, uuid, str(card.index), card.model], card.memory_mib * MIB)
                healthy.add_metric([node, uuid], 1.0 if s.health.health(uuid).healthy else 0.0)
            else:
                healthy.add_metric([node, uuid], 0.0)  # vanished
            measured = s.usage.gpus.get(uuid)
            if measured is not None:
                used.add_metric([node, uuid], measured.memory_mib * MIB)
                utilisation.add_metric([node, uuid], measured.sm_percent / 100)
            if uuid in objects:
                reserved_cores, reserved_memory = _allocated(objects[uuid])
                cores.add_metric([node, uuid], reserved_cores / names.CORES_PER_CARD)
                memory.add_metric([node, uuid], reserved_memory * MIB)
        yield from (total, used, utilisation, cores, memory, healthy)

        xids = CounterMetricFamily(PREFIX + "gpu_xid_errors", "XID errors seen since the agent started.",
                                   labels=["node", "gpu", "xid"])
        for (uuid, xid), count in sorted(s.health.counts().items()):
            xids.add_metric([node, uuid, str(xid)], count)
        yield xids

        claim_labels = ["namespace", "claim"]
        claim_used = GaugeMetricFamily(PREFIX + "claim_memory_used_bytes", "GPU memory the claim's processes use.",
                                       labels=claim_labels)
        claim_limit = GaugeMetricFamily(PREFIX + "claim_memory_limit_bytes", "GPU memory the claim reserved.",
                                        labels=claim_labels)
        claim_sm = GaugeMetricFamily(PREFIX + "claim_sm_utilization_ratio",
                                     "SM time the claim's processes used, in cards (1 = one whole card).",
                                     labels=claim_labels)
        claim_cores = GaugeMetricFamily(PREFIX + "claim_cores_limit_ratio",
                                        "Compute the claim reserved, in cards (0.3 = 30% of one card).",
                                        labels=claim_labels)
        claim_over = GaugeMetricFamily(PREFIX + "claim_over_limit",
                                       "1 while the claim uses more memory than it reserved.", labels=claim_labels)
        for (namespace, name), claim in sorted(s.usage.claims.items()):
            claim_used.add_metric([namespace, name], claim.memory_mib * MIB)
            claim_limit.add_metric([namespace, name], claim.reserved_mib * MIB)
            claim_sm.add_metric([namespace, name], claim.sm_percent / 100)
            claim_cores.add_metric([namespace, name], claim.reserved_cores / names.CORES_PER_CARD)
            claim_over.add_metric([namespace, name], 1.0 if claim.over_limit else 0.0)
        yield from (claim_used, claim_limit, claim_sm, claim_cores, claim_over)

        # Issue 38: what each claim used, integrated over the usage loop's passes (docs/accounting.md).
        used_cores = CounterMetricFamily(PREFIX + "claim_used_core_seconds",
                                         "Card-core seconds the claim's processes used (100 = one card busy for a"
                                         " second), since the agent started.", labels=claim_labels)
        used_memory = CounterMetricFamily(PREFIX + "claim_used_memory_byte_seconds",
                                          "GPU memory the claim's processes held, in byte-seconds, since the agent"
                                          " started.", labels=claim_labels)
        for (namespace, name), totals in sorted(s.usage.used.items()):
            used_cores.add_metric([namespace, name], totals.core_seconds)
            used_memory.add_metric([namespace, name], totals.memory_byte_seconds)
        yield from (used_cores, used_memory)

        # Issue 25: containers stopped for their claim's memory, and processes on a card no claim holds.
        stops = CounterMetricFamily(PREFIX + "over_limit_stops",
                                    "Containers the agent stopped because their claim stayed over its GPU memory.",
                                    labels=claim_labels)
        policing = s.usage.policing
        for (namespace, name), count in sorted((policing.stops if policing is not None else {}).items()):
            stops.add_metric([namespace, name], count)
        yield stops
        strays = GaugeMetricFamily(PREFIX + "gpu_unattributed_processes",
                                   "Processes on the card that belong to no claim's container (never stopped).",
                                   labels=["node", "gpu"])
        stray_memory = GaugeMetricFamily(PREFIX + "gpu_unattributed_memory_bytes",
                                         "GPU memory those processes use.", labels=["node", "gpu"])
        for uuid in sorted(set(present) | set(s.usage.unattributed_by_gpu)):
            count, mib = s.usage.unattributed_by_gpu.get(uuid, (0, 0))
            strays.add_metric([node, uuid], count)
            stray_memory.add_metric([node, uuid], mib * MIB)
        yield from (strays, stray_memory)

        ledger = CounterMetricFamily(PREFIX + "ledger_writes", "Transactions committed to the ledger.")
        ledger.add_metric([], s.ledger.writes)
        yield ledger
        api = CounterMetricFamily(PREFIX + "api_writes", "Writes to the Kubernetes API, by kind of write.",
                                  labels=["write"])
        for kind, count in sorted(s.kube.writes.items()):
            api.add_metric([kind], count)
        yield api


def registry(sources: Sources | Callable[[], Sources | None]) -> CollectorRegistry:
    """A registry with the agent's collector (`sources` may be a function that returns None while
    the agent's parts are not open: no metrics then); serving.py serves it on /metrics."""
    made = CollectorRegistry(auto_describe=False)
    made.register(AgentCollector(sources))
    return made
