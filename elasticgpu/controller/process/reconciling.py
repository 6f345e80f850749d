"""The controller assembled: one object that wires the roles together.

    informer ──observe──▶ picture ──keys──▶ workqueue ──▶ worker ──▶ claim_sync / elasticgpu_sync
                                                              │              │
                                                              └──▶ commit ◀──┘ ──▶ handoff (pool)
    repair (periodic resync) ──▶ informer.relist, workqueue, commit

`Picture` holds what the watches delivered and returns the keys a change wakes; `WorkQueue`
orders them; `Worker` takes batches and dispatches each key to `ClaimSync` or
`ElasticGPUSync`, which ask the pure deciders (`binder`, `release`) for the next step and carry
it out through `KubeApi`; `Commit` writes and frees reservations (the commit point);
`HandOff` runs the writes after a commit point on a pool; `Repair` is the periodic resync.
Every write's answer goes back into the picture at once, so the next decision sees it. Two
controller processes are kept apart by the server (resourceVersion preconditions,
uid-derived names). Every failure path leaves the objects as they were after the last
successful write: nothing half-written is assumed, and the key is requeued so the next sync
retries from what it finds.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from elasticgpu.api import ElasticGPUClaim, dra_names
from elasticgpu.api.gpu import effective_owner
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.binding.commit import Commit
from elasticgpu.controller.flow.binding.elasticgpu_sync import ElasticGPUSync
from elasticgpu.controller.flow.claim_sync import ClaimSync
from elasticgpu.controller.flow.gpu_sync import GPUSync
from elasticgpu.controller.flow.machinery.events import EventRecorder
from elasticgpu.controller.flow.machinery.failures import Failures
from elasticgpu.controller.flow.machinery.handoff import HandOff
from elasticgpu.controller.flow.machinery.informer import Informer
from elasticgpu.controller.flow.machinery.liveness import Liveness
from elasticgpu.controller.flow.machinery.resource_claim_feed import ResourceClaimFeed
from elasticgpu.controller.flow.machinery.workqueue import Key, WorkQueue
from elasticgpu.controller.flow.node_autoscaling import NodeAutoscaling
from elasticgpu.controller.flow.quota_guard import QuotaGuard
from elasticgpu.controller.flow.repair import Repair
from elasticgpu.controller.metrics import ControllerMetrics
from elasticgpu.controller.picture.picture import Body, Picture
from elasticgpu.controller.picture.reservations import Ledger
from elasticgpu.controller.pods.pod_sync import PodSync
from elasticgpu.controller.process.worker import Worker
from elasticgpu.controller.settings import ControllerSettings


class Controller:
    """The roles wired together. Feed it with `observe`, start it with `rebuild`, run it with
    `run_worker` (or call `sync` / `drain` directly, as the tests do)."""

    def __init__(self, kube: KubeApi, settings: ControllerSettings | None = None, *,
                 namespace: str | None = None) -> None:
        self.kube = kube
        self.settings = settings or ControllerSettings()
        self.namespace = namespace
        self.picture = Picture()
        self.queue = WorkQueue(self.settings.retry)
        self.failures = Failures(self.queue)
        self.liveness = Liveness(stuck_after_s=self.settings.watch.stuck_after_s)
        """`alive()` / `reason()`: the check a `/healthz` endpoint runs (threads, loops)."""
        binding = self.settings.binding
        # With workers, Events leave the hot path too (a background writer); workers=0 keeps
        # every write inline on the worker thread (the simplest behaviour, and the benchmark's "before").
        self.events = EventRecorder(kube, background=binding.workers > 0)
        self.hand_off = HandOff(queue=self.queue, failures=self.failures, settings=binding)
        # The batch's GPU writes get their own threads: they must not wait behind finishing binds.
        self._commit_pool = (ThreadPoolExecutor(binding.workers, thread_name_prefix="commit")
                             if binding.workers > 0 else None)
        self.commit = Commit(kube=kube, picture=self.picture, queue=self.queue, settings=self.settings,
                             pool=self._commit_pool)
        self.quota = QuotaGuard(kube=kube, picture=self.picture, settings=self.settings)
        self.commit.quota = self.quota
        self.elastic_gpus = ElasticGPUSync(kube=kube, picture=self.picture, queue=self.queue, events=self.events,
                                           commit=self.commit, settings=self.settings.gpu_health)
        self.claims = ClaimSync(kube=kube, picture=self.picture, queue=self.queue, events=self.events,
                                commit=self.commit, elastic_gpus=self.elastic_gpus, hand_off=self.hand_off,
                                settings=self.settings)
        self.pods = PodSync(kube=kube, picture=self.picture, queue=self.queue, events=self.events,
                            commit=self.commit, binding=self.claims.binding)
        # Which cards ResourceClaims hold: a card moves back from DRA only once none does (docs/dra.md).
        self.resource_claims = ResourceClaimFeed(kube=kube, on_cards=self._dra_cards_changed, liveness=self.liveness)
        self.gpus = GPUSync(kube=kube, picture=self.picture, queue=self.queue, events=self.events,
                            settings=self.settings.gpu_health, dra=self.resource_claims.holders,
                            owner_settings=self.settings.owner_move)
        self.worker = Worker(queue=self.queue, claims=self.claims, elastic_gpus=self.elastic_gpus,
                             commit=self.commit, hand_off=self.hand_off, events=self.events, failures=self.failures,
                             liveness=self.liveness, settings=binding, pods=self.pods, gpus=self.gpus)
        self.informer = Informer(kube=kube, picture=self.picture, queue=self.queue, namespace=namespace,
                                 liveness=self.liveness, events=self.events)
        self.informer.on_claim = self.claims.recommender.observe
        if self.events.thread is not None:
            self.liveness.track(self.events.thread)
        self.node_autoscaling = NodeAutoscaling(kube=kube, picture=self.picture, events=self.events,
                                                settings=self.settings.autoscale)
        self.repair = Repair(kube=kube, picture=self.picture, queue=self.queue, informer=self.informer,
                             commit=self.commit, settings=self.settings.resync,
                             gpu_health=self.settings.gpu_health)

    def attach_metrics(self, metrics: ControllerMetrics) -> None:
        """Count binds, provisions, releases, conflicts, API errors and sync latency into `metrics`;
        claims by phase and free capacity by class are read from the picture at each scrape."""
        self.kube.metrics = metrics
        self.claims.metrics = metrics
        self.elastic_gpus.metrics = metrics
        self.worker.metrics = metrics
        self.pods.metrics = metrics
        metrics.watch_picture(claims=self.picture.claim_counts, free=self.picture.free_by_class,
                              waiting=self.picture.waiting_claims)
        metrics.watch_claim_sizes(self.claims.recommender.sizes, per_claim=self.picture.per_claim_metric_classes)
        self.picture.on_egpu_gone = metrics.watch_accounting(self.picture.elastic_gpus_changed,
                                                             per_claim=self.picture.per_claim_metric_classes)
        metrics.watch_quotas(self.quota.fill)

    def _dra_cards_changed(self, cards: set[tuple[str, int]] | None) -> None:
        """Queue the GPUs moving between owners whose DRA holders changed (None: every such GPU)."""
        with self.picture.lock:
            ledger = self.picture.ledger
            keys: list[Key] = []
            for name in ledger.owner_moving_gpu_names():  # the others' models are not built
                gpu = ledger.gpu(name)
                if gpu is None or gpu.spec.owner == effective_owner(gpu):
                    continue  # no move under way: what DRA holds changes nothing for it
                if cards is None or (dra_names.pool_name(gpu.spec.node_name), gpu.spec.index) in cards:
                    keys.append(("gpu", name))
        self.queue.add_all(keys)

    @property
    def ledger(self) -> Ledger:
        """The GPU ledger of the picture."""
        return self.picture.ledger

    def observe(self, kind: str, event_type: str | None, body: Body) -> None:
        """Take in one watch event (`kind` in claim, egpu, gpu, class, pod, node, namespace)."""
        self.informer.observe(kind, event_type, body)

    def rebuild(self, *, background: bool = False, start: bool = False) -> dict[str, str]:
        """List everything, merge it into the picture, queue every object (`Informer.relist`;
        `start`: the process's first list, every key behind the events' keys); the
        resourceVersion each kind was listed at."""
        return self.informer.relist(background=background, start=start)

    def resync(self, *, relist: bool = True) -> None:
        """One periodic repair (`Repair.resync`)."""
        self.repair.resync(relist=relist)

    def run_worker(self, stop: threading.Event) -> None:
        """Process the queue until `stop` is set."""
        self.worker.run(stop)

    def sync(self, key: Key) -> None:
        """Sync one key now."""
        self.worker.sync(key)

    def sync_claim(self, namespace: str, name: str) -> None:
        """Sync one claim now, without the worker's retries (the benchmark times decisions)."""
        self.claims.sync(namespace, name)

    def drain(self, *, max_items: int = 100_000) -> int:
        """Process queued keys until none is left; returns how many (`Worker.drain`)."""
        return self.worker.drain(max_items=max_items)

    def claim(self, namespace: str, name: str) -> ElasticGPUClaim | None:
        """The claim as the picture holds it."""
        return self.picture.claim(namespace, name)

    def close(self) -> None:
        """Wait for the pools and the Event writer (bounded by their calls' timeouts)."""
        if self._commit_pool is not None:
            self._commit_pool.shutdown(wait=True)
        self.hand_off.close()
        self.events.close()
