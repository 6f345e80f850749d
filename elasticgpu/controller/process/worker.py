"""The worker loop: take keys off the work queue in batches and sync each one.

Decisions and reservations run on this one thread, so the picture never races itself; the
writes after a commit point run on the hand-off pool. In a batch, the claims that provision a
slice of one card are planned together and committed with one GPU write per card.

The loop never dies and never spins: every exception of a sync goes to `Failures` (logged once,
retried with backoff), a success resets the key's backoff, and each pass is a step of the
`binder` loop for the liveness check.
"""

from __future__ import annotations

import logging
import threading
import time

from elasticgpu.controller.edge.requesting import writes_on_this_thread
from elasticgpu.controller.flow.binding.commit import Commit, Planned
from elasticgpu.controller.flow.binding.elasticgpu_sync import ElasticGPUSync
from elasticgpu.controller.flow.claim_sync import ClaimSync
from elasticgpu.controller.flow.gpu_sync import GPUSync
from elasticgpu.controller.flow.machinery.early_gate import EarlyGate
from elasticgpu.controller.flow.machinery.events import EventRecorder
from elasticgpu.controller.flow.machinery.failures import Failures
from elasticgpu.controller.flow.machinery.handoff import HandOff
from elasticgpu.controller.flow.machinery.liveness import Liveness
from elasticgpu.controller.flow.machinery.workqueue import Key, WorkQueue
from elasticgpu.controller.metrics import ControllerMetrics
from elasticgpu.controller.pods.pod_sync import PodSync
from elasticgpu.controller.settings import BindingSettings

logger = logging.getLogger(__name__)

LOOP = "binder"
"""The worker loop's name for the liveness check (and its thread's name)."""


class Worker:
    """Syncs the keys of the queue (see the module docstring)."""

    def __init__(self, *, queue: WorkQueue, claims: ClaimSync, elastic_gpus: ElasticGPUSync, commit: Commit,
                 hand_off: HandOff, events: EventRecorder, failures: Failures, liveness: Liveness,
                 settings: BindingSettings, pods: PodSync | None = None, gpus: GPUSync | None = None) -> None:
        self.queue = queue
        self.pods = pods
        self.gpus = gpus
        self.failures = failures
        self.metrics: ControllerMetrics | None = None
        """Times every sync when set (`Operability` sets it)."""
        self.liveness = liveness
        self.claims = claims
        self.elastic_gpus = elastic_gpus
        self.commit = commit
        self.hand_off = hand_off
        self.events = events
        self.settings = settings
        self.gate: EarlyGate | None = None
        """Set by a fresh start while its picture is partial: only the keys it admits are synced
        (`early_gate.py`); None (and once open): every key."""

    def run(self, stop: threading.Event) -> None:
        """Process the queue until `stop` is set."""
        self.liveness.expect(LOOP)
        while not stop.is_set():
            self.liveness.step(LOOP)
            keys = self._take_batch(timeout_s=0.2)
            if not keys:
                continue
            try:
                self.sync_many(keys)
            except Exception as err:  # a bug outside one key's sync: retry the batch, keep the loop
                for key in keys:
                    self.failures.failed(key, err)

    def _take_batch(self, *, timeout_s: float) -> list[Key]:
        """The next key and, with the pool, whatever else is queued now, up to the batch size."""
        if not self.hand_off.enabled:
            keys = self.queue.take(limit=1, background_limit=1, timeout_s=timeout_s)
        else:
            keys = self.queue.take(limit=self.settings.batch_size,
                                   background_limit=self.settings.background_batch_size, timeout_s=timeout_s)
        return keys if self.gate is None or not keys else self.gate.admit(keys)

    def drain(self, *, max_items: int = 100_000) -> int:
        """Process queued keys until none is left (delayed ones included once due); returns how many."""
        done = 0
        while done < max_items:
            keys = self._take_batch(timeout_s=0.0)
            if not keys:
                if not self.hand_off.busy() and self.events.idle():
                    return done
                time.sleep(0.005)  # a pool thread is finishing a bind (each of its calls has a timeout)
                continue
            self.sync_many(keys)
            done += len(keys)
        return done

    def sync_many(self, keys: list[Key]) -> None:
        """Sync several keys. With the pool, the claims that provision a slice of one card are
        planned together and their reservations committed with one GPU status write per card;
        every other key is an ordinary `sync`, in order."""
        if not self.hand_off.enabled or len(keys) == 1:
            for key in keys:
                self.sync(key)
            return
        # The waiting claims of the batch in bind order (the class's bindOrder), even those queued
        # before the last wake: the first planned gets the room.
        keys = self.claims.picture.in_bind_order(keys)
        batch: dict[str, list[Planned]] = {}
        seen: set[Key] = set()
        for key in keys:
            if key in seen:
                continue
            seen.add(key)
            planned = None
            if key[0] == "claim" and not self.hand_off.in_flight(key):
                try:
                    planned = self.commit.plan_slice(key)
                except Exception as err:  # nothing was reserved: the key retries on its own
                    self.failures.failed(key, err)
                    continue
            if planned is None:
                self.sync(key)
                continue
            batch.setdefault(self.commit.card_of(planned), []).append(planned)
        if batch:
            for planned in self.commit.commit_batch(batch):
                claim_key = ("claim", planned.claim.metadata.namespace or "", planned.claim.metadata.name or "")
                try:
                    self.claims.binding.after_commit(planned.claim, planned.decision, planned.egpu_name,
                                                     planned.placement)
                except Exception as err:  # committed: the claim's next sync finds its reservation held
                    self.failures.failed(claim_key, err)

    def sync(self, key: Key) -> None:
        """Sync one object. Any failure retries it with backoff (`Failures`; nothing half-written
        is assumed: the next sync decides from what it finds); a success resets its backoff. A
        success that wrote nothing and left nothing pending settles the key: the periodic resync
        leaves it alone until something queues it again (`settled.SettledKeys`)."""
        if self.hand_off.defer(key):
            return  # synced again when its bind is done
        started = time.monotonic()
        outcome = "ok"
        settled = self.queue.settled
        settled.begin(key)
        writes = writes_on_this_thread()
        at_rest = False
        try:
            if key[0] == "claim":
                at_rest = self.claims.sync(key[1], key[2])
            elif key[0] == "egpu":
                at_rest = self.elastic_gpus.sync(key[1])
            elif key[0] == "pod" and self.pods is not None:
                at_rest = self.pods.sync(key[1], key[2])
            elif key[0] == "gpu" and self.gpus is not None:
                self.gpus.sync(key[1])
                at_rest = True  # a GPU's readiness changes with time alone: gpu_sync sets its own timer
        except Exception as err:
            outcome = "error"
            self.failures.failed(key, err)
        else:
            self.failures.succeeded(key)
        finally:
            settled.end(key, settled=at_rest and outcome == "ok" and writes_on_this_thread() == writes
                        and not self.hand_off.in_flight(key))
            if self.metrics is not None:
                self.metrics.observe_sync(kind=key[0], seconds=time.monotonic() - started, outcome=outcome)
