"""The periodic relist by metadata: list what exists, read whole only what the picture has wrong.

Every `relist_interval_s` the resync repairs what no watch delivered (a change or a deletion
while a watch was down). It used to merge fresh full lists of every kind: at 5,000 nodes, 40,000
GPU objects and 50,000 claims ~180,000 bodies (~367 MiB of JSON) serialized by the API server
and parsed here every five minutes, the largest cost of a fleet at rest (issue 49). Watches keep
the picture current, so nearly all of that repeated what the picture already held.

Now each kind is listed as metadata only (`KubeApi.list_metadata`: PartialObjectMetadataList,
paged as before) and compared with the picture (`Picture.held_versions`), by (namespace, name):

- an object the picture lacks, holds at an older resourceVersion, or holds as another
  incarnation (another uid: deleted and created again under the name) is read whole (GET) and
  taken in as a watch event would be (`Informer.observe`): another incarnation as DELETED of the
  one held and then ADDED, so that what hung on the old one (its indexes, an inline claim's pod,
  a reservation) lets go of it rather than carrying over to the new one;
- an object the picture holds that the list lacks, and whose copy is older than the list
  (`Picture.unlisted`), is taken in as DELETED, checked again under the picture's lock with the
  change (`Informer.observe(if_held=...)`): a watch event taken in since the check (the name
  created again, a newer copy) is not undone;
- a copy newer than the list (a watch event or a write answer that came after it) is left as it is.

When many differ (more than `fetch_at_most`, or more than `fetch_share` of the kind and more than
`FETCH_FLOOR`), a GET each would cost more than one list: that kind is listed whole, as before,
and only what differs from the picture is taken in (an unchanged object wakes nothing, as before).

Namespaces and quotas need nothing beyond metadata (the FairShare weight annotation; which
quotas exist): their lists are merged as the full ones were. Nodes: names, uids and labels come
from the metadata (`Picture.merge_node_metadata`), the bodies of the nodes that differ (taints,
allocatable: the pod placement reads them) are read whole. Nodes, pods, namespaces and quotas may
be refused (RBAC) or time out: the picture keeps its last good view of them, said once
(`Informer.keep_last_good`); any other kind that fails fails the resync, which the next one retries.

The relist reaches the informer through `RelistFeed` alone: no private of it.

The start-up list and a watch's start over after a 410 stay full lists (`Informer.relist`,
`Informer.watch_kind`): every body is needed there.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from elasticgpu.controller import errors
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.machinery.namespace_weight_feed import NamespaceWeightFeed
from elasticgpu.controller.flow.machinery.workqueue import WorkQueue
from elasticgpu.controller.picture import versions
from elasticgpu.controller.picture.picture import Body, Picture

logger = logging.getLogger(__name__)

KINDS = ("node", "gpu", "egpu", "class", "claim", "pod", "namespace", "quota")
"""In the order of the full relist (`Informer.relist`): the pods after the claims they use."""
OPTIONAL = {"node": "nodes", "pod": "pods", "namespace": "namespaces", "quota": "quotas"}
"""The kinds whose failed list keeps the picture's last good view (RBAC may not grant them), by
the name `RelistFeed.keep_last_good` says them with."""
FETCH_AT_MOST = 500
"""Objects of one kind read one by one at most; more than this and the kind is listed whole (a
page of a full list holds 500: past that, a GET each costs more requests than the list)."""
FETCH_SHARE = 0.05
"""Share of a kind that may be read one by one (above `FETCH_FLOOR`) before it is listed whole."""
FETCH_FLOOR = 50
"""Objects of a kind always read one by one rather than listing the kind whole, whatever the share:
a few dozen GETs cost less than one page of full bodies."""


T = TypeVar("T")


class RelistFeed(Protocol):
    """What the relist needs of the informer (`Informer` is one): its client, picture, queue,
    namespace and weight feed, how a change is taken in, and the optional kinds' say-once."""

    kube: KubeApi
    picture: Picture
    queue: WorkQueue
    namespace: str | None
    weights: NamespaceWeightFeed

    def observe(self, kind: str, event_type: str | None, body: Body, *,
                if_held: tuple[str, str] | None = None) -> bool:
        """Take in one change as a watch event; `if_held`: only while the picture still holds the
        object at that (resourceVersion, uid), checked under its lock with the change."""
        ...

    def keep_last_good(self, what: str, call: Callable[[], T]) -> T | None:
        """`call()`, or None when it fails (said once per reason)."""
        ...

    def merge_quotas(self, items: list[Body], list_version: str) -> None:
        """Replace which namespaces have a quota with a fresh list of quotas."""
        ...


@dataclass
class KindRelisted:
    """What the relist of one kind did."""

    listed: int = 0
    """Objects the list held."""
    fetched: int = 0
    """Objects read whole one by one (GET)."""
    taken_in: int = 0
    """Objects taken in changed or new (an incarnation replaced counts once)."""
    deleted: int = 0
    """Objects taken in as DELETED (gone from the list, or an older incarnation)."""
    whole: bool = False
    """The kind was listed whole (too many differed)."""
    failed: str = ""
    """Why an optional kind's list failed (the picture keeps its last good view), or ""."""


@dataclass
class Relisted:
    """What one periodic relist did, by kind."""

    kinds: dict[str, KindRelisted] = field(default_factory=dict)

    def bodies_read(self) -> int:
        """Whole objects read: by GET, and from the kinds listed whole."""
        return sum(k.listed if k.whole else k.fetched for k in self.kinds.values())

    def describe(self) -> str:
        """One line: what each kind that differed from the picture took."""
        parts = [f"{kind}: {k.taken_in} changed, {k.deleted} deleted" + (" (listed whole)" if k.whole else "")
                 for kind, k in self.kinds.items() if k.taken_in or k.deleted or k.whole]
        return "; ".join(parts) or "nothing differed"


class MetadataRelist:
    """The periodic relist (see the module docstring); one per controller, run by `Repair`."""

    def __init__(self, *, informer: RelistFeed, fetch_at_most: int = FETCH_AT_MOST, fetch_share: float = FETCH_SHARE,
                 fetch_floor: int = FETCH_FLOOR) -> None:
        """`informer`: its client, picture and queue, its `observe` (how a change is taken in) and
        its view of the optional kinds' failures; the thresholds: when a kind is listed whole."""
        self.informer = informer
        self.kube = informer.kube
        self.picture = informer.picture
        self.fetch_at_most = fetch_at_most
        self.fetch_share = fetch_share
        self.fetch_floor = fetch_floor
        self.last = Relisted()
        """What the last relist did (benchmarks and tests read it)."""
        self._before_change: Callable[[], object] | None = None

    def relist(self, *, before_change: Callable[[], object] | None = None) -> Relisted:
        """List every kind by metadata and take in what differs from the picture; raises the
        failure of a kind that is not optional (`OPTIONAL`). `before_change` runs once, just before
        the relist takes the first object in: where nothing differed it never runs (the resync's
        `Picture.input_versions` before and after, most of a relist's cost at rest, are not needed)."""
        self._before_change = before_change
        done = Relisted()
        for kind in KINDS:
            if kind in OPTIONAL:
                relisted = self.informer.keep_last_good(OPTIONAL[kind], functools.partial(self._relist, kind))
                done.kinds[kind] = relisted if relisted is not None else KindRelisted(failed="list failed")
            else:
                done.kinds[kind] = self._relist(kind)
        logger.debug("periodic relist by metadata: %s (%d whole objects read)", done.describe(), done.bodies_read())
        self.last = done
        return done

    def _changing(self) -> None:
        """The relist is about to change the picture: `before_change`, once per relist."""
        hook, self._before_change = self._before_change, None
        if hook is not None:
            hook()

    def _namespace(self, kind: str) -> str | None:
        """The namespace a kind is limited to (claims, pods and quotas in a namespaced controller)."""
        return self.informer.namespace if kind in ("claim", "pod", "quota") else None

    def _relist(self, kind: str) -> KindRelisted:
        items, list_version = self.kube.list_metadata(kind, self._namespace(kind))
        self.picture.quotas.saw(int(list_version) if list_version.isdigit() else None)
        done = KindRelisted(listed=len(items))
        if kind == "namespace":
            self.informer.weights.merge((items, list_version))
            return done
        if kind == "quota":
            self.informer.merge_quotas(items, list_version)
            return done
        held = self.picture.held_versions(kind)
        stale = [item for item in items if _stale(held.get(_key(item)), item)]
        bodies: list[Body] = []
        if len(stale) > self.fetch_at_most or (len(stale) > self.fetch_floor
                                              and len(stale) > self.fetch_share * len(items)):
            done.whole = True
            items, list_version = self.kube.list_collection(self.kube.collection_path(kind, self._namespace(kind)))
            done.listed = len(items)
            bodies = [item for item in items if _stale(held.get(_key(item)), item)]
        else:
            for item in stale:
                namespace, name = _key(item)
                # NotFound: deleted since the list; its watch event, or the next relist, takes that in.
                with contextlib.suppress(errors.NotFound):
                    bodies.append(self.kube.get_object(kind, namespace, name))
                done.fetched += 1
        for gone in self.picture.unlisted(kind, items, list_version):
            self._changing()
            # Checked again with the change: a watch event or a write answer taken in since the
            # check (newer than the list) is kept.
            if self.informer.observe(kind, "DELETED", versions.deleted_at(gone.body, list_version), if_held=gone.held):
                done.deleted += 1
        for body in bodies:
            self._changing()
            was = held.get(_key(body))
            uid = str((body.get("metadata") or {}).get("uid") or "")
            if was is not None and was[1] and uid and was[1] != uid:
                # Another incarnation of the name: the one held is gone, as its watch would have said.
                for old in self.picture.as_deleted(kind, [_key(body)]):
                    # Only the incarnation compared: a watch may have taken in the new one since.
                    if self.informer.observe(kind, "DELETED", old, if_held=was):
                        done.deleted += 1
                self.informer.observe(kind, "ADDED", body)
            else:
                self.informer.observe(kind, "MODIFIED" if was is not None else "ADDED", body)
            done.taken_in += 1
        if kind == "node":
            self.picture.merge_node_metadata(items)
        self.informer.queue.add_all(self.picture.listed_at(kind, list_version))
        return done


def _key(body: Body) -> tuple[str, str]:
    meta = body.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _stale(held: tuple[str, str] | None, listed: Body) -> bool:
    """Whether the picture's (resourceVersion, uid) `held` of an object is behind what a list read:
    absent or older (another incarnation is newer too: resourceVersions grow across the kind). A
    copy newer than the list (a watch event or a write answer after it) is not. Where a server's
    resourceVersions are not integers nothing is ordered: any difference counts."""
    if held is None:
        return True
    meta = listed.get("metadata") or {}
    version, uid = str(meta.get("resourceVersion") or ""), str(meta.get("uid") or "")
    held_version, held_uid = held
    if version.isdigit() and held_version.isdigit():
        return int(held_version) < int(version)
    return held_version != version or (bool(uid) and bool(held_uid) and uid != held_uid)
