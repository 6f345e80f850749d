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

The picture answers three questions, one class each, stacked: what it holds and reads
(`reading.Reading`), which keys a change wakes (`waking.Waking`), how an object is taken in
(`taking_in.TakingIn`); `Picture` adds merging a fresh list, where a relist meets what the
watches delivered meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from elasticgpu.api import ElasticGPUClass
from elasticgpu.controller.picture import reading, taking_in, versions

Body = reading.Body
ClaimKey = reading.ClaimKey
PodKey = reading.PodKey
Key = reading.Key
Keys = reading.Keys


HELD_CHUNK = 1_000
"""Objects `Picture.held_versions` and `Picture.unlisted` read per hold of the lock: a few
milliseconds each (8-40 ms under load 4.5, `bench/deletion_lock_hold.py`)."""


class Unlisted(NamedTuple):
    """An object the picture holds that a fresh list lacks (`Picture.unlisted`)."""

    held: tuple[str, str]
    """(resourceVersion, uid) the picture held it at when compared with the list: its deletion is
    taken in only while the picture still holds it so (`Picture.observe_if_held`)."""
    body: Body
    """The body a DELETED event would carry: the picture's last copy."""


class Picture(taking_in.TakingIn):
    """Objects by key, their indexes, and the GPU ledger; see the module docstring."""

    # -- merging a fresh list ----------------------------------------------------------------------

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
        with self.lock:
            self.merge_cards(nodes=nodes, gpus=gpus, gpus_version=gpus_version, classes=classes)
            return self.merge_claims(egpus=egpus, egpus_version=egpus_version, claims=claims,
                                     claims_version=claims_version, pods=pods, pods_version=pods_version)

    def merge_cards(self, *, nodes: list[Body] | None, gpus: list[Body], gpus_version: str,
                    classes: list[Body]) -> None:
        """Merge fresh lists of what a placement reads (nodes, GPUs, classes), as `merge_lists`
        does; a fresh start's early phase merges these first (`process/early_start.py`)."""
        with self.lock:
            for node in nodes or []:
                self.ledger.observe_node(node["metadata"]["name"], node["metadata"].get("labels") or {})
            if nodes is not None:
                self.ledger.forget_nodes_except({n["metadata"]["name"] for n in nodes})
                self.nodes.merge(nodes)
                self.pods.merge_nodes(nodes)
            listed = {g["metadata"]["name"] for g in gpus}
            for gone in set(self.ledger.gpu_names()) - listed:
                if not versions.changed_after(self.ledger.gpu_version(gone), gpus_version):
                    self.ledger.forget_gpu(gone)
            for body in gpus:
                self.ledger.observe_gpu(body)
            self.ledger.prune_tombstones(gpus_version)
            self._classes = {c["metadata"]["name"]: ElasticGPUClass.model_validate(c) for c in classes}

    def merge_claims(self, *, egpus: list[Body], egpus_version: str, claims: list[Body] | None,
                     claims_version: str, pods: list[Body] | None, pods_version: str = "") -> Keys:
        """Merge fresh lists of ElasticGPUs, claims and pods, as `merge_lists` does; the keys to
        queue besides all. `claims` None: merged already (`merge_claim_list`), at `claims_version`."""
        keys: Keys = []
        with self.lock:
            listed = {e["metadata"]["name"] for e in egpus}
            for gone in set(self._egpus) - listed:
                if not versions.changed_after(self._egpus.version_body(gone), egpus_version):
                    self.drop_egpu(gone)
            for body in egpus:
                keys += self._egpu_keys(body["metadata"]["name"], body)
            self._deleted_egpus.prune(egpus_version)
            if claims is not None:
                self.merge_claim_list(claims, claims_version)
            if pods is not None:
                # The pod list is read after the claim list: a pod missing from it whose copy is
                # older than the claim list is gone.
                keys += self.pods.merge(pods, claims_version)
            if pods is not None:
                keys += self._merge_pods(pods, pods_version)
        return keys

    def merge_claim_list(self, claims: list[Body], claims_version: str) -> None:
        """Merge a fresh list of claims, as `merge_lists` does (a fresh start merges it before the
        ElasticGPUs and pods are listed: `process/early_start.py`)."""
        with self.lock:
            listed_claims = {(c["metadata"].get("namespace", ""), c["metadata"]["name"]) for c in claims}
            for gone_key in set(self._claims) - listed_claims:
                if not versions.changed_after(self._claims.version_body(gone_key), claims_version):
                    self.drop_claim(gone_key)
            for body in claims:
                self._store_claim((body["metadata"].get("namespace", ""), body["metadata"]["name"]), body)
            self._deleted_claims.prune(claims_version)

    def unlisted(self, kind: str, items: list[Body], list_version: str) -> list[Unlisted]:
        """What the picture holds of `kind` that a fresh list of that kind (read at
        `list_version`) no longer has, each with the body a DELETED event would carry: a watch
        that starts over with a list must take these in as deleted (client-go's Replace), or a
        deletion made while no watch ran stays in the picture until the next full relist. An
        object whose copy is newer than the list (a write answer, a later event) is not one.
        `items` may be a list of metadata only (PartialObjectMetadata): only their names are read.

        Only the check: the caller takes each in with `observe_if_held`, which checks again under
        the lock, so an event taken in between is not undone. The lock is held for a copy of the
        held keys (no Python loop over 50,000 claims), then for the few the list lacks
        (`HELD_CHUNK` at a time)."""
        listed = {((b.get("metadata") or {}).get("namespace", ""), (b.get("metadata") or {}).get("name", ""))
                  for b in items}
        gone = [key for key in self._held_keys(kind) if key not in listed]
        found: list[Unlisted] = []
        for start in range(0, len(gone), HELD_CHUNK):  # a few, but all after a long outage
            with self.lock:
                held = self._versions_of(kind, gone[start:start + HELD_CHUNK])
                bodies = self.as_deleted(kind, held)
            for body in bodies:
                meta = body.get("metadata") or {}
                key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
                if key in held and not versions.changed_after(body, list_version):
                    found.append(Unlisted(held[key], body))
        return found

    def observe_if_held(self, kind: str, event_type: str | None, body: Body, held: tuple[str, str]) -> Keys | None:
        """`observe`, only while the picture still holds the object at `held` (resourceVersion, uid:
        what `unlisted` or `held_versions` read): the check and the change are one step under the
        lock, as the watches' own changes are. A deletion a list implies must not undo a watch event
        or a write answer taken in since the list was compared (the name created again, a newer
        copy): it would stay undone until the next relist. None: the picture holds something else
        now, and keeps it."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        with self.lock:
            if self.held_version(kind, key) != held:
                return None
            return self.observe(kind, event_type, body)

    def _held_keys(self, kind: str) -> list[tuple[str, str]]:
        """The (namespace, name) of every object of `kind` held: the lock is held for a C-level copy
        of the keys only (a Python loop over 50,000 claims under it is what `unlisted` and
        `held_versions` avoid); the names of the cluster-scoped kinds are paired after."""
        with self.lock:
            if kind == "claim":
                return list(self._claims)
            if kind == "pod":
                return self.pods.keys()
            names: list[str] = (list(self._egpus) if kind == "egpu" else self.ledger.gpu_names() if kind == "gpu"
                                else list(self._classes) if kind == "class"
                                else list(self.pods.nodes()) if kind == "node" else [])
        return [("", name) for name in names]

    def held_versions(self, kind: str) -> dict[tuple[str, str], tuple[str, str]]:
        """(resourceVersion, uid) of every object of `kind` the picture holds, by (namespace, name)
        ("" for a cluster-scoped kind): what the periodic relist compares with a list of metadata
        (`flow.machinery.metadata_relist`). Builds no model and parses no JSON.

        Read `HELD_CHUNK` objects per hold of the lock, not all at once: at 50,000 claims one hold
        was 0.12-0.33 s (`bench/deletion_lock_hold.py`), every watch and the worker waiting. So not one
        state: each entry is what the picture held at some moment of the read, which the relist
        only compares with a list it read before (a copy newer than the list is not behind it; a
        deletion is checked again with the change, `observe_if_held`)."""
        keys = self._held_keys(kind)
        found: dict[tuple[str, str], tuple[str, str]] = {}
        for start in range(0, len(keys), HELD_CHUNK):
            with self.lock:
                found.update(self._versions_of(kind, keys[start:start + HELD_CHUNK]))
        return found

    def _versions_of(self, kind: str, keys: list[tuple[str, str]]) -> dict[tuple[str, str], tuple[str, str]]:
        """`held_versions` of the objects `keys` still held (the caller holds the lock)."""
        def of(body: Body | None) -> tuple[str, str]:
            meta = (body or {}).get("metadata") or {}
            return str(meta.get("resourceVersion") or ""), str(meta.get("uid") or "")

        if kind == "claim":
            return {key: (of(self._claims.version_body(key))[0], self._claims.uid(key) or "")
                    for key in keys if key in self._claims}
        if kind == "egpu":
            return {key: (of(self._egpus.version_body(key[1]))[0], self._egpus.uid(key[1]) or "")
                    for key in keys if key[1] in self._egpus}
        if kind == "class":
            return {key: (c.metadata.resource_version or "", c.metadata.uid or "")
                    for key in keys if (c := self._classes.get(key[1])) is not None}
        bodies: dict[tuple[str, str], Body | None] = {}
        if kind == "gpu":
            bodies = {key: self.ledger.gpu_body(key[1]) for key in keys}
        elif kind == "pod":
            bodies = {key: self.pods.pod(*key) for key in keys}
        elif kind == "node":
            nodes = self.pods.nodes()
            bodies = {key: nodes.get(key[1]) for key in keys}
        return {key: of(body) for key, body in bodies.items() if body is not None}

    def held_version(self, kind: str, key: tuple[str, str]) -> tuple[str, str] | None:
        """`held_versions` of one object (None: not held)."""
        namespace, name = key
        with self.lock:
            if kind == "claim":
                body = self._claims.version_body(key)
                return None if body is None else (str(body["metadata"].get("resourceVersion") or ""),
                                                  self._claims.uid(key) or "")
            if kind == "egpu":
                body = self._egpus.version_body(name)
                return None if body is None else (str(body["metadata"].get("resourceVersion") or ""),
                                                  self._egpus.uid(name) or "")
            if kind == "class":
                klass = self._classes.get(name)
                return None if klass is None else (klass.metadata.resource_version or "", klass.metadata.uid or "")
            held: Body | None = None
            if kind == "gpu":
                held = self.ledger.gpu_body(name)
            elif kind == "pod":
                held = self.pods.pod(namespace, name)
            elif kind == "node":
                held = self.pods.nodes().get(name)
            if held is None:
                return None
            meta = held.get("metadata") or {}
            return str(meta.get("resourceVersion") or ""), str(meta.get("uid") or "")

    def as_deleted(self, kind: str, keys: Iterable[tuple[str, str]]) -> list[Body]:
        """The bodies DELETED events would carry for the objects `keys` of `kind` the picture holds
        (the picture's last copy; an ElasticGPU's with its claimRef, the claim to wake)."""
        held: list[Body | None] = []
        with self.lock:
            nodes = self.pods.nodes() if kind == "node" else {}
            for namespace, name in keys:
                if kind == "claim":
                    held.append(self._claims.head((namespace, name)))
                elif kind == "egpu":
                    held.append(self._egpu_deleted_body(name))
                elif kind == "gpu":
                    held.append(self.ledger.gpu_body(name))
                elif kind == "class":
                    klass = self._classes.get(name)
                    held.append(None if klass is None else {"metadata": {
                        "name": name, "resourceVersion": klass.metadata.resource_version, "uid": klass.metadata.uid}})
                elif kind == "pod":
                    held.append(self.pods.pod(namespace, name))
                elif kind == "node":
                    held.append(nodes.get(name))
        return [body for body in held if body is not None]

    def listed_at(self, kind: str, list_version: str) -> Keys:
        """A complete list of `kind` was read at `list_version` and every difference taken in
        (the periodic relist by metadata): forget the deletions it has seen (tombstones) as
        `merge_lists` does; the keys to queue (pods deleted since their sync last ran)."""
        with self.lock:
            if kind == "claim":
                self._deleted_claims.prune(list_version)
            elif kind == "egpu":
                self._deleted_egpus.prune(list_version)
            elif kind == "gpu":
                self.ledger.prune_tombstones(list_version)
            elif kind == "pod":
                self._gone_pods.prune(list_version)
                return self.pods.listed_at(list_version)
        return []

    def merge_node_metadata(self, nodes: list[Body]) -> None:
        """What a complete node list tells from metadata alone (names, uids, labels), as
        `merge_lists` takes it: the ledger's node labels and which Nodes exist (`nodes`)."""
        with self.lock:
            for node in nodes:
                meta = node.get("metadata") or {}
                self.ledger.observe_node(str(meta.get("name", "")), meta.get("labels") or {})
            self.ledger.forget_nodes_except({str((n.get("metadata") or {}).get("name", "")) for n in nodes})
            self.nodes.merge(nodes)

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
