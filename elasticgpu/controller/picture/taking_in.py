"""Taking in: one watch event, a write's answer or a listed object at a time, kept only when newer
than the picture's copy (and not from before a deletion a watch delivered), with the indexes kept
in step; each method returns the keys whose sync may now decide differently (`waking.Waking`
answers which). See picture.py for the picture's rules.
"""

from __future__ import annotations

from collections.abc import Callable

from elasticgpu.api import ElasticGPU, ElasticGPUClaim, ElasticGPUClass, accounting
from elasticgpu.controller.decisions import release
from elasticgpu.controller.picture import compact, reading, versions, waiting_order, waking

Body = reading.Body
ClaimKey = reading.ClaimKey
PodKey = reading.PodKey
Keys = reading.Keys


class TakingIn(waking.Waking):
    """Takes in objects and answers the keys to queue; see the module docstring."""

    on_egpu_gone: Callable[[Body], None] | None = None
    """Called (under the lock) with the last body of an ElasticGPU the watch reported deleted:
    the accounting metrics keep its final value a while (`metrics.ControllerMetrics`)."""

    def observe(self, kind: str, event_type: str | None, body: Body) -> Keys:
        """Take in one watch event (`kind` in claim, egpu, gpu, class, pod, node); the keys to queue."""
        deleted = event_type == "DELETED"
        meta = body.get("metadata") or {}
        # The keys returned are queued, synced and remembered (settled keys, retries): built from
        # the picture's own strings (`compact.own`), not the event's or the list's. After a watch
        # started over with a list, every key held a name of that list, and each such string kept
        # a whole arena of the list's memory (bench/relist_rss.py).
        name = compact.own(str(meta.get("name", "")))
        keys: Keys = []
        with self.lock:
            if kind == "claim":
                key = (compact.own(str(meta.get("namespace", ""))), name)
                if deleted:
                    self._deleted_claims.bury(key, body)
                    self.drop_claim(key)
                    egpu = self._egpu_for_claim_uid(meta.get("uid", ""))
                    if egpu:
                        keys.append(("egpu", egpu))
                    return keys + self._pods_of_claim(key, body)
                self._store_claim(key, body)
                keys.append(("claim", *key))
                keys += self._pods_of_claim(key, body)
            elif kind == "egpu":
                if deleted:
                    self._deleted_egpus.bury(name, body)
                    self.drop_egpu(name)
                    if self.on_egpu_gone is not None:
                        self.on_egpu_gone(body)
                else:
                    keys += self._egpu_keys(name, body)
                    keys.append(("egpu", name))
                keys += self._claims_of_egpu(name, body)
            elif kind == "gpu":
                before = self._free_of(name)
                modes = self._isolation_of(name)
                sizes = self._allocation_sizes(name)
                if deleted:
                    self.ledger.delete_gpu(body)
                else:
                    self.ledger.observe_gpu(body)
                    keys.append(("gpu", name))  # its readiness (heartbeat, gpu_sync)
                keys += [("egpu", egpu_name) for egpu_name in self._egpus_on_gpu(name)]
                freed = deleted or self._free_of(name) > before
                # A card that now offers an isolation mode (its agent found the mechanism) may take
                # the claims waiting for that mode, as freed capacity may.
                if freed or (not deleted and self._isolation_of(name) - modes):
                    keys += self.pending_claim_keys()
                if not deleted:
                    keys += self._resizing_claims_on(name, freed=freed, sizes=sizes)
            elif kind == "class":
                if deleted:
                    self._classes.pop(name, None)
                else:
                    self._classes[name] = ElasticGPUClass.model_validate(body)
                keys += self.pending_claim_keys()
            elif kind == "pod":
                keys += self.put_pod(body, deleted=deleted)
            elif kind == "node":
                self.nodes.put(body, deleted=deleted)
                if deleted:
                    # Its agent's reports are no longer believed (the ElasticGPUs kept for a running
                    # holder there), and its GPU objects are deleted after a grace (gpu_sync).
                    for gpu_name in self.ledger.gpus_on_node(name):
                        keys.append(("gpu", gpu_name))
                        keys += [("egpu", egpu_name) for egpu_name in self._egpus_on_gpu(gpu_name)]
                if self.pods.put_node(body, deleted=deleted):
                    # A node's status changes often (conditions, images): only a change that can
                    # alter a placement wakes the waiting claims and the gated pods.
                    self.ledger.observe_node(name, meta.get("labels") or {})
                    keys += self.pending_claim_keys()
                    keys += self.pods.gated_keys()
        return keys

    def put_claim(self, body: Body) -> ElasticGPUClaim:
        """Take in a claim (newer than the picture's, else ignored); its model either way."""
        key = (body["metadata"].get("namespace", ""), body["metadata"]["name"])
        with self.lock:
            model = self._store_claim(key, body)
            if model is not None:
                return model
            if versions.same_version(body, self._claims.version_body(key)):
                return self._claims[key]
            return ElasticGPUClaim.model_validate(body)

    def _store_claim(self, key: ClaimKey, body: Body) -> ElasticGPUClaim | None:
        """Keep a claim newer than the picture's (and not from before its deletion): its model,
        or None when the picture keeps what it had."""
        if self._deleted_claims.holds(key, body) or not versions.is_newer(body, self._claims.version_body(key)):
            return None
        # Kept from a copy of its own (`compact.fresh_body`), with a key of its own strings: none of
        # what the picture keeps is an object of the list or event it came in.
        body, packed = compact.fresh_body(body)
        key = (compact.own(key[0]), compact.own(key[1]))
        old_head = self._claims.head(key)
        old = self._claims.get(key)
        model = compact.share_fields(ElasticGPUClaim.model_validate(body))
        self._claims.put(key, body, model, packed)
        self._count_claim(old, -1)
        self._count_claim(model, 1)
        if model.status.phase in (None, "Pending"):
            self._waiting[key] = None
        else:
            self._waiting.pop(key, None)
        self.pods.claim_changed(key, body, old_head)
        before = old.spec.elastic_gpu_name if old is not None else None
        if before != model.spec.elastic_gpu_name:
            if before:
                compact.index_discard(self._claims_naming, before, key)
            if model.spec.elastic_gpu_name:
                compact.index_add(self._claims_naming, model.spec.elastic_gpu_name, key)
        return model

    def drop_claim(self, key: ClaimKey) -> None:
        """Forget a claim."""
        with self.lock:
            old_head = self._claims.head(key)
            old_claim = self._claims.get(key)
            self._claims.pop(key)
            self._count_claim(old_claim, -1)
            self._waiting.pop(key, None)
            self.pods.claim_changed(key, None, old_head)
            if old_claim is not None and old_claim.spec.elastic_gpu_name:
                compact.index_discard(self._claims_naming, old_claim.spec.elastic_gpu_name, key)

    def put_egpu(self, body: Body) -> tuple[ElasticGPU, Keys]:
        """Take in an ElasticGPU (newer than the picture's, else ignored): its model either way,
        and the keys to queue (the claims waiting for capacity when it became Available)."""
        name = body["metadata"]["name"]
        with self.lock:
            stored = self._store_egpu(name, body)
            if stored is not None:
                return stored
            if versions.same_version(body, self._egpus.version_body(name)):
                return self._egpus[name], []
            return ElasticGPU.model_validate(body), []

    def _store_egpu(self, name: str, body: Body) -> tuple[ElasticGPU, Keys] | None:
        """Keep an ElasticGPU newer than the picture's (and not from before its deletion): its
        model and the keys to queue, or None when the picture keeps what it had."""
        if self._deleted_egpus.holds(name, body) or not versions.is_newer(body, self._egpus.version_body(name)):
            return None
        body, packed = compact.fresh_body(body)  # as in `_store_claim`
        name = compact.own(name)
        old = self._egpus.get(name)
        model = compact.share_fields(ElasticGPU.model_validate(body))
        self._egpus.put(name, body, model, packed)
        # From what the picture keeps, as a scrape read it before (the body of one at rest, else
        # the model): the same series and values; the body's dict is at hand, no JSON parsed again.
        self._egpu_charges[name] = accounting.charge_of(body if self._egpus.rests(name) else model)
        self._index_uid(name, old, model)
        waiting_order.index_owner(self._egpu_owners, name, model)
        self._index_cards(name, old, model)
        if model.status.phase == "Available" and (model.spec.claim_ref is None or not model.spec.claim_ref.name):
            self._unclaimed_available[name] = model
        else:
            self._unclaimed_available.pop(name, None)
        if model.status.phase == "Available" and (old is None or old.status.phase != "Available"):
            return model, self.pending_claim_keys()
        return model, []

    def _egpu_keys(self, name: str, body: Body) -> Keys:
        """Keep an ElasticGPU as `_store_egpu` does; only the keys to queue."""
        stored = self._store_egpu(name, body)
        return stored[1] if stored is not None else []

    def drop_egpu(self, name: str) -> None:
        """Forget an ElasticGPU."""
        with self.lock:
            old = self._egpus.get(name)
            self._egpus.pop(name)
            self._egpu_charges.pop(name, None)
            self._unclaimed_available.pop(name, None)
            self._index_uid(name, old, None)
            self._egpu_owners.pop(name, None)
            self._index_cards(name, old, None)

    def put_pod(self, body: Body, *, deleted: bool = False) -> Keys:
        """Take in a pod that uses claims: its body for the pod sync (`pods`), then the claims it
        uses; the keys to queue."""
        # The keys kept for the pod hold strings of its own, none of the parsed list (`compact.fresh`).
        body = compact.owned_names(body)
        with self.lock:
            return self._put_pod_claims(body, deleted=deleted) + self.pods.put(body, deleted=deleted)

    def _put_pod_claims(self, body: Body, *, deleted: bool = False) -> Keys:
        """Take in a pod (newer than the picture's, and not from before its deletion or
        termination, else ignored); the claims it stopped using are the keys to queue."""
        meta = body.get("metadata") or {}
        pod_key = (meta.get("namespace", ""), meta.get("name", ""))
        version = versions.version_of(body)
        with self.lock:
            if self._gone_pods.holds(pod_key, body):
                return []
            seen = self._pod_versions.get(pod_key)
            if seen is not None and version is not None and version <= seen:
                return []
            gone = deleted or not release.pod_is_running(body)
            if gone:
                self._gone_pods.bury(pod_key, body)
            now = set() if gone else {compact.own(claim) for claim in release.claims_of_pod(body)}
            return self._set_pod_claims(pod_key, now, version)

    def _set_pod_claims(self, pod_key: PodKey, now: set[str], version: int | None) -> Keys:
        keys: Keys = []
        with self.lock:
            before = self._claims_of_pod.pop(pod_key, set())
            self._pod_versions.pop(pod_key, None)
            if now:
                self._claims_of_pod[pod_key] = now
                if version is not None:
                    self._pod_versions[pod_key] = version
            for claim in before | now:
                users = self._pod_claims.setdefault((pod_key[0], claim), set())
                if claim in now:
                    users.add(pod_key[1])
                else:
                    users.discard(pod_key[1])
                if not users:
                    self._pod_claims.pop((pod_key[0], claim), None)
                if claim in before - now:
                    keys.append(("claim", pod_key[0], claim))
                    # the pods waiting for it (ClaimInUse) may take it now
                    keys += [("pod", pod_key[0], waiting) for waiting in sorted(users)]
        return keys

    def gpu_ready(self, name: str, ready: bool) -> Keys:
        """Keep whether GPU `name` takes new reservations (`gpu_sync` decided it); when it
        became ready again, capacity came back: the claims waiting for it are the keys to queue."""
        with self.lock:
            changed = self.ledger.set_ready(name, ready)
            return self.pending_claim_keys() if changed and ready else []

    def gpu_written(self, answer: Body, *, freed: bool = False) -> Keys:
        """Take in the answer of a GPU status write; `freed`: it freed capacity, so the claims
        waiting for capacity are the keys to queue."""
        with self.lock:
            self.ledger.observe_gpu(answer)
            if not freed:
                return []
            # The claims on the card too: one may wait for room to expand (issue 17).
            return self.pending_claim_keys() + self._resizing_claims_on(answer["metadata"]["name"], freed=True)

    def forget_gpu(self, name: str) -> None:
        """Drop a GPU the server no longer has."""
        with self.lock:
            self.ledger.forget_gpu(name)
