"""The part of the picture the pod sync reads: bodies of the pods that use claims, of the nodes,
and which claims each pod owns (inline claims). No I/O; `Picture` holds one (`Picture.pods`)
and calls it under its lock.

Only pods with the label `elasticgpu.io/uses-claims=true` ever reach it (the informer watches
pods through that selector). Nodes are kept whole (labels, taints, allocatable): a pod's
WaitForFirstConsumer claims choose a node from them (`pod_placement`). A node event that
changes none of those (kubelet's status updates) wakes nothing.

A pod is kept as its JSON (`_Pod`, a `compact.Packed`): at 40,000 pods their dicts were most of
the controller's memory (~18 KB each), and a pod's body is read only by its own sync and the
syncs of its claims. What is asked of every pod at once (gated? pinned to which node?) is
answered at take-in and kept beside the JSON, so those scans parse nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from elasticgpu.controller.decisions import pod_gate, provisioned_names
from elasticgpu.controller.picture import compact, versions

Body = dict[str, Any]
PodKey = tuple[str, str]
ClaimKey = tuple[str, str]
Key = tuple[str, ...]
Keys = list[Key]


def owner_pod(claim: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, uid) of the pod that owns a claim as its controller (an inline claim), or None."""
    return provisioned_names.controlling_pod((claim.get("metadata") or {}).get("ownerReferences") or [])


def _placement_fields(node: Mapping[str, Any]) -> tuple[object, ...]:
    """What of a node can change a placement: labels, taints, unschedulable, allocatable."""
    spec, status = node.get("spec") or {}, node.get("status") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    return (sorted(labels.items()), repr(spec.get("taints")), bool(spec.get("unschedulable")),
            sorted((status.get("allocatable") or {}).items()))


class _Pod(compact.Packed):
    """A pod as the index keeps it: its JSON and what the scans over every pod ask."""

    __slots__ = ("gated", "pinned")

    def __init__(self, body: Body) -> None:
        super().__init__(body)
        self.gated = pod_gate.is_gated(body)
        """It carries our scheduling gate (`gated_keys`)."""
        pinned = None if (body.get("spec") or {}).get("nodeName") or pod_gate.is_terminated(body) \
            else pod_gate.pinned_node(body)
        self.pinned = compact.own(pinned) if pinned is not None else None
        """Not bound, not terminated, and pinned to this node (`pinned_to`); else None."""


class PodIndex:
    """Pods that use claims, nodes, and the claims each pod owns (see the module docstring)."""

    def __init__(self) -> None:
        self._pods: dict[PodKey, _Pod] = {}
        self._deleted: versions.Tombstones[PodKey] = versions.Tombstones()
        """Pod deletions a watch delivered: an older copy (a list read before) must not revive one."""
        self._nodes: dict[str, Body] = {}
        self._owned: dict[PodKey, set[str]] = {}
        """Claim names by the (namespace, name) of the pod that owns them as controller."""
        self._departed: dict[PodKey, Body] = {}
        """The last body of each pod deleted since its sync last ran (which claims to let go of),
        and (below) those of before the last list: a list forgets the older generation, so the
        map stays bounded even where no sync runs; every entry's sync was queued twice by then."""
        self._departed_before: dict[PodKey, Body] = {}

    # -- pods ------------------------------------------------------------------------------------

    def put(self, body: Body, *, deleted: bool = False) -> Keys:
        """Take in a pod (a newer copy than held, else ignored); the pod's key when its sync may
        now decide something: it is gated, or it was deleted (its inline claims go)."""
        meta = body.get("metadata") or {}
        key = (compact.own(str(meta.get("namespace", ""))), compact.own(str(meta.get("name", ""))))
        if self._deleted.holds(key, body):
            return []
        if deleted:
            self._deleted.bury(key, body)
            self._pods.pop(key, None)
            self._departed[key] = body
            return [("pod", *key)]
        held = self._pods.get(key)
        if held is not None and not versions.is_newer(body, held.version_body()):
            return []
        pod = self._pods[key] = _Pod(body)
        return [("pod", *key)] if pod.gated else []

    def merge(self, pods: Iterable[Body], list_version: str) -> Keys:
        """Take in a fresh list of the pods that use claims, read after `list_version`: a pod
        missing from it whose copy is not newer than that is gone (its key is returned)."""
        keys: Keys = []
        listed = {((p.get("metadata") or {}).get("namespace", ""), (p.get("metadata") or {}).get("name", ""))
                  for p in pods}
        for gone in set(self._pods) - listed:
            if not versions.changed_after(self._pods[gone].version_body(), list_version):
                self._departed[gone] = self._pods.pop(gone).body()
                keys.append(("pod", *gone))
        for body in pods:
            keys += self.put(body)
        self._deleted.prune(list_version)
        keys += [("pod", *key) for key in self._departed]
        self._departed_before, self._departed = self._departed, {}
        return keys

    def listed_at(self, list_version: str) -> Keys:
        """A complete pod list read at `list_version` was taken in pod by pod (the periodic relist
        by metadata): what `merge` does besides, the tombstones it has seen forgotten and the
        departed pods' older generation dropped (their keys, queued twice by then, returned)."""
        self._deleted.prune(list_version)
        keys: Keys = [("pod", *key) for key in self._departed]
        self._departed_before, self._departed = self._departed, {}
        return keys

    def pod(self, namespace: str, name: str) -> Body | None:
        """The pod's body as last seen (a fresh dict), or None (deleted, never seen, or not using claims)."""
        held = self._pods.get((namespace, name))
        return held.body() if held is not None else None

    def keys(self) -> list[PodKey]:
        """The (namespace, name) of every pod held."""
        return list(self._pods)

    def take_departed(self, namespace: str, name: str) -> Body | None:
        """The last body of a pod of that name deleted since this was last asked, once."""
        key = (namespace, name)
        return self._departed.pop(key, None) or self._departed_before.pop(key, None)

    def keep_departed(self, body: Body) -> None:
        """Put back a departed pod whose claims could not all be let go of (retried)."""
        meta = body.get("metadata") or {}
        self._departed.setdefault((str(meta.get("namespace", "")), str(meta.get("name", ""))), body)

    def gated_keys(self) -> Keys:
        """Keys of every pod still carrying our gate."""
        return [("pod", *key) for key, pod in self._pods.items() if pod.gated]

    def resync_keys(self) -> Keys:
        """What a periodic resync looks at: every gated pod, and every owner of an inline claim
        that is gone (its claim must go too)."""
        keys = self.gated_keys()
        keys += [("pod", *owner) for owner in self._owned if owner not in self._pods]
        return keys

    def pinned_to(self, node: str) -> list[Body]:
        """Pods pinned to `node` by a gate lift (or a chosen node) that the scheduler has not bound
        yet: their CPU and memory count against the node before any list shows them there."""
        return [pod.body() for pod in self._pods.values() if pod.pinned == node]

    # -- claims owned by pods --------------------------------------------------------------------

    def claim_changed(self, key: ClaimKey, body: Body | None, old: Body | None) -> None:
        """Keep the owner index in step with a claim (`body` None: it was dropped)."""
        before = owner_pod(old) if old is not None else None
        after = owner_pod(body) if body is not None else None
        if before == after:
            return
        if before is not None:
            owned = self._owned.get((key[0], before[0]))
            if owned is not None:
                owned.discard(key[1])
                if not owned:
                    del self._owned[(key[0], before[0])]
        if after is not None:
            self._owned.setdefault((key[0], after[0]), set()).add(key[1])

    def owned_claims(self, namespace: str, pod: str) -> list[str]:
        """Names of the claims a pod of that name owns (any incarnation: compare the uid)."""
        return sorted(self._owned.get((namespace, pod), ()))

    # -- nodes -----------------------------------------------------------------------------------

    def put_node(self, body: Body, *, deleted: bool = False) -> bool:
        """Take in a node; True when something that can change a placement changed."""
        name = (body.get("metadata") or {}).get("name", "")
        old = self._nodes.get(name)
        if deleted:
            self._nodes.pop(name, None)
            return old is not None
        if old is not None and not versions.is_newer(body, old):
            return False
        # Without managedFields (the kubelet's status writes make them a large part of a Node,
        # and nothing reads them): 5,000 of them at the size.
        body = self._nodes[name] = compact.strip(body)
        return old is None or _placement_fields(old) != _placement_fields(body)

    def merge_nodes(self, nodes: Iterable[Body]) -> None:
        """Replace the nodes with a complete list."""
        self._nodes = {(n.get("metadata") or {}).get("name", ""): compact.strip(n) for n in nodes}

    def nodes(self) -> dict[str, Body]:
        """Every node by name (a copy of the map; the bodies are shared, never change them)."""
        return dict(self._nodes)

