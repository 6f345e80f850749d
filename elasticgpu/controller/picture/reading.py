"""The picture's state and its read side: the maps `Picture` keeps, and what the rest of the
controller reads from them. `Waking`, `TakingIn` and `Picture` build on it (picture.py says how); the split
keeps each class under 400 lines, nothing else.

Every reader takes `lock` (re-entrant), as the writers do; see picture.py for the rules.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from typing import Any

from elasticgpu.api import ElasticGPU, ElasticGPUClaim, ElasticGPUClass, accounting, names
from elasticgpu.controller.decisions import binder, capacity, provisioned_names, release
from elasticgpu.controller.picture import (
    compact,
    namespace_weights,
    node_presence,
    pod_index,
    quota_namespaces,
    records,
    versions,
    waiting_order,
)
from elasticgpu.controller.picture.reservations import Ledger

Body = dict[str, Any]
ClaimKey = tuple[str, str]
PodKey = tuple[str, str]
Key = tuple[str, ...]
"""A work queue key (`flow.machinery.workqueue.Key`, the same alias): the picture answers with the keys to
sync, and sits below the flow, so it spells the alias itself."""
Keys = list[Key]


class Reading:
    """The picture's maps and their readers; `Waking` builds on it."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.ledger = Ledger()
        self._claims: records.Models[ClaimKey, ElasticGPUClaim] = records.Models(
            ElasticGPUClaim, at_rest=_claim_at_rest, lock=self.lock)
        """Claims with the head of their bodies: a Bound one as JSON, built on demand (`records`)."""
        self._claim_counts: Counter[tuple[str, str]] = Counter()
        """Claims by (phase, class name as the claim's spec says it, "" for none), kept in step by
        `_store_claim` / `drop_claim` for the `elasticgpu_claims` gauge: a scrape must not build the
        model of every Bound claim. A count that falls to 0 stays (its series reads 0, not gone)."""
        self._waiting: dict[ClaimKey, None] = {}
        """The claims that wait (Pending or no phase yet), in arrival order: capacity that appears
        wakes them, and must not cost a scan of every claim (one per GPU event at start-up)."""
        self._egpus: records.Models[str, ElasticGPU] = records.Models(
            ElasticGPU, at_rest=_egpu_at_rest, lock=self.lock)
        self._egpu_charges: dict[str, accounting.Charge] = {}
        """The `accounting.Charge` of every ElasticGPU, read when its version was taken in
        (`_store_egpu`): the accounting metrics' scrape reads no body (issue 49 item 3: the first
        scrape after a start or a leader change parsed all 50,000, 1.2 s of CPU)."""
        self._by_claim_uid: dict[str, str] = {}
        self._waiting_cores = waiting_order.CoresCache()
        self._egpu_owners: dict[str, waiting_order.Owner] = {}
        """(namespace, class) of each claimed ElasticGPU (`waiting_order.index_owner`): FairShare
        counts each namespace's use from the reservations without building ElasticGPU models."""
        """ElasticGPU name by the uid in its claimRef, kept in step by `put_egpu` / `drop_egpu`."""
        self._unclaimed_available: dict[str, ElasticGPU] = {}
        """Available ElasticGPUs without a claimRef (static bind candidates), kept by `put_egpu`."""
        self._deleted_claims: versions.Tombstones[ClaimKey] = versions.Tombstones()
        self._deleted_egpus: versions.Tombstones[str] = versions.Tombstones()
        self._claims_naming: compact.Index[str, ClaimKey] = {}
        """Claims by the ElasticGPU their spec names; and ElasticGPUs by the GPUs their spec names:
        watch events of one object must not cost a scan of all of them."""
        self._egpus_on: dict[str, set[str]] = {}
        self._classes: dict[str, ElasticGPUClass] = {}
        self.weights = namespace_weights.NamespaceWeights(self.lock)
        self.quotas = quota_namespaces.QuotaNamespaces(self.lock)
        """FairShare weight by namespace (the Namespace watch): the bind order reads it at each wake."""
        self.pods = pod_index.PodIndex()
        self.nodes = node_presence.NodePresence(self.lock)
        """Which Nodes exist and since when a missing one is missing (dead nodes' cards, GPU GC)."""
        """Bodies of the pods that use claims and of the nodes, and the claims pods own (pod sync)."""
        self._pod_claims: dict[ClaimKey, set[str]] = {}
        """Names of the running pods that use each claim, and (below) the claims of each such pod
        and the resourceVersion it was seen at (pods that use no claim are not kept)."""
        self._claims_of_pod: dict[PodKey, set[str]] = {}
        self._pod_versions: dict[PodKey, int] = {}
        self._gone_pods: versions.Tombstones[PodKey] = versions.Tombstones()
        """Pods deleted or terminated (a terminated pod never runs again): an older copy of one,
        from a list read before, must not make its claims in use again."""

    # -- reading -------------------------------------------------------------------------------

    def in_bind_order(self, keys: Keys) -> Keys:
        """`keys` with the waiting claims among them put in bind order, each in one of the places
        those claims held (the other keys stay where they are): a batch of the worker tries them in
        that order even when some were queued before the last wake, for another reason."""
        with self.lock:
            slots = [i for i, key in enumerate(keys) if key[0] == "claim" and (key[1], key[2]) in self._waiting]
            if len(slots) < 2:
                return keys
            batch = {(keys[i][1], keys[i][2]) for i in slots}
            # In the order the picture first saw them wait: that breaks ties of creationTimestamp.
            ordered = self._ordered([key for key in self._waiting if key in batch])
        if len(ordered) != len(slots):
            return keys
        result = list(keys)
        for slot, (namespace, name) in zip(slots, ordered, strict=True):
            result[slot] = ("claim", namespace, name)
        return result

    def _ordered(self, waiting: list[ClaimKey]) -> list[ClaimKey]:
        """`waiting` (claims that wait, in the order first seen) in bind order (`waiting_order`)."""
        return waiting_order.ordered(waiting, claim=lambda key: self._claims.get(key), classes=self._classes,
                                     default_class=self.view().default_class(),
                                     reservations=self.ledger.inventory.reservations, owners=self._egpu_owners,
                                     cache=self._waiting_cores, weights=self.weights.live())

    def pending_claim_keys(self) -> Keys:
        """The claims that wait (Pending, or no phase yet): capacity grew, or a class changed.
        In bind order (each class's `bindOrder`, `waiting_order`): the queue serves them so."""
        with self.lock:
            if not self._waiting:
                return []
            keys = self._ordered(list(self._waiting))
            self._waiting_cores.keep_only(self._waiting)
            return [("claim", ns, name) for ns, name in keys]

    def waiting_claims(self) -> list[tuple[str, str, str | None]]:
        """(class, reason, creationTimestamp) of each claim that waits (the pending gauges):
        the waiting index only, so a scrape costs nothing per Bound claim. The class is the one the
        claim binds with: the default class for a claim that names none, so the alert on claims
        Pending beside free capacity (whose capacity is per class) sees them too."""
        with self.lock:
            default = self.view().default_class()
            fallback = default.metadata.name or "" if default is not None else ""
            found = []
            for key in self._waiting:
                claim = self._claims.get(key)
                if claim is not None:
                    found.append((claim.spec.class_name or fallback, claim.status.reason or "",
                                  claim.metadata.creation_timestamp))
            return found

    def waiting_claim_models(self) -> list[ElasticGPUClaim]:
        """The claims that wait (Pending, or no phase yet), as models: the node autoscaling asks
        nodes for those that wait for capacity (flow/node_autoscaling.py)."""
        with self.lock:
            return [claim for key in self._waiting if (claim := self._claims.get(key)) is not None]

    def all_keys(self) -> Keys:
        """Every GPU, ElasticGPU and claim (the resync requeues them all), each ElasticGPU followed
        by the claims that name it."""
        with self.lock:
            keys: Keys = [("gpu", n) for n in self.ledger.gpu_names()]
            # Each ElasticGPU just before the claims that name it: its sync builds both models
            # of a Bound pair from JSON (`records`), and theirs find them still cached.
            paired: set[ClaimKey] = set()
            for name in self._egpus:
                keys.append(("egpu", name))
                for claim_key in sorted(compact.index_members(self._claims_naming, name)):
                    if claim_key in self._claims:
                        keys.append(("claim", *claim_key))
                        paired.add(claim_key)
            keys += [("claim", ns, n) for ns, n in self._claims if (ns, n) not in paired]
            keys += self.pods.resync_keys()
            return keys

    def input_versions(self) -> dict[Key, object]:
        """The keys of `all_keys`, each with the resourceVersions of its object and of the objects
        its sync reads (a claim: its ElasticGPU; an ElasticGPU: the claims naming it and the GPUs
        holding it), and ("class", name) with each class's: compared around a relist, what the
        list changed (`settled.SettledKeys.relisted`). Builds no model."""
        def version(body: Body | None) -> int | None:
            return versions.version_of(body)

        with self.lock:
            gpu_version = self.ledger.gpu_version
            out: dict[Key, object] = {("gpu", n): version(gpu_version(n)) for n in self.ledger.gpu_names()}
            for name in self._egpus:
                egpu = version(self._egpus.version_body(name))
                claims = tuple((key, version(self._claims.version_body(key)))
                               for key in sorted(compact.index_members(self._claims_naming, name))
                               if key in self._claims)
                held = tuple(sorted((g, version(gpu_version(g))) for g in self.ledger.gpus_holding(name)))
                out[("egpu", name)] = (egpu, claims, held)
                for key, claim in claims:
                    out[("claim", *key)] = (claim, egpu)
            for key in self._claims:
                out.setdefault(("claim", *key), (version(self._claims.version_body(key)), None))
            out.update(dict.fromkeys(self.pods.resync_keys()))
            out.update({("class", n): c.metadata.resource_version for n, c in self._classes.items()})
            return out

    def claim(self, namespace: str, name: str) -> ElasticGPUClaim | None:
        """The claim as the picture holds it."""
        with self.lock:
            return self._claims.get((namespace, name))

    def claim_uid(self, namespace: str, name: str) -> str | None:
        """The uid of the claim the picture holds (None: none); builds no model."""
        with self.lock:
            return self._claims.uid((namespace, name))

    def claim_body(self, namespace: str, name: str) -> Body | None:
        """The head of the claim's body the picture holds (apiVersion, kind, metadata as the
        server sent them, `compact.identity`); spec and status are in its model (`claim`)."""
        with self.lock:
            return self._claims.head((namespace, name))

    def claim_keys(self) -> list[ClaimKey]:
        """(namespace, name) of every claim."""
        with self.lock:
            return list(self._claims)

    def egpu(self, name: str) -> ElasticGPU | None:
        """The ElasticGPU as the picture holds it."""
        with self.lock:
            return self._egpus.get(name)

    def egpu_body(self, name: str) -> Body | None:
        """The head of the ElasticGPU's body the picture holds (apiVersion, kind, metadata,
        `compact.identity`); spec and status are in its model (`egpu`)."""
        with self.lock:
            return self._egpus.head(name)

    def elastic_gpus(self) -> Mapping[str, ElasticGPU]:
        """Every ElasticGPU by name (the live map: read it under `lock`; keys and `get` are
        cheap, iterating the values builds the model of every Bound one, `records`)."""
        return self._egpus

    def elastic_gpus_changed(self, known: Mapping[str, str | None]
                             ) -> list[tuple[str, str | None, accounting.Charge | None]]:
        """(name, resourceVersion, charge) of every ElasticGPU: charge is None where `known` has
        that name at that version, else its `accounting.Charge`, read when the picture took that
        version in: a scrape parses nothing and builds no model."""
        with self.lock:
            return [(name, charge.version,
                     None if charge.version is not None and known.get(name) == charge.version else charge)
                    for name, charge in self._egpu_charges.items()]

    def per_claim_metric_classes(self) -> set[str]:
        """Names of the classes annotated `elasticgpu.io/per-claim-metrics: "true"` (docs/metrics.md)."""
        with self.lock:
            return {name for name, klass in self._classes.items()
                    if (klass.metadata.annotations or {}).get(names.ANNOTATION_PER_CLAIM_METRICS) == "true"}

    def claim_counts(self) -> dict[tuple[str, str], int]:
        """Claims by (phase, class) (a copy; the `elasticgpu_claims` gauge)."""
        with self.lock:
            return dict(self._claim_counts)

    def _count_claim(self, claim: ElasticGPUClaim | None, delta: int) -> None:
        if claim is not None:
            self._claim_counts[(claim.status.phase or "Pending", claim.spec.class_name or "")] += delta

    def free_by_class(self) -> dict[str, capacity.Free]:
        """Free capacity of each class of ours on the cards it may use (the class gauges)."""
        with self.lock:
            return capacity.free_by_class(self.ledger.inventory, self._classes)

    def pods_using(self, namespace: str, claim: str) -> set[str]:
        """Names of the running pods that use a claim (a copy)."""
        with self.lock:
            return set(self._pod_claims.get((namespace, claim), set()))

    def placed_on(self, node: str) -> list[Body]:
        """The pods not yet bound that the controller itself placed on `node`: pinned there (`pod_index.pinned_to`)
        and using a claim whose reservation the GPUs hold on that node. A pod's own `selected-node` annotation or
        node affinity, which its author may write at create, counts for nothing by itself (issue 44 item 6: a
        gated pod that never runs, naming a node and repelling every pod, kept other pods off it); the
        reservation is the controller's own record, on the GPU objects only it writes. A pod the scheduler bound
        is in the node's pod list instead, as the scheduler counts it."""
        with self.lock:
            placed: list[Body] = []
            for body in self.pods.pinned_to(node):
                namespace = (body.get("metadata") or {}).get("namespace", "")
                for name in sorted(release.claims_of_pod(body)):
                    claim = self.claim(namespace, name)
                    if claim is None:
                        continue
                    held = self.ledger.held(claim.spec.elastic_gpu_name or provisioned_names.provisioned_name(claim))
                    if held is not None and held.node == node:
                        placed.append(body)
                        break
            return placed

    def view(self) -> binder.Picture:
        """The binder's view of the picture. It shares the picture's maps (no copy: decisions run
        under the lock and change nothing), so a sync costs no O(objects) rebuild."""
        return binder.Picture(
            elastic_gpus=self._egpus,
            classes=self._classes,
            card_memory=self._card_memory,
            by_claim_uid=self._by_claim_uid,
            unclaimed_available=self._unclaimed_available,
        )

    def _card_memory(self, gpu_name: str) -> int | None:
        record = self.ledger.gpu_record(gpu_name)  # spec.memory, no model built
        return record.card.memory_mib if record is not None else None


def _claim_at_rest(claim: ElasticGPUClaim) -> bool:
    """A Bound claim not being deleted: kept as JSON (`records`), read by little but a resync."""
    return claim.status.phase == "Bound" and not claim.metadata.deletion_timestamp


def _egpu_at_rest(egpu: ElasticGPU) -> bool:
    """A Bound ElasticGPU not being deleted: kept as JSON (`records`)."""
    return egpu.status.phase == "Bound" and not egpu.metadata.deletion_timestamp
