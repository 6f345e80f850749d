"""The controller's picture of the cluster and the executor of the binder's decisions.

`Controller` holds what the watches delivered (claims, ElasticGPUs, classes, pods, and GPUs in
the `Ledger`), a work queue of object keys, and one method per kind that asks the pure deciders
(`binder`, `release`, `resync`) for the next step and carries it out through `KubeApi`.
Every write's answer goes back into the picture at once, so the next decision sees it.

Decisions and reservations run on one thread (`run_worker`, in batches: `sync_many`), so the
picture never races itself; the writes after the commit point run on a worker pool, and the
keys they touch wait until they are done (`_in_flight`). The periodic resync requeues every
object on the queue's background lane, which is served only when no event-queued key waits,
in short batches. Two controller processes are kept apart by the server (resourceVersion
preconditions, uid-derived names).
Every failure path leaves the objects as they were after the last successful write: nothing
half-written is assumed, and the key is requeued so the next sync retries from what it finds.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from elasticgpu.allocator import Placement, PlacementRequest, Unplaceable
from elasticgpu.api import Condition, ElasticGPU, ElasticGPUClaim, ElasticGPUClass, names
from elasticgpu.controller import binder, errors, release, resync, versions
from elasticgpu.controller.events import NORMAL, WARNING, EventRecorder
from elasticgpu.controller.kube import KubeApi
from elasticgpu.controller.provisioner import build_elastic_gpu, capacity_of, claim_ref_of
from elasticgpu.controller.reservations import Ledger, allocation_for, now_rfc3339
from elasticgpu.controller.settings import ControllerSettings

logger = logging.getLogger(__name__)

Body = dict[str, Any]
ClaimKey = tuple[str, str]
Key = tuple[str, ...]
"""("claim", namespace, name) or ("egpu", name)."""


class WorkQueue:
    """FIFO of keys without duplicates, with delayed requeues and a background lane.

    Keys added with `background=True` (the periodic resync's requeue of every object) are served
    only when no other key waits: a resync of 50,000 Bound claims must not put a claim created
    now behind all of them. A background key added again normally moves to the front lane."""

    def __init__(self) -> None:
        self._items: deque[Key] = deque()
        self._background: deque[tuple[Key, int]] = deque()
        self._queued: set[Key] = set()
        self._background_only: dict[Key, int] = {}
        """Keys waiting in the background lane only, with the number of their entry there: an
        entry left behind by a key moved to the front lane must not stand in for a later one."""
        self._entries = 0
        self._delayed: list[tuple[float, Key]] = []
        self._cond = threading.Condition()

    def add(self, key: Key, *, delay_s: float = 0.0, background: bool = False) -> None:
        """Queue `key` now, or after `delay_s` seconds; `background`: behind every other key."""
        with self._cond:
            if delay_s > 0:
                heapq.heappush(self._delayed, (time.monotonic() + delay_s, key))
            else:
                self._push(key, background=background)
            self._cond.notify()

    def _push(self, key: Key, *, background: bool) -> None:
        if key not in self._queued:
            self._queued.add(key)
            if background:
                self._entries += 1
                self._background_only[key] = self._entries
                self._background.append((key, self._entries))
            else:
                self._items.append(key)
        elif not background and key in self._background_only:
            del self._background_only[key]  # its entry in the background lane goes stale
            self._items.append(key)

    def _pop(self, *, background: bool = True) -> tuple[Key, bool] | None:
        """The next key and whether it came from the background lane (searched only when
        `background`); None when none waits."""
        while self._items:
            key = self._items.popleft()
            if key in self._queued and key not in self._background_only:
                self._queued.discard(key)
                return key, False
        while background and self._background:
            key, entry = self._background.popleft()
            if self._background_only.get(key) == entry:
                del self._background_only[key]
                self._queued.discard(key)
                return key, True
        return None

    def _next(self, timeout_s: float) -> tuple[Key, bool] | None:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                now = time.monotonic()
                while self._delayed and self._delayed[0][0] <= now:
                    _, key = heapq.heappop(self._delayed)
                    self._push(key, background=False)
                entry = self._pop()
                if entry is not None:
                    return entry
                wait = deadline - now
                if self._delayed:
                    wait = min(wait, self._delayed[0][0] - now)
                if wait <= 0:
                    return None
                self._cond.wait(wait)

    def get(self, timeout_s: float) -> Key | None:
        """The next key, or None after `timeout_s` without one."""
        entry = self._next(timeout_s)
        return entry[0] if entry is not None else None

    def take(self, *, limit: int, background_limit: int, timeout_s: float) -> list[Key]:
        """The next key and whatever else waits now, for one batch: up to `limit` keys of the
        front lane; a batch that starts in the background lane takes at most `background_limit`
        keys (front keys that arrive meanwhile join it first), so that a key queued while the
        resync's keys are worked off waits for a short batch only. Empty after `timeout_s`."""
        entry = self._next(timeout_s)
        if entry is None:
            return []
        first, background = entry
        keys = [first]
        with self._cond:
            while len(keys) < (background_limit if background else limit):
                more = self._pop(background=background)
                if more is None:
                    break
                keys.append(more[0])
        return keys

    def __len__(self) -> int:
        with self._cond:
            return len(self._queued)

    def waiting(self) -> int:
        """Keys queued now or for later."""
        with self._cond:
            return len(self._queued) + len(self._delayed)


def _condition(type_: str, reason: str, message: str, previous: list[Condition]) -> dict[str, Any]:
    """One condition; keeps the old transition time when the type and reason did not change."""
    old = next((c for c in previous if c.type == type_), None)
    when = old.last_transition_time if old is not None and old.reason == reason else now_rfc3339()
    return {"type": type_, "status": "True", "reason": reason, "message": message, "lastTransitionTime": when}


class Controller:
    """Picture + queue + executor. Feed it with `observe`, start it with `rebuild`, run it with
    `run_worker` (or call `sync` / `drain` directly, as the tests do)."""

    def __init__(self, kube: KubeApi, settings: ControllerSettings | None = None, *,
                 namespace: str | None = None) -> None:
        self.kube = kube
        self.settings = settings or ControllerSettings()
        self.namespace = namespace
        self.ledger = Ledger()
        workers = self.settings.binding.workers
        # With workers, Events leave the hot path too (a background writer); workers=0 keeps
        # every write inline on the binder thread (the simplest behaviour, and the benchmark's "before").
        self.events = EventRecorder(kube, background=workers > 0)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="bind") if workers > 0 else None
        # The batch's GPU writes get their own threads: they must not wait behind finishing binds.
        self._commit_pool = ThreadPoolExecutor(workers, thread_name_prefix="commit") if workers > 0 else None
        self._in_flight: set[Key] = set()
        """Keys whose steps after the commit point run on a worker: their syncs wait (`_dirty`)."""
        self._dirty: set[Key] = set()
        self.queue = WorkQueue()
        self._lock = threading.RLock()
        self._claims: dict[ClaimKey, ElasticGPUClaim] = {}
        self._claim_bodies: dict[ClaimKey, Body] = {}
        self._egpus: dict[str, ElasticGPU] = {}
        self._egpu_bodies: dict[str, Body] = {}
        self._by_claim_uid: dict[str, str] = {}
        self._unclaimed_available: dict[str, ElasticGPU] = {}
        """Available ElasticGPUs without a claimRef (static bind candidates), kept by `_put_egpu`."""
        self._deleted_claims: versions.Tombstones[ClaimKey] = versions.Tombstones()
        self._deleted_egpus: versions.Tombstones[str] = versions.Tombstones()
        self._claims_naming: dict[str, set[ClaimKey]] = {}
        """Claims by the ElasticGPU their spec names; and ElasticGPUs by the GPUs their spec names:
        watch events of one object must not cost a scan of all of them."""
        self._egpus_on: dict[str, set[str]] = {}
        """ElasticGPU name by the uid in its claimRef, kept in step by `_put_egpu` / `_drop_egpu`."""
        self._classes: dict[str, ElasticGPUClass] = {}
        self._pod_claims: dict[ClaimKey, set[str]] = {}
        self._claims_of_pod: dict[tuple[str, str], set[str]] = {}
        self.ready = threading.Event()

    # -- observing -----------------------------------------------------------------------------

    def rebuild(self, *, background: bool = False) -> None:
        """List everything and merge it into the picture (on start, before anything is bound,
        and on every relist); then queue every claim and ElasticGPU (`background`: behind
        the keys that events queued).

        A listed object replaces the picture's only when it is newer, and an object missing from
        the list is dropped only when the picture's copy is older than the list: watch events
        and write answers that arrived while the list was read are never rolled back (a stale
        picture would turn the next writes into 409s)."""
        nodes = self._try(self.kube.list_nodes) or []
        gpus, gpus_version = self.kube.list_collection(self.kube.collection_path("gpu"))
        egpus, egpus_version = self.kube.list_collection(self.kube.collection_path("egpu"))
        classes = self.kube.list_classes()
        claims, claims_version = self.kube.list_collection(self.kube.collection_path("claim", self.namespace))
        pods = self._try(lambda: self.kube.list_pods(self.namespace)) or []
        with self._lock:
            for node in nodes:
                self.ledger.observe_node(node["metadata"]["name"], node["metadata"].get("labels") or {})
            listed = {g["metadata"]["name"] for g in gpus}
            for gone in set(self.ledger.gpu_names()) - listed:
                if not versions.changed_after(self.ledger.gpu_body(gone), gpus_version):
                    self.ledger.forget_gpu(gone)
            for body in gpus:
                self.ledger.observe_gpu(body)
            self.ledger.prune_tombstones(gpus_version)
            listed = {e["metadata"]["name"] for e in egpus}
            for gone in set(self._egpus) - listed:
                if not versions.changed_after(self._egpu_bodies.get(gone), egpus_version):
                    self._drop_egpu(gone)
            for body in egpus:
                self._put_egpu(body)
            self._deleted_egpus.prune(egpus_version)
            self._classes = {c["metadata"]["name"]: ElasticGPUClass.model_validate(c) for c in classes}
            listed_claims = {(c["metadata"].get("namespace", ""), c["metadata"]["name"]) for c in claims}
            for gone_key in set(self._claims) - listed_claims:
                if not versions.changed_after(self._claim_bodies.get(gone_key), claims_version):
                    self._drop_claim(gone_key)
            for body in claims:
                self._put_claim(body)
            self._deleted_claims.prune(claims_version)
            self._pod_claims.clear()
            self._claims_of_pod.clear()
            for pod in pods:
                self._put_pod(pod)
        self._queue_all(background=background)
        self.ready.set()

    def requeue_all(self) -> None:
        """Queue every claim and ElasticGPU of the picture behind the keys events queued (the
        periodic resync between relists)."""
        self._queue_all(background=True)

    def _queue_all(self, *, background: bool) -> None:
        with self._lock:
            keys: list[Key] = [("egpu", n) for n in self._egpus]
            keys += [("claim", ns, n) for ns, n in self._claims]
        for key in keys:
            self.queue.add(key, background=background)

    def _try(self, call: Any) -> Any:
        try:
            return call()
        except errors.ApiError as err:
            logger.warning("optional list failed: %s", err)
            return None

    def observe(self, kind: str, event_type: str | None, body: Body) -> None:
        """Take in one watch event (`kind` in claim, egpu, gpu, class, pod, node)."""
        deleted = event_type == "DELETED"
        meta = body.get("metadata") or {}
        name = meta.get("name", "")
        with self._lock:
            if kind == "claim":
                key = (meta.get("namespace", ""), name)
                if deleted:
                    self._deleted_claims.bury(key, body)
                    self._drop_claim(key)
                    egpu = self._egpu_for_claim_uid(meta.get("uid", ""))
                    if egpu:
                        self.queue.add(("egpu", egpu))
                    return
                self._put_claim(body)
                self.queue.add(("claim", *key))
            elif kind == "egpu":
                if deleted:
                    self._deleted_egpus.bury(name, body)
                    self._drop_egpu(name)
                else:
                    self._put_egpu(body)
                    self.queue.add(("egpu", name))
                self._queue_claims_of_egpu(name, body)
            elif kind == "gpu":
                before = self._free_of(name)
                if deleted:
                    self.ledger.delete_gpu(body)
                else:
                    self.ledger.observe_gpu(body)
                for egpu_name in self._egpus_on_gpu(name):
                    self.queue.add(("egpu", egpu_name))
                if deleted or self._free_of(name) > before:
                    self._capacity_freed()
            elif kind == "class":
                if deleted:
                    self._classes.pop(name, None)
                else:
                    self._classes[name] = ElasticGPUClass.model_validate(body)
                self._queue_pending_claims()
            elif kind == "pod":
                self._put_pod(body, deleted=deleted)
            elif kind == "node":
                self.ledger.observe_node(name, meta.get("labels") or {})
                self._capacity_freed()

    def _put_claim(self, body: Body) -> ElasticGPUClaim:
        """Take in a claim (newer than the picture's, else ignored); its model either way."""
        key = (body["metadata"].get("namespace", ""), body["metadata"]["name"])
        if self._deleted_claims.holds(key, body):
            return ElasticGPUClaim.model_validate(body)
        if not versions.is_newer(body, self._claim_bodies.get(key)):
            if versions.same_version(body, self._claim_bodies.get(key)):
                return self._claims[key]
            return ElasticGPUClaim.model_validate(body)
        self._claim_bodies[key] = body
        old = self._claims.get(key)
        model = ElasticGPUClaim.model_validate(body)
        self._claims[key] = model
        before = old.spec.elastic_gpu_name if old is not None else None
        if before != model.spec.elastic_gpu_name:
            if before:
                self._claims_naming.get(before, set()).discard(key)
            if model.spec.elastic_gpu_name:
                self._claims_naming.setdefault(model.spec.elastic_gpu_name, set()).add(key)
        return model

    def _drop_claim(self, key: ClaimKey) -> None:
        old_claim = self._claims.pop(key, None)
        self._claim_bodies.pop(key, None)
        if old_claim is not None and old_claim.spec.elastic_gpu_name:
            self._claims_naming.get(old_claim.spec.elastic_gpu_name, set()).discard(key)

    def _put_egpu(self, body: Body) -> ElasticGPU:
        """Take in an ElasticGPU (newer than the picture's, else ignored); its model either way."""
        name = body["metadata"]["name"]
        if self._deleted_egpus.holds(name, body):
            return ElasticGPU.model_validate(body)
        if not versions.is_newer(body, self._egpu_bodies.get(name)):
            if versions.same_version(body, self._egpu_bodies.get(name)):
                return self._egpus[name]
            return ElasticGPU.model_validate(body)
        old = self._egpus.get(name)
        self._egpu_bodies[name] = body
        model = ElasticGPU.model_validate(body)
        self._egpus[name] = model
        self._index_uid(name, old, model)
        self._index_cards(name, old, model)
        if model.status.phase == "Available" and (model.spec.claim_ref is None or not model.spec.claim_ref.name):
            self._unclaimed_available[name] = model
        else:
            self._unclaimed_available.pop(name, None)
        if model.status.phase == "Available" and (old is None or old.status.phase != "Available"):
            self._queue_pending_claims()
        return model

    def _drop_egpu(self, name: str) -> None:
        old = self._egpus.pop(name, None)
        self._egpu_bodies.pop(name, None)
        self._unclaimed_available.pop(name, None)
        self._index_uid(name, old, None)
        self._index_cards(name, old, None)

    @staticmethod
    def _cards_of(egpu: ElasticGPU | None) -> set[str]:
        if egpu is None:
            return set()
        cards = set(egpu.spec.physical_gpu.gpu_names) if egpu.spec.physical_gpu is not None else set()
        if egpu.spec.gpu_share is not None:
            cards.add(egpu.spec.gpu_share.gpu_name)
        return cards

    def _index_cards(self, name: str, old: ElasticGPU | None, new: ElasticGPU | None) -> None:
        before, after = self._cards_of(old), self._cards_of(new)
        for gpu_name in before - after:
            self._egpus_on.get(gpu_name, set()).discard(name)
        for gpu_name in after - before:
            self._egpus_on.setdefault(gpu_name, set()).add(name)

    def _index_uid(self, name: str, old: ElasticGPU | None, new: ElasticGPU | None) -> None:
        old_uid = old.spec.claim_ref.uid if old is not None and old.spec.claim_ref is not None else None
        new_uid = new.spec.claim_ref.uid if new is not None and new.spec.claim_ref is not None else None
        if old_uid and old_uid != new_uid and self._by_claim_uid.get(old_uid) == name:
            del self._by_claim_uid[old_uid]
        if new_uid:
            self._by_claim_uid[new_uid] = name

    def _put_pod(self, body: Body, *, deleted: bool = False) -> None:
        meta = body.get("metadata") or {}
        pod_key = (meta.get("namespace", ""), meta.get("name", ""))
        before = self._claims_of_pod.pop(pod_key, set())
        now = set() if deleted or not release.pod_is_running(body) else release.claims_of_pod(body)
        if now:
            self._claims_of_pod[pod_key] = now
        for claim in before | now:
            users = self._pod_claims.setdefault((pod_key[0], claim), set())
            if claim in now:
                users.add(pod_key[1])
            else:
                users.discard(pod_key[1])
            if not users:
                self._pod_claims.pop((pod_key[0], claim), None)
            if claim in before - now:
                self.queue.add(("claim", pod_key[0], claim))

    def _free_of(self, gpu_name: str) -> int:
        model = self.ledger.gpu(gpu_name)
        if model is None:
            return 0
        return -sum(a.cores + a.memory for a in model.status.allocations)

    def _egpus_on_gpu(self, gpu_name: str) -> list[str]:
        return sorted(self._egpus_on.get(gpu_name, ()))

    def _egpu_for_claim_uid(self, uid: str) -> str | None:
        if not uid:
            return None
        name = names.elastic_gpu_name_for_claim(uid)
        if name in self._egpus:
            return name
        return self._by_claim_uid.get(uid)

    def _queue_claims_of_egpu(self, name: str, body: Body) -> None:
        ref = (body.get("spec") or {}).get("claimRef") or {}
        if ref.get("name"):
            self.queue.add(("claim", ref.get("namespace", ""), ref["name"]))
        for ns, claim_name in sorted(self._claims_naming.get(name, ())):
            self.queue.add(("claim", ns, claim_name))

    def _capacity_freed(self) -> None:
        """Capacity grew somewhere: queue the claims that wait for capacity."""
        self._queue_pending_claims()

    def _queue_pending_claims(self) -> None:
        for (ns, name), claim in self._claims.items():
            if claim.status.phase in (None, "Pending"):
                self.queue.add(("claim", ns, name))

    # -- running -------------------------------------------------------------------------------

    def run_worker(self, stop: threading.Event) -> None:
        """Process the queue until `stop` is set."""
        while not stop.is_set():
            keys = self._take_batch(timeout_s=0.2)
            if keys:
                self.sync_many(keys)

    def _take_batch(self, *, timeout_s: float) -> list[Key]:
        """The next key and, with workers, whatever else is queued now, up to the batch size."""
        if self._pool is None:
            return self.queue.take(limit=1, background_limit=1, timeout_s=timeout_s)
        binding = self.settings.binding
        return self.queue.take(limit=binding.batch_size, background_limit=binding.background_batch_size,
                               timeout_s=timeout_s)

    def sync_many(self, keys: list[Key]) -> None:
        """Sync several keys. With workers, the claims that provision a slice of one card are
        planned together and their reservations committed with one GPU status write per card
        (`_commit_batch`); every other key is an ordinary `sync`, in order."""
        if self._pool is None or len(keys) == 1:
            for key in keys:
                self.sync(key)
            return
        batch: dict[str, list[tuple[ElasticGPUClaim, binder.Provision, str, Placement]]] = {}
        seen: set[Key] = set()
        for key in keys:
            if key in seen:
                continue
            seen.add(key)
            planned = self._plan_in_batch(key) if key[0] == "claim" else None
            if planned is None:
                self.sync(key)
                continue
            gpu_name = self.ledger.name_of_uuid(planned[3].cards[0].uuid)
            batch.setdefault(gpu_name, []).append(planned)
        if batch:
            self._commit_batch(batch)

    def _plan_in_batch(self, key: Key) -> tuple[ElasticGPUClaim, binder.Provision, str, Placement] | None:
        """For a claim that provisions a slice of one card and holds nothing yet: its placement,
        tentatively reserved in the picture so the next claim of the batch sees it. None (and
        nothing changed) for anything else: the caller syncs it the ordinary way."""
        with self._lock:
            if key in self._in_flight:
                return None
            claim = self._claims.get((key[1], key[2]))
            if claim is None:
                return None
            decision = binder.decide_claim(claim, self.picture())
            if not isinstance(decision, binder.Provision) or decision.request.cards > 1:
                return None
            egpu_name = names.elastic_gpu_name_for_claim(claim.metadata.uid or "")
            if self.ledger.held(egpu_name) is not None:
                return None
            request = PlacementRequest(gpu=decision.request, models=decision.parameters.gpu_model,
                                       node_selector=decision.parameters.node_selector)
            result = self.ledger.place(request, policy=decision.parameters.policy)
            if not isinstance(result, Placement) or len(result.cards) != 1:
                return None
            self.ledger.inventory.reserve(egpu_name, result)
        return claim, decision, egpu_name, result

    def _commit_batch(self, batch: dict[str, list[tuple[ElasticGPUClaim, binder.Provision, str, Placement]]]) -> None:
        """One GPU status write per card with all of its new reservations (the commit point of
        each), the cards in parallel. A card that conflicts commits none of its claims: their
        tentative reservations are dropped, the card re-read, and the claims requeued."""
        assert self._commit_pool is not None

        def put(gpu_name: str) -> tuple[str, Body | errors.ControllerError]:
            with self._lock:
                allocations = [allocation_for(egpu_name, placement.cards[0], claim_ref_of(claim))
                               for claim, _decision, egpu_name, placement in batch[gpu_name]]
                body = self.ledger.with_allocations(gpu_name, allocations)
            try:
                return gpu_name, self.kube.replace_gpu_status(body)
            except errors.ControllerError as err:
                return gpu_name, err

        for gpu_name, answer in self._commit_pool.map(put, list(batch)):
            planned = batch[gpu_name]
            if isinstance(answer, errors.ControllerError):
                logger.debug("batched reservation on %s not committed, re-planning: %s", gpu_name, answer)
                with self._lock:
                    for _claim, _decision, egpu_name, _placement in planned:
                        self.ledger.inventory.release(egpu_name)
                if isinstance(answer, errors.Conflict | errors.Rejected):
                    self._refresh_gpu(gpu_name)
                for claim, _decision, _egpu_name, _placement in planned:
                    self.queue.add(("claim", claim.metadata.namespace or "", claim.metadata.name or ""),
                                   delay_s=self.settings.binding.conflict_backoff_s * random.random())
                continue
            with self._lock:
                self.ledger.observe_gpu(answer)
            for claim, decision, egpu_name, placement in planned:
                self._hand_off(claim, decision, egpu_name, placement)

    def drain(self, *, max_items: int = 100_000) -> int:
        """Process queued keys until none is left (delayed ones included once due); returns how many."""
        done = 0
        while done < max_items:
            keys = self._take_batch(timeout_s=0.0)
            if not keys:
                with self._lock:
                    busy = bool(self._in_flight)
                if not busy and self.events.idle():
                    return done
                time.sleep(0.005)  # a worker is finishing a bind (each of its calls has a timeout)
                continue
            self.sync_many(keys)
            done += len(keys)
        return done

    def sync(self, key: Key) -> None:
        """Sync one object; on any API failure requeue it with a delay (nothing half-written is assumed)."""
        with self._lock:
            if key in self._in_flight:
                self._dirty.add(key)  # synced again when its worker is done
                return
        try:
            if key[0] == "claim":
                self.sync_claim(key[1], key[2])
            elif key[0] == "egpu":
                self.sync_elastic_gpu(key[1])
        except errors.ControllerError as err:
            logger.warning("sync of %s failed, retrying: %s", "/".join(key), err)
            # Jittered: two controllers that conflicted on the same object must not retry in step.
            delay = self.settings.binding.requeue_delay_s
            self.queue.add(key, delay_s=delay * (0.5 + random.random()))

    def _backoff(self, attempt: int) -> None:
        """A short, jittered pause before re-planning after a conflict (the other writer of the
        card is usually mid-bind: giving it a few ms lets the re-plan see its result)."""
        base = self.settings.binding.conflict_backoff_s
        if base > 0:
            time.sleep(random.uniform(0, base * (2 ** min(attempt, 4))))

    def picture(self) -> binder.Picture:
        """The binder's view of the current picture. It shares the controller's maps (no copy:
        decisions run under the lock and change nothing), so a sync costs no O(objects) rebuild."""
        return binder.Picture(
            elastic_gpus=self._egpus,
            classes=self._classes,
            card_memory=self._card_memory,
            by_claim_uid=self._by_claim_uid,
            unclaimed_available=self._unclaimed_available,
        )

    def _card_memory(self, gpu_name: str) -> int | None:
        model = self.ledger.gpu(gpu_name)
        return model.spec.memory if model is not None else None

    # -- claims --------------------------------------------------------------------------------

    def sync_claim(self, namespace: str, name: str) -> None:
        """Decide and carry out the next step of one claim."""
        with self._lock:
            claim = self._claims.get((namespace, name))
            if claim is None:
                return
            decision = binder.decide_claim(claim, self.picture())
        if isinstance(decision, binder.Ignore | binder.InSync):
            return
        if isinstance(decision, binder.Wait):
            self._claim_pending(claim, decision.reason, decision.message)
        elif isinstance(decision, binder.MarkLost):
            self._claim_lost(claim, decision.reason, decision.message)
        elif isinstance(decision, binder.CompleteBind):
            self._complete_bind(claim, decision.elastic_gpu)
        elif isinstance(decision, binder.BindToExisting):
            self._bind_existing(claim, decision.elastic_gpu)
        elif isinstance(decision, binder.Provision):
            self._provision(claim, decision)
        elif isinstance(decision, binder.Deleting):
            self._release_claim(claim)

    def _claim_body(self, claim: ElasticGPUClaim) -> Body:
        return self._claim_bodies[(claim.metadata.namespace or "", claim.metadata.name or "")]

    def _write_claim_status(self, claim: ElasticGPUClaim, status: Body) -> None:
        namespace, name = claim.metadata.namespace or "", claim.metadata.name or ""
        # The resourceVersion makes this a precondition: a controller with a stale picture must
        # never write Pending over a Bound another one just wrote.
        patch = {"metadata": {"resourceVersion": claim.metadata.resource_version}, "status": status}
        try:
            answer = self.kube.patch_claim_status(namespace, name, patch)
        except errors.NotFound:
            return  # deleted meanwhile: nothing to report on
        except errors.Conflict:
            self._refresh_claim(namespace, name)
            raise
        with self._lock:
            self._put_claim(answer)

    def _refresh_claim(self, namespace: str, name: str) -> None:
        try:
            fresh = self.kube.get_claim(namespace, name)
        except errors.NotFound:
            return
        with self._lock:
            self._put_claim(fresh)

    def _claim_pending(self, claim: ElasticGPUClaim, reason: str, message: str) -> None:
        current = claim.status.conditions
        if claim.status.phase == "Pending" and any(
            c.type == "Pending" and c.reason == reason and c.message == message for c in current
        ):
            return  # said already: no write, no Event
        condition = _condition("Pending", reason, message, current)
        self._write_claim_status(claim, {"phase": "Pending", "conditions": [condition]})
        kind = NORMAL if reason == binder.REASON_WAIT_FOR_CONSUMER else WARNING
        self.events.record(self._claim_body(claim), type_=kind, reason=reason, message=message)

    def _claim_lost(self, claim: ElasticGPUClaim, reason: str, message: str) -> None:
        said = any(c.type == "Lost" and c.reason == reason for c in claim.status.conditions)
        if claim.status.phase == "Lost" and said:
            return
        condition = _condition("Lost", reason, message, claim.status.conditions)
        self._write_claim_status(claim, {"phase": "Lost", "conditions": [condition]})
        self.events.record(self._claim_body(claim), type_=WARNING, reason=reason, message=message)

    def _complete_bind(self, claim: ElasticGPUClaim, egpu_name: str) -> None:
        egpu = self._egpus.get(egpu_name)
        if egpu is None:
            raise errors.BindingError(f"ElasticGPU {egpu_name} left the picture; the next sync re-decides")
        if egpu.status.phase != "Bound":
            egpu = self._set_egpu_phase(egpu, "Bound", binder.REASON_BOUND,
                                        f"bound to claim {claim.metadata.namespace}/{claim.metadata.name}")
        self._bind_claim(claim, egpu)

    def _bind_claim(self, claim: ElasticGPUClaim, egpu: ElasticGPU, *, placement: Placement | None = None) -> None:
        """Step 3: the claim names the ElasticGPU, keeps the finalizer, and says Bound. With
        `placement` (a dynamic bind, whose ElasticGPU has no status yet) capacity, node and cards
        come from it and the Event says "provisioned" too."""
        namespace, name = claim.metadata.namespace or "", claim.metadata.name or ""
        egpu_name = egpu.metadata.name or ""
        finalizers = list(claim.metadata.finalizers)
        if claim.spec.elastic_gpu_name != egpu_name or names.FINALIZER_CLAIM_PROTECTION not in finalizers:
            if names.FINALIZER_CLAIM_PROTECTION not in finalizers:
                finalizers.append(names.FINALIZER_CLAIM_PROTECTION)
            patch = {
                "metadata": {"finalizers": finalizers, "resourceVersion": claim.metadata.resource_version},
                "spec": {"elasticGPUName": egpu_name},
            }
            try:
                answer = self.kube.patch_claim(namespace, name, patch)
            except errors.Conflict:
                # Changed since our picture (often: the other controller bound it). Re-read it, so
                # the retry decides from what the server holds (InSync when it is Bound already).
                self._refresh_claim(namespace, name)
                raise
            with self._lock:
                claim = self._put_claim(answer)
        if placement is not None:
            capacity: dict[str, Any] = capacity_of(placement)
            node: str | None = placement.node
            gpus = [share.uuid for share in placement.cards]
        else:
            capacity = egpu.status.capacity or dict(egpu.spec.capacity)
            node = egpu.status.node_name or egpu.spec.node_name
            gpus = list(egpu.status.gpus)
        message = f"bound to ElasticGPU {egpu_name} on {node or '?'}" + (f" ({', '.join(gpus)})" if gpus else "")
        status = {
            "phase": "Bound",
            "capacity": capacity,
            "nodeName": node,
            "gpus": gpus,
            "conditions": [_condition("Bound", binder.REASON_BOUND, message, claim.status.conditions)],
        }
        self._write_claim_status(claim, status)
        self.events.record(self._claim_bodies.get((namespace, name), claim.to_dict()), type_=NORMAL,
                           reason=binder.REASON_BOUND,
                           message=f"provisioned ElasticGPU {egpu_name} and {message}" if placement else message)

    def _bind_existing(self, claim: ElasticGPUClaim, egpu_name: str) -> None:
        """Static bind, step 2: point the ElasticGPU at the claim (with its resourceVersion)."""
        egpu = self._egpus[egpu_name]
        patch = {
            "metadata": {"resourceVersion": egpu.metadata.resource_version},
            "spec": {"claimRef": claim_ref_of(claim).to_dict()},
        }
        try:
            answer = self.kube.patch_elastic_gpu(egpu_name, patch)
        except errors.Conflict:
            # Someone else changed it (maybe bound it): re-read and decide again.
            fresh = self.kube.get_elastic_gpu(egpu_name)
            with self._lock:
                self._put_egpu(fresh)
            self.queue.add(("claim", claim.metadata.namespace or "", claim.metadata.name or ""))
            return
        with self._lock:
            patched = self._put_egpu(answer)
        egpu = self._set_egpu_phase(patched, "Bound", binder.REASON_BOUND,
                                    f"bound to claim {claim.metadata.namespace}/{claim.metadata.name}")
        self._stamp_claim_ref(egpu)
        self._bind_claim(claim, egpu)

    # -- provisioning --------------------------------------------------------------------------

    def _provision(self, claim: ElasticGPUClaim, decision: binder.Provision) -> None:
        key = names.elastic_gpu_name_for_claim(claim.metadata.uid or "")
        placement = self._reserve_for_claim(claim, key, decision)
        if placement is None:
            return
        self._hand_off(claim, decision, key, placement)

    def _hand_off(self, claim: ElasticGPUClaim, decision: binder.Provision, key: str, placement: Placement) -> None:
        """After the commit point: the rest of the bind, inline or on a worker."""
        body = build_elastic_gpu(claim, decision, placement, self.ledger)
        if self._pool is None:
            self._finish_provision(claim, placement, key, body)
            return
        # After the commit point the rest is idempotent writes to objects of this claim only: a
        # worker does them while the binder thread decides the next claim. Until it is done,
        # syncs of the claim and its ElasticGPU wait (they would only repeat its writes).
        claim_key: Key = ("claim", claim.metadata.namespace or "", claim.metadata.name or "")
        keys = (claim_key, ("egpu", key))
        with self._lock:
            self._in_flight.update(keys)
        self._pool.submit(self._in_worker, keys, lambda: self._finish_provision(claim, placement, key, body))

    def _in_worker(self, keys: tuple[Key, ...], work: Callable[[], None]) -> None:
        try:
            work()
        except errors.ControllerError as err:
            logger.warning("bind of %s failed, retrying: %s", "/".join(keys[0]), err)
            self.queue.add(keys[0], delay_s=self.settings.binding.requeue_delay_s * (0.5 + random.random()))
        except Exception:  # a bug must not kill the worker; the claim's next sync retries
            logger.exception("bind of %s failed", "/".join(keys[0]))
            self.queue.add(keys[0], delay_s=self.settings.binding.requeue_delay_s)
        finally:
            with self._lock:
                self._in_flight.difference_update(keys)
                again = [k for k in keys if k in self._dirty]
                self._dirty.difference_update(again)
            for key in again:
                self.queue.add(key)

    def close(self) -> None:
        """Wait for the workers and the Event writer (bounded by their calls' timeouts)."""
        for pool in (self._commit_pool, self._pool):
            if pool is not None:
                pool.shutdown(wait=True)
        self.events.close()

    def _finish_provision(self, claim: ElasticGPUClaim, placement: Placement, key: str, body: Body) -> None:
        """Steps 2 and 3 of a dynamic bind, after the commit point."""
        try:
            created = self.kube.create_elastic_gpu(body)
        except errors.AlreadyExists:
            # Another controller (or this one before a crash) provisioned it first, maybe on other
            # cards: free what this attempt reserved beyond its cards, then finish its bind.
            existing = self.kube.get_elastic_gpu(key)
            with self._lock:
                self._put_egpu(existing)
                model = self._egpus[key]
            self._free_extra_cards(model)
            if not binder.points_to(model, claim):
                raise errors.BindingError(f"ElasticGPU {key} exists but points to another claim;"
                                          " an admin must delete it") from None
            self._complete_bind(claim, key)
            return
        with self._lock:
            egpu = self._put_egpu(created)
        # The claim first: it is what the user waits for, and the ElasticGPU already points at it
        # (pre-bound), so a crash before the ElasticGPU's status is repaired by either sync
        # (`CompleteBind` for the claim, `MarkBound` for the ElasticGPU).
        self._bind_claim(claim, egpu, placement=placement)
        # One Event for the whole provisioning (the claim's Bound, where the user looks), none for
        # the ElasticGPU's first phase: Events cost the API server as much as the bind's writes.
        self._set_egpu_status(egpu, placement, "Bound", binder.REASON_BOUND,
                              f"provisioned for claim {claim.metadata.namespace}/{claim.metadata.name}", event=False)

    def _reserve_for_claim(self, claim: ElasticGPUClaim, key: str, decision: binder.Provision) -> Placement | None:
        """Step 1: plan and commit the reservation; None when the claim must wait (status written)."""
        request = PlacementRequest(
            gpu=decision.request,
            models=decision.parameters.gpu_model,
            node_selector=decision.parameters.node_selector,
        )
        for attempt in range(self.settings.binding.conflict_retries):
            with self._lock:
                held = self.ledger.held(key)
                if held is not None and len(held.cards) == max(1, decision.request.cards):
                    return held  # committed before a crash, a lost answer, or by the other controller
                result = None if held is not None else self.ledger.place(request, policy=decision.parameters.policy)
            if held is not None:
                # Not the claim's shape: a partial multi-card write, or two controllers reserved
                # the same key on different cards. If the ElasticGPU exists, its spec decided
                # which cards are the claim's: keep those and finish that bind (the claim's next
                # sync finds it prebound); otherwise start over.
                if self._adopt_existing(claim, key):
                    return None
                self._free_reservation(key)
                continue
            if isinstance(result, Unplaceable):
                message = f"no card can give {decision.request.describe()}: {result.reason}"
                if result.closest:
                    message += f" (closest: {result.closest})"
                self._claim_pending(claim, binder.REASON_NO_CAPACITY, message)
                return None
            assert result is not None
            try:
                self._commit(key, result, claim_ref_of(claim))
            except (errors.Conflict, errors.Rejected) as err:
                logger.debug("reservation lost a race, re-planning: %s", err)
                self._backoff(attempt)
                continue
            return result
        raise errors.BindingError(f"claim {claim.metadata.namespace}/{claim.metadata.name}: too many conflicts on"
                                  " the GPUs; retrying later")

    def _adopt_existing(self, claim: ElasticGPUClaim, key: str) -> bool:
        """When ElasticGPU `key` exists (live read): free what `key` holds outside its spec's
        cards, requeue the claim, and answer True. False when it does not exist."""
        try:
            existing = self.kube.get_elastic_gpu(key)
        except errors.NotFound:
            return False
        with self._lock:
            self._put_egpu(existing)
        self._free_extra_cards(self._egpus[key])
        self.queue.add(("claim", claim.metadata.namespace or "", claim.metadata.name or ""))
        return True

    def _free_extra_cards(self, egpu: ElasticGPU) -> None:
        """Free the reservations of `egpu` on cards its spec does not name: they are what a
        controller that lost the race to create it had reserved."""
        name = egpu.metadata.name or ""
        cards = set(egpu.spec.physical_gpu.gpu_names if egpu.spec.physical_gpu else [])
        if egpu.spec.gpu_share is not None:
            cards.add(egpu.spec.gpu_share.gpu_name)
        with self._lock:
            extra = [g for g in self.ledger.gpus_holding(name) if g not in cards]
        for gpu_name in extra:
            self._free_on(gpu_name, name)

    def _commit(self, key: str, placement: Placement, claim_ref: Any) -> None:
        """Write the reservation into each card's allocations (PUT with its resourceVersion).
        On a conflict the cards already written are freed again and the conflict is raised."""
        written: list[str] = []
        for share in placement.cards:
            gpu_name = self.ledger.name_of_uuid(share.uuid)
            with self._lock:
                body = self.ledger.with_allocation(gpu_name, allocation_for(key, share, claim_ref))
            try:
                answer = self.kube.replace_gpu_status(body)
            except (errors.Conflict, errors.Rejected):
                self._refresh_gpu(gpu_name)
                for done in written:
                    self._free_on(done, key)
                raise
            with self._lock:
                self.ledger.observe_gpu(answer)
            written.append(gpu_name)

    def _refresh_gpu(self, gpu_name: str) -> None:
        try:
            fresh = self.kube.get_gpu(gpu_name)
        except errors.NotFound:
            with self._lock:
                self.ledger.forget_gpu(gpu_name)
            return
        with self._lock:
            self.ledger.observe_gpu(fresh)

    def _free_on(self, gpu_name: str, key: str) -> None:
        """Remove `key`'s allocation from one GPU (re-reading on conflicts)."""
        for _attempt in range(self.settings.binding.conflict_retries):
            with self._lock:
                if self.ledger.gpu(gpu_name) is None:
                    return
                body = self.ledger.without_allocation(gpu_name, key)
            if body is None:
                return
            try:
                answer = self.kube.replace_gpu_status(body)
            except errors.Conflict:
                self._refresh_gpu(gpu_name)
                continue
            except errors.NotFound:
                with self._lock:
                    self.ledger.forget_gpu(gpu_name)
                return
            with self._lock:
                self.ledger.observe_gpu(answer)
                self._capacity_freed()
            return
        raise errors.BindingError(f"GPU {gpu_name}: could not free the reservation of {key}; retrying later")

    def _free_reservation(self, key: str) -> None:
        """Free every allocation of `key`."""
        with self._lock:
            holding = self.ledger.gpus_holding(key)
        for gpu_name in holding:
            self._free_on(gpu_name, key)

    # -- ElasticGPUs ---------------------------------------------------------------------------

    def _set_egpu_status(self, egpu: ElasticGPU, placement: Placement | None, phase: str, reason: str,
                         message: str, *, event: bool = True) -> ElasticGPU:
        status: Body = {"phase": phase, "reason": reason, "message": message}
        if placement is not None:
            status["capacity"] = capacity_of(placement)
            status["nodeName"] = placement.node
            status["gpus"] = [share.uuid for share in placement.cards]
        name = egpu.metadata.name or ""
        answer = self.kube.patch_elastic_gpu_status(name, {"status": status})
        with self._lock:
            written = self._put_egpu(answer)
        if event and egpu.status.phase != phase:
            kind = WARNING if phase == "Failed" else NORMAL
            self.events.record(answer, type_=kind, reason=reason, message=message)
        return written

    def _set_egpu_phase(self, egpu: ElasticGPU, phase: str, reason: str, message: str) -> ElasticGPU:
        placement = self.ledger.held(egpu.metadata.name or "")
        return self._set_egpu_status(egpu, placement, phase, reason, message)

    def sync_elastic_gpu(self, name: str) -> None:
        """Decide and carry out the next step of one ElasticGPU."""
        with self._lock:
            egpu = self._egpus.get(name)
            if egpu is None:
                return
            extra = self._holds_outside_spec(egpu)
        if extra:
            # OBSERVATION: the GPUs hold this ElasticGPU on cards its spec does not name (the
            # loser of a provisioning race reserved them): free those first, or the decision
            # below would see a placement that disagrees with the spec and fail it.
            self._free_extra_cards(egpu)
        with self._lock:
            egpu = self._egpus.get(name)
            if egpu is None:
                return
            claim = None
            ref = egpu.spec.claim_ref
            if ref is not None and ref.name:
                claim = self._claims.get((ref.namespace or "", ref.name))
            decision = binder.decide_elastic_gpu(
                egpu, claim=claim, gpus=self.ledger.gpu, held=self.ledger.held(name), conflict=self.ledger.conflict
            )
        if isinstance(decision, binder.Keep):
            if egpu.status.phase == "Bound":
                self._stamp_claim_ref(egpu)
            return
        if isinstance(decision, binder.Reserve):
            self._reserve_elastic_gpu(egpu, decision.placement, claim)
        elif isinstance(decision, binder.Fail):
            self._free_reservation(name)
            if egpu.status.phase != "Failed" or egpu.status.reason != decision.reason:
                self._set_egpu_status(egpu, None, "Failed", decision.reason, decision.message)
            if ref is not None and ref.name:
                self.queue.add(("claim", ref.namespace or "", ref.name))
        elif isinstance(decision, binder.MarkBound):
            self._set_egpu_phase(egpu, "Bound", binder.REASON_BOUND, f"bound to claim {ref.namespace}/{ref.name}"
                                 if ref else "bound")
        elif isinstance(decision, binder.ReleaseIfClaimGone):
            self._release_if_claim_gone(egpu)
        elif isinstance(decision, binder.Reclaim):
            self._reclaim(egpu, delete=decision.delete)

    def _stamp_claim_ref(self, egpu: ElasticGPU) -> None:
        """Make the allocations of a bound ElasticGPU name its claim (with uid), as a dynamic
        reservation does from the start. A static ElasticGPU was reserved while Available, with
        no claim; this write records who holds the capacity. A conflict leaves it to the next sync."""
        name = egpu.metadata.name or ""
        ref = egpu.spec.claim_ref
        if ref is None or not ref.uid:
            return
        with self._lock:
            stale = [g for g in self.ledger.gpus_holding(name)
                     if (a := self.ledger.allocation(g, name)) is not None
                     and (a.claim_ref is None or a.claim_ref.uid != ref.uid)]
        for gpu_name in stale:
            with self._lock:
                allocation = self.ledger.allocation(gpu_name, name)
                if allocation is None:
                    continue
                body = self.ledger.with_allocation(gpu_name, allocation.model_copy(update={"claim_ref": ref}))
            try:
                answer = self.kube.replace_gpu_status(body)
            except (errors.Conflict, errors.Rejected):
                self._refresh_gpu(gpu_name)
                self.queue.add(("egpu", name), delay_s=self.settings.binding.requeue_delay_s)
                continue
            with self._lock:
                self.ledger.observe_gpu(answer)

    def _holds_outside_spec(self, egpu: ElasticGPU) -> bool:
        spec = egpu.spec
        cards = set(spec.physical_gpu.gpu_names if spec.physical_gpu else [])
        if spec.gpu_share is not None:
            cards.add(spec.gpu_share.gpu_name)
        return bool(cards) and any(g not in cards for g in self.ledger.gpus_holding(egpu.metadata.name or ""))

    def _reserve_elastic_gpu(self, egpu: ElasticGPU, placement: Placement, claim: ElasticGPUClaim | None) -> None:
        name = egpu.metadata.name or ""
        if names.FINALIZER_EGPU_PROTECTION not in egpu.metadata.finalizers:
            patch = {"metadata": {"finalizers": [*egpu.metadata.finalizers, names.FINALIZER_EGPU_PROTECTION],
                                  "resourceVersion": egpu.metadata.resource_version}}
            answer = self.kube.patch_elastic_gpu(name, patch)
            with self._lock:
                egpu = self._put_egpu(answer)
        if self.ledger.held(name) != placement:
            try:
                self._commit(name, placement, egpu.spec.claim_ref)
            except (errors.Conflict, errors.Rejected):
                self.queue.add(("egpu", name))  # the card changed: decide again (maybe DoesNotFit)
                return
        bound = claim is not None and binder.points_to(egpu, claim) and claim.spec.elastic_gpu_name == name
        if bound:
            self._set_egpu_status(egpu, placement, "Bound", binder.REASON_BOUND,
                                  f"bound to claim {claim.metadata.namespace}/{claim.metadata.name}")  # type: ignore[union-attr]
        else:
            self._set_egpu_status(egpu, placement, "Available", binder.REASON_AVAILABLE,
                                  f"reserved on {placement.describe()}")
        if egpu.spec.claim_ref is not None and egpu.spec.claim_ref.name:
            self.queue.add(("claim", egpu.spec.claim_ref.namespace or "", egpu.spec.claim_ref.name))

    def _release_if_claim_gone(self, egpu: ElasticGPU) -> None:
        ref = egpu.spec.claim_ref
        assert ref is not None and ref.name
        try:
            fresh = self.kube.get_claim(ref.namespace or "", ref.name)
        except errors.NotFound:
            fresh = None
        if fresh is not None and (not ref.uid or fresh["metadata"].get("uid") == ref.uid):
            with self._lock:
                self._put_claim(fresh)
            if not fresh["metadata"].get("deletionTimestamp"):
                self.queue.add(("claim", ref.namespace or "", ref.name))
                return
            if names.FINALIZER_CLAIM_PROTECTION in (fresh["metadata"].get("finalizers") or []):
                return  # its own release path runs
        self._set_egpu_phase(egpu, "Released", binder.REASON_RELEASED,
                             f"claim {ref.namespace}/{ref.name} was deleted")
        self.queue.add(("egpu", egpu.metadata.name or ""))

    def _reclaim(self, egpu: ElasticGPU, *, delete: bool) -> None:
        name = egpu.metadata.name or ""
        self._free_reservation(name)
        if names.FINALIZER_EGPU_PROTECTION in egpu.metadata.finalizers:
            kept = [f for f in egpu.metadata.finalizers if f != names.FINALIZER_EGPU_PROTECTION]
            try:
                answer = self.kube.patch_elastic_gpu(
                    name, {"metadata": {"finalizers": kept, "resourceVersion": egpu.metadata.resource_version}})
            except errors.NotFound:
                return
            with self._lock:
                self._put_egpu(answer)
        if delete and not egpu.metadata.deletion_timestamp:
            with contextlib.suppress(errors.NotFound):
                self.kube.delete_elastic_gpu(name, uid=egpu.metadata.uid)
            self.events.record(self._egpu_bodies.get(name, egpu.to_dict()), type_=NORMAL, reason="Reclaimed",
                               message=f"reclaim policy Delete: capacity freed and ElasticGPU {name} deleted")

    # -- release -------------------------------------------------------------------------------

    def _release_claim(self, claim: ElasticGPUClaim) -> None:
        namespace, name = claim.metadata.namespace or "", claim.metadata.name or ""
        with self._lock:
            users = set(self._pod_claims.get((namespace, name), set()))
            decision = release.decide_release(claim, pods_using=users, elastic_gpus=dict(self._egpus))
        if isinstance(decision, release.NothingToRelease):
            return
        if isinstance(decision, release.KeepFinalizer):
            message = f"in use by pod(s) {', '.join(decision.pods)}; deletion waits until they terminate"
            if not any(c.reason == release.REASON_CLAIM_IN_USE for c in claim.status.conditions):
                condition = _condition("Terminating", release.REASON_CLAIM_IN_USE, message, claim.status.conditions)
                self._write_claim_status(claim, {"conditions": [*[c.to_dict() for c in claim.status.conditions
                                                                   if c.type != "Terminating"], condition]})
                self.events.record(self._claim_body(claim), type_=NORMAL, reason=release.REASON_CLAIM_IN_USE,
                                   message=message)
            return
        if decision.elastic_gpu is not None:
            egpu = self._egpus[decision.elastic_gpu]
            if egpu.status.phase not in ("Released", "Failed"):
                self._set_egpu_phase(egpu, "Released", binder.REASON_RELEASED,
                                     f"claim {namespace}/{name} was deleted")
            self.queue.add(("egpu", decision.elastic_gpu))
        kept = [f for f in claim.metadata.finalizers if f != names.FINALIZER_CLAIM_PROTECTION]
        try:
            self.kube.patch_claim(namespace, name, {"metadata": {"finalizers": kept,
                                                                 "resourceVersion": claim.metadata.resource_version}})
        except errors.NotFound:
            return

    # -- resync --------------------------------------------------------------------------------

    def resync(self, *, relist: bool = True) -> None:
        """Free orphan reservations past the grace period and requeue every object behind the
        keys events queued; `relist`: merge fresh lists into the picture first (what repairs a
        deletion no watch delivered). The orphans found in the picture are confirmed by a live
        read before anything is freed."""
        if relist:
            self.rebuild(background=True)
        else:
            self.requeue_all()
        with self._lock:
            orphans = resync.find_orphans(self.ledger, elastic_gpus=set(self._egpus), now=datetime.now(UTC),
                                          grace_s=self.settings.resync.orphan_grace_s)
        for orphan in orphans:
            try:
                self.kube.get_elastic_gpu(orphan.key)
                continue  # it exists after all (created since the list)
            except errors.NotFound:
                pass
            logger.info("GPU %s: freeing reservation %s: its ElasticGPU does not exist",
                        ",".join(orphan.gpu_names), orphan.key)
            for gpu_name in orphan.gpu_names:
                self._free_on(gpu_name, orphan.key)

    # -- reading, for tests and the benchmark -----------------------------------------------------

    def claim(self, namespace: str, name: str) -> ElasticGPUClaim | None:
        """The claim as the picture holds it."""
        with self._lock:
            return self._claims.get((namespace, name))
