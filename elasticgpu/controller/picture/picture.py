"""The controller's picture of the cluster: what the watches, lists and write answers delivered,
with the indexes that keep one event from costing a scan of every object.

`Picture` holds claims, ElasticGPUs, classes, the pods that use claims, and GPUs (in the
`Ledger`); Bound claims and ElasticGPUs as JSON, their models built when read (`records`).
It does no I/O and never touches the work queue: every method that takes something in returns
the keys whose sync may now decide differently, and the caller queues them. A copy older
than the picture's is ignored (resourceVersion order), and so is a copy from before a deletion
a watch delivered (tombstones), so the picture never rolls back.

The lock (`Picture.lock`, re-entrant) guards every map; each method takes it, and a caller
that decides from several reads holds it around them, so a decision sees one state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from elasticgpu.api import ElasticGPU, ElasticGPUClaim, ElasticGPUClass, names
from elasticgpu.controller.decisions import binder, release
from elasticgpu.controller.picture import compact, pod_index, reading, versions, waiting_order

Body = reading.Body
ClaimKey = reading.ClaimKey
PodKey = reading.PodKey
Key = reading.Key
Keys = reading.Keys


class Picture(reading.Reading):
    """Objects by key, their indexes, and the GPU ledger; see the module docstring."""

    on_egpu_gone: Callable[[Body], None] | None = None
    """Called (under the lock) with the last body of an ElasticGPU the watch reported deleted:
    the accounting metrics keep its final value a while (`metrics.ControllerMetrics`)."""

    # -- taking in -------------------------------------------------------------------------------

    def observe(self, kind: str, event_type: str | None, body: Body) -> Keys:
        """Take in one watch event (`kind` in claim, egpu, gpu, class, pod, node); the keys to queue."""
        deleted = event_type == "DELETED"
        meta = body.get("metadata") or {}
        name = meta.get("name", "")
        keys: Keys = []
        with self.lock:
            if kind == "claim":
                key = (meta.get("namespace", ""), name)
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

    def _isolation_of(self, gpu_name: str) -> frozenset[str]:
        """The isolation modes GPU `gpu_name` offers in the picture (none when unknown)."""
        model = self.ledger.gpu(gpu_name)
        return frozenset(model.status.isolation) if model is not None else frozenset()

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
        old_head = self._claims.head(key)
        old = self._claims.get(key)
        model = compact.share_fields(ElasticGPUClaim.model_validate(body))
        self._claims.put(key, body, model)
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
        old = self._egpus.get(name)
        model = compact.share_fields(ElasticGPU.model_validate(body))
        self._egpus.put(name, body, model)
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
            self._unclaimed_available.pop(name, None)
            self._index_uid(name, old, None)
            self._egpu_owners.pop(name, None)
            self._index_cards(name, old, None)

    def put_pod(self, body: Body, *, deleted: bool = False) -> Keys:
        """Take in a pod that uses claims: its body for the pod sync (`pods`), then the claims it
        uses; the keys to queue."""
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
            return self._set_pod_claims(pod_key, set() if gone else release.claims_of_pod(body), version)

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

    def merge_lists(self, *, nodes: list[Body] | None, gpus: list[Body], gpus_version: str, egpus: list[Body],
                    egpus_version: str, classes: list[Body], claims: list[Body], claims_version: str,
                    pods: list[Body] | None, pods_version: str = "") -> Keys:
        """Merge fresh lists of every kind (each with the resourceVersion it was read at).

        A listed object replaces the picture's only when it is newer, and an object missing from
        the list is dropped only when the picture's copy is older than the list: watch events
        and write answers that arrived while the list was read are never rolled back (a stale
        picture would turn the next writes into 409s). `nodes` or `pods` None: that list
        failed, and the picture keeps what it had (a claim whose pod still runs must stay
        protected). Returns the keys to queue besides all."""
        keys: Keys = []
        with self.lock:
            for node in nodes or []:
                self.ledger.observe_node(node["metadata"]["name"], node["metadata"].get("labels") or {})
            if nodes is not None:
                self.ledger.forget_nodes_except({n["metadata"]["name"] for n in nodes})
                self.nodes.merge(nodes)
            listed = {g["metadata"]["name"] for g in gpus}
            for gone in set(self.ledger.gpu_names()) - listed:
                if not versions.changed_after(self.ledger.gpu_body(gone), gpus_version):
                    self.ledger.forget_gpu(gone)
            for body in gpus:
                self.ledger.observe_gpu(body)
            self.ledger.prune_tombstones(gpus_version)
            listed = {e["metadata"]["name"] for e in egpus}
            for gone in set(self._egpus) - listed:
                if not versions.changed_after(self._egpus.version_body(gone), egpus_version):
                    self.drop_egpu(gone)
            for body in egpus:
                keys += self._egpu_keys(body["metadata"]["name"], body)
            self._deleted_egpus.prune(egpus_version)
            self._classes = {c["metadata"]["name"]: ElasticGPUClass.model_validate(c) for c in classes}
            listed_claims = {(c["metadata"].get("namespace", ""), c["metadata"]["name"]) for c in claims}
            for gone_key in set(self._claims) - listed_claims:
                if not versions.changed_after(self._claims.version_body(gone_key), claims_version):
                    self.drop_claim(gone_key)
            for body in claims:
                self._store_claim((body["metadata"].get("namespace", ""), body["metadata"]["name"]), body)
            self._deleted_claims.prune(claims_version)
            if nodes is not None:
                self.pods.merge_nodes(nodes)
            if pods is not None:
                # The pod list is read after the claim list: a pod missing from it whose copy is
                # older than the claim list is gone.
                keys += self.pods.merge(pods, claims_version)
            if pods is not None:
                keys += self._merge_pods(pods, pods_version)
        return keys

    def unlisted(self, kind: str, items: list[Body], list_version: str) -> list[Body]:
        """What the picture holds of `kind` that a fresh list of that kind (read at
        `list_version`) no longer has, as the bodies a DELETED event would carry: a watch that
        starts over with a list must take these in as deleted (client-go's Replace), or a
        deletion made while no watch ran stays in the picture until the next full relist. An
        object whose copy is newer than the list (a write answer, a later event) is not one."""
        listed = {((b.get("metadata") or {}).get("namespace", ""), (b.get("metadata") or {}).get("name", ""))
                  for b in items}
        names_listed = {name for _ns, name in listed}
        held: list[Body | None] = []
        with self.lock:
            if kind == "claim":
                held = [self._claims.head(key) for key in set(self._claims) - listed]
            elif kind == "egpu":
                held = [self._egpu_deleted_body(name) for name in set(self._egpus) - names_listed]
            elif kind == "gpu":
                held = [self.ledger.gpu_body(name) for name in set(self.ledger.gpu_names()) - names_listed]
            elif kind == "class":
                held = [{"metadata": {"name": name}} for name in set(self._classes) - names_listed]
            elif kind == "pod":
                held = [self.pods.pod(*key) for key in set(self.pods.keys()) - listed]
            elif kind == "node":
                held = [body for name, body in self.pods.nodes().items() if name not in names_listed]
        return [body for body in held if body is not None and not versions.changed_after(body, list_version)]

    def _egpu_deleted_body(self, name: str) -> Body | None:
        """An ElasticGPU's kept head with its claimRef (what the DELETED path reads: the claim to wake)."""
        head = self._egpus.head(name)
        model = self._egpus.get(name)
        if head is None or model is None:
            return None
        ref = model.spec.claim_ref
        return {**head, "spec": {"claimRef": ref.to_dict() if ref is not None else {}}}

    def _merge_pods(self, pods: list[Body], list_version: str) -> Keys:
        keys: Keys = []
        listed = {((p.get("metadata") or {}).get("namespace", ""), (p.get("metadata") or {}).get("name", ""))
                  for p in pods}
        for gone in set(self._claims_of_pod) - listed:
            if not versions.version_after(self._pod_versions.get(gone), list_version):
                keys += self._set_pod_claims(gone, set(), None)
        for pod in pods:
            keys += self.put_pod(pod)
        self._gone_pods.prune(list_version)
        return keys

    # -- indexes -------------------------------------------------------------------------------

    def _index_cards(self, name: str, old: ElasticGPU | None, new: ElasticGPU | None) -> None:
        before = set(binder.cards_of(old)) if old is not None else set()
        after = set(binder.cards_of(new)) if new is not None else set()
        for gpu_name in before - after:
            _discard(self._egpus_on, gpu_name, name)
        for gpu_name in after - before:
            self._egpus_on.setdefault(gpu_name, set()).add(name)

    def _index_uid(self, name: str, old: ElasticGPU | None, new: ElasticGPU | None) -> None:
        old_uid = old.spec.claim_ref.uid if old is not None and old.spec.claim_ref is not None else None
        new_uid = new.spec.claim_ref.uid if new is not None and new.spec.claim_ref is not None else None
        if old_uid and old_uid != new_uid and self._by_claim_uid.get(old_uid) == name:
            del self._by_claim_uid[old_uid]
        if new_uid:
            self._by_claim_uid[new_uid] = name

    def _free_of(self, gpu_name: str) -> int:
        """A measure of the card's free room that grows when room appears: a card new to the
        picture or Healthy again counts as more room than any Unhealthy or absent one."""
        model = self.ledger.gpu(gpu_name)
        if model is None or model.status.health == "Unhealthy":
            return -(1 << 62)
        return -sum(a.cores + a.memory for a in model.status.allocations)

    def _allocation_sizes(self, gpu_name: str) -> dict[str, tuple[int, int, Any]]:
        """Each allocation's (cores, memory, limit) on a GPU, as the picture holds it."""
        model = self.ledger.gpu(gpu_name)
        if model is None:
            return {}
        return {a.elastic_gpu: (a.cores, a.memory, a.limit) for a in model.status.allocations}

    def _resizing_claims_on(self, gpu_name: str, *, freed: bool,
                            sizes: dict[str, tuple[int, int, Any]] | None = None) -> Keys:
        """The claims a GPU event may move on in a resize (issue 17): those with a shrink under
        way (a limit on their allocation: the agent may have applied it), those whose allocation
        changed size (another controller resized it: the claim's status follows), and, when room
        freed, every claim on the card (one may wait for room to expand)."""
        model = self.ledger.gpu(gpu_name)
        if model is None:
            return []
        return [("claim", a.claim_ref.namespace or "", a.claim_ref.name) for a in model.status.allocations
                if a.claim_ref is not None and a.claim_ref.name
                and (freed or a.limit is not None
                     or (sizes is not None and a.elastic_gpu in sizes
                         and sizes[a.elastic_gpu] != (a.cores, a.memory, a.limit)))]

    def _egpus_on_gpu(self, gpu_name: str) -> list[str]:
        return sorted(self._egpus_on.get(gpu_name, ()))

    def _egpu_for_claim_uid(self, uid: str) -> str | None:
        if not uid:
            return None
        name = names.elastic_gpu_name_for_claim(uid)
        if name in self._egpus:
            return name
        return self._by_claim_uid.get(uid)

    def _claims_of_egpu(self, name: str, body: Body) -> Keys:
        keys: Keys = []
        ref = (body.get("spec") or {}).get("claimRef") or {}
        if ref.get("name"):
            keys.append(("claim", ref.get("namespace", ""), ref["name"]))
        naming = sorted(compact.index_members(self._claims_naming, name))
        keys += [("claim", ns, claim_name) for ns, claim_name in naming]
        return keys

    def _pods_of_claim(self, key: ClaimKey, body: Body) -> Keys:
        """The pods a claim's change may unblock: those that use it, and the pod that owns it."""
        keys: Keys = [("pod", key[0], pod) for pod in sorted(self._pod_claims.get(key, ()))]
        owner = pod_index.owner_pod(body)
        if owner is not None and owner[0] not in self._pod_claims.get(key, ()):
            keys.append(("pod", key[0], owner[0]))
        return keys



def _discard(index: dict[str, set[Any]], key: str, member: Any) -> None:
    """Remove `member` from `index[key]`, and the entry once empty (no empty set per object ever seen)."""
    members = index.get(key)
    if members is not None:
        members.discard(member)
        if not members:
            del index[key]
