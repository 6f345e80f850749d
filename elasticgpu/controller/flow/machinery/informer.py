"""The informer: lists and watches with the controller's own client, feeding the picture and
queueing the keys it returns.

This is the default watch engine (`WatchSettings.engine = "client"`). kopf's (`operator.py`)
does the same job, but its per-event machinery (a deep copy of every body for its diff base,
cause detection, per-object worker tasks) cost about 70% of the controller's CPU under a burst
of binds (py-spy, `bench/binding.py`), more than the API server spent on the binds themselves.
Here an event costs one JSON parse and one `Picture.observe`.

A watch that ends (server timeout) or breaks (a dropped connection, a restarting server) is
reopened from the last resourceVersion it delivered, as client-go's reflector does: nothing
is missed and nothing is listed again. Only an expired resourceVersion (410 Gone, as an answer
or as an ERROR event), `RELIST_AFTER_FAILURES` failures in a row, or an object that cannot be
taken in start over with a list: a list queues every object again, which a watch that breaks
now and then must not cost.

Pods are watched by the label `elasticgpu.io/uses-claims=true`, so a pod whose label is removed
arrives as DELETED while it still runs. Before the picture takes a pod DELETED (and its claims
lose that user), a GET confirms it is gone, being deleted or terminated; a pod that is still
alive stays in the picture as last seen and is read again (GET) at every relist, which the
label-selected list would no longer return, until it is really gone.

Namespaces are watched for one annotation only, the FairShare weight, which
`namespace_weight_feed.py` turns into the picture's namespace -> weight. Namespaces are optional,
like nodes: an install whose RBAC does not grant them (403) runs with every weight 1, said once
with the fix.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from elasticgpu.api import names
from elasticgpu.controller import errors
from elasticgpu.controller.decisions import bind_order, release
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.machinery.events import EventRecorder
from elasticgpu.controller.flow.machinery.liveness import Liveness
from elasticgpu.controller.flow.machinery.namespace_weight_feed import NamespaceWeightFeed
from elasticgpu.controller.flow.machinery.workqueue import WorkQueue
from elasticgpu.controller.picture import versions
from elasticgpu.controller.picture.picture import Body, Picture

logger = logging.getLogger(__name__)

KINDS = ("claim", "egpu", "gpu", "class", "pod", "node", "namespace", "quota")
T = TypeVar("T")
Listed = dict[str, str]
"""The resourceVersion each kind was listed at, by kind ("" for a list that failed)."""
RELIST_AFTER_FAILURES = 3
"""Failed attempts in a row to reopen a watch from its resourceVersion before listing again."""
NAMESPACES_FORBIDDEN = (
    "the controller may not list or watch namespaces (403): FairShare classes order every namespace with"
    f" weight 1, ignoring the annotation {bind_order.ANNOTATION_FAIR_SHARE_WEIGHT}; grant the controller's"
    " ClusterRole the verbs list and watch on namespaces (deploy/chart/templates/controller.yaml does)")


class Informer:
    """Feeds `picture` from lists and watches of `kube`; queues what each change wakes."""

    def __init__(self, *, kube: KubeApi, picture: Picture, queue: WorkQueue, namespace: str | None,
                 liveness: Liveness | None = None, events: EventRecorder | None = None) -> None:
        """`namespace` limits claims and pods to one namespace (None: all); each watch loop
        steps `liveness` (as `watch-<kind>`); `events` writes the Warning Event of a bad weight
        annotation (None: it is only logged)."""
        self.liveness = liveness or Liveness()
        self.weights = NamespaceWeightFeed(picture=picture, events=events)
        self._said_lock = threading.Lock()
        self._said: dict[str, str] = {}
        """The failure last said of each optional list (nodes, pods), until one works again."""
        self.kube = kube
        self.picture = picture
        self.queue = queue
        self.namespace = namespace
        self.on_claim: Callable[[Body], None] | None = None
        """Sees every claim the watch delivers, before its key is queued (the recommender's usage samples: the
        queue coalesces a claim's changes, and a sync sees only the last of them)."""
        self._unwatched_pods: dict[tuple[str, str], str] = {}
        """Pods the label-selected watch reported DELETED that a GET found alive (their label was
        removed), by (namespace, name) -> uid: read again at every relist until they are gone."""

    def observe(self, kind: str, event_type: str | None, body: Body, *,
                if_held: tuple[str, str] | None = None) -> bool:
        """Take in one watch event (`kind` in claim, egpu, gpu, class, pod, node, namespace).
        `if_held`: only while the picture still holds the object at that (resourceVersion, uid),
        checked under the picture's lock with the change (`Picture.observe_if_held`): the deletion
        a list implies (`Picture.unlisted`) must not undo a watch event taken in since. Whether the
        picture took it in (False: a pod still alive, or no longer held at `if_held`)."""
        self.picture.quotas.saw(versions.version_of(body))
        if kind == "namespace":
            self.weights.observe(event_type, body)  # no keys: a weight frees no room
            return True
        if kind == "quota":  # which namespaces have one; no keys: quota-held claims are rechecked
            meta = body.get("metadata") or {}
            self.picture.quotas.put((str(meta.get("namespace", "")), str(meta.get("name", ""))),
                                    event_type != "DELETED", version=versions.version_of(body))
            return True
        if kind == "class":
            # Every Bound claim of a class follows it (policing, resizability, recommendations),
            # and no key names them: the next resync looks at every object again.
            self.queue.settled.unsettle_all()
        if kind == "pod" and event_type == "DELETED" and not self._pod_gone(body):  # a GET: outside the lock
            return False  # still alive without the label: its claims stay in use
        if kind == "claim" and event_type != "DELETED" and self.on_claim is not None:
            self.on_claim(body)
        keys = (self.picture.observe(kind, event_type, body) if if_held is None
                else self.picture.observe_if_held(kind, event_type, body, if_held))
        if keys is None:
            return False
        self.queue.add_all(keys)
        return True

    def _pod_gone(self, body: Body) -> bool:
        """Whether a pod the watch reported DELETED is really gone (a GET finds nothing, or another pod
        of that name), being deleted or terminated; else it is remembered in `_unwatched_pods`.
        A failed GET counts as alive: releasing claims on a guess could give a running pod's card away."""
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if meta.get("deletionTimestamp") or not release.pod_is_running(body):
            self._unwatched_pods.pop(key, None)
            return True
        try:
            live = self.kube.get_pod(*key)
        except errors.NotFound:
            self._unwatched_pods.pop(key, None)
            return True
        except errors.ElasticGPUError as err:
            logger.warning("pod %s/%s: the watch reported it deleted and a GET failed (%s): its claims stay in"
                           " use until a relist can read it", key[0], key[1], err)
            self._unwatched_pods[key] = meta.get("uid", "")
            return False
        if self._gone(live, meta.get("uid", "")):
            self._unwatched_pods.pop(key, None)
            return True
        if key not in self._unwatched_pods:
            logger.warning("pod %s/%s no longer carries the label %s=true but still runs: its claims stay in use"
                           " until it is gone (read again at every relist)", key[0], key[1], names.LABEL_USES_CLAIMS)
        self._unwatched_pods[key] = meta.get("uid", "")
        return False

    def _namespaces_forbidden(self, err: errors.ApiError) -> bool:
        """Whether `err` is the 403 of an install that does not grant namespaces; if so it is said
        once (WARNING, with the fix) until namespaces can be read again."""
        if err.status != 403:
            return False
        with self._said_lock:
            said = self._said.get("namespaces") == NAMESPACES_FORBIDDEN
            self._said["namespaces"] = NAMESPACES_FORBIDDEN
        (logger.debug if said else logger.warning)("%s: %s", NAMESPACES_FORBIDDEN, err)
        return True

    def _merge_quotas(self, items: list[Body], list_version: str) -> None:
        """Replace which namespaces have a quota with a fresh list of quotas."""
        listed = {(str((b.get("metadata") or {}).get("namespace", "")), str((b.get("metadata") or {}).get("name", ""))):
                  versions.version_of(b) for b in items}
        self.picture.quotas.merge(listed, list_version)

    @staticmethod
    def _gone(live: Body, uid: str) -> bool:
        """A pod read back is not the one the watch knew (another uid), is being deleted or terminated."""
        meta = live.get("metadata") or {}
        return bool((uid and meta.get("uid") != uid) or meta.get("deletionTimestamp")
                    or not release.pod_is_running(live))

    def _read_unwatched_pods(self, listed: list[Body]) -> list[Body]:
        """The pods of `_unwatched_pods` still alive, read now, for a relist to merge beside the listed
        ones; the others are forgotten (the merge then drops them: their claims are released)."""
        names_listed = {((p.get("metadata") or {}).get("namespace", ""), (p.get("metadata") or {}).get("name", ""))
                        for p in listed}
        alive: list[Body] = []
        for key, uid in list(self._unwatched_pods.items()):
            if key in names_listed:
                self._unwatched_pods.pop(key, None)  # labelled again: the watch sees it
                continue
            try:
                live = self.kube.get_pod(*key)
            except errors.NotFound:
                self._unwatched_pods.pop(key, None)
                continue
            except errors.ElasticGPUError as err:
                logger.warning("pod %s/%s (no longer labelled): a GET failed (%s); kept as last seen", *key, err)
                continue  # the picture keeps it as last seen; the next relist asks again
            if self._gone(live, uid):
                self._unwatched_pods.pop(key, None)
            else:
                alive.append(live)
        return alive

    def relist(self, *, background: bool = False, start: bool = False, every: bool = True) -> dict[str, str]:
        """List everything and merge it into the picture (on start, before anything is bound,
        and on every relist); then queue every claim and ElasticGPU (`background`: behind the
        keys that events queued; `every` False: only the keys the merge returned, the periodic
        resync queuing what changed, `settled.SettledKeys`). `start`: the first list of a
        process, whose every key is new: all of them go behind the keys that events queue, so a
        claim created at the start (or after a standby took over) is not served after every
        object of the cluster (issue 49: 12 s behind ~20,000 keys at 8,000 cards,
        bench/README.md). See `Picture.merge_lists` for what a list may replace.
        Returns the resourceVersion each watched kind was listed at (a watch started from it
        misses nothing, so start-up lists each kind once); "" for a list that failed.

        Nodes, pods and namespaces may fail (RBAC may not grant them; a pod list may time out on a
        big cluster): the picture then keeps its last good view of them (namespaces: every weight
        1 until one list works)."""
        cards = self.list_cards()
        return self.list_claims(cards, background=background, start=start, every=every)

    def list_cards(self) -> Listed:
        """List what a safe placement reads, merge it and return it: nodes, GPUs (whose
        `status.allocations` hold every reservation, the commit point), classes and quotas. A
        fresh start binds new standalone claims from these alone (`process/early_start.py`)."""
        kube = self.kube
        listed_nodes = self._try("nodes", lambda: kube.list_collection(kube.collection_path("node")))
        nodes, nodes_version = listed_nodes if listed_nodes is not None else (None, "")
        gpus, gpus_version = kube.list_collection(kube.collection_path("gpu"))
        classes, classes_version = kube.list_collection(kube.collection_path("class"))
        listed_quotas = self._try("quotas", lambda: kube.list_collection(kube.collection_path("quota", self.namespace)))
        self.picture.merge_cards(nodes=nodes, gpus=gpus, gpus_version=gpus_version, classes=classes)
        if listed_quotas is not None:
            self._merge_quotas(*listed_quotas)
        for listed_at in (gpus_version, classes_version):
            self.picture.quotas.saw(int(listed_at) if listed_at.isdigit() else None)
        return {"gpu": gpus_version, "class": classes_version, "node": nodes_version,
                "quota": listed_quotas[1] if listed_quotas is not None else ""}

    def list_claims(self, cards: Listed, *, background: bool = False, start: bool = False, every: bool = True,
                    merged: Callable[[], object] | None = None) -> Listed:
        """The rest of `relist` after `list_cards` (whose versions are `cards`): list ElasticGPUs,
        claims (unless `cards` has their version: `waiting_claims.WaitingClaims` listed them all), pods and
        namespaces, merge them, call `merged` (the picture is whole), queue the keys; every
        kind's list version."""
        kube = self.kube
        egpus, egpus_version = kube.list_collection(kube.collection_path("egpu"))
        claims: list[Body] | None = None
        claims_version = cards.get("claim", "")
        if not claims_version:
            claims, claims_version = kube.list_collection(kube.collection_path("claim", self.namespace))
        listed_pods = self._try("pods", lambda: kube.list_collection(kube.collection_path("pod", self.namespace)))
        pods, pods_version = listed_pods if listed_pods is not None else (None, "")
        listed_namespaces = self._try("namespaces", lambda: kube.list_collection(kube.collection_path("namespace")))
        if pods is not None and self._unwatched_pods:
            pods = pods + self._read_unwatched_pods(pods)
        keys = self.picture.merge_claims(egpus=egpus, egpus_version=egpus_version, claims=claims,
                                         claims_version=claims_version, pods=pods, pods_version=pods_version)
        if listed_namespaces is not None:
            self.weights.merge(listed_namespaces)
        for listed_at in (egpus_version, claims_version, pods_version):
            self.picture.quotas.saw(int(listed_at) if listed_at.isdigit() else None)
        if merged is not None:
            merged()
        for key in keys:
            self.queue.add(key, background=start)
        for key in self.picture.all_keys() if every else ():
            self.queue.add(key, background=background or start)
        return {**cards, "egpu": egpus_version, "claim": claims_version, "pod": pods_version,
                "namespace": listed_namespaces[1] if listed_namespaces is not None else ""}

    def _try(self, what: str, call: Callable[[], T]) -> T | None:
        """`call()`, or None when it fails: said once per reason (an unreachable server at DEBUG:
        `KubeApi.reachability` says that once)."""
        try:
            answer = call()
        except errors.ApiError as err:
            if what == "namespaces" and self._namespaces_forbidden(err):
                return None
            reason = str(err)
            if self._said.get(what) == reason or (isinstance(err, errors.ApiUnavailable) and err.status == 0):
                logger.debug("list of %s failed again; keeping the last good view of them: %s", what, err)
            else:
                logger.warning("list of %s failed; keeping the last good view of them: %s", what, err)
            self._said[what] = reason
            return None
        self._said.pop(what, None)
        return answer

    def watch_kind(self, kind: str, stop: threading.Event, *, timeout_s: int = 60, resource_version: str = "",
                   read_timeout_s: float | None = None) -> None:
        """Watch one kind until `stop` is set (blocking; run it on its own thread): from
        `resource_version` (what a list returned), or after a list of its own when "". The
        server ends each watch after `timeout_s`; a connection silent for `read_timeout_s`
        (default: `timeout_s` plus a margin) is given up and reopened.

        Failures never end the loop. Each is logged once (WARNING) until the watch works again;
        an unreachable server at DEBUG only (`KubeApi.reachability` says it once); a kind whose
        CRD is missing (404) is waited for, with backoff."""
        kube = self.kube
        path = kube.collection_path(kind, self.namespace)
        loop = f"watch-{kind}"
        backoff = 0.5
        failures = 0
        said = ""
        while not stop.is_set():
            self.liveness.step(loop)
            try:
                if not resource_version:
                    items, resource_version = kube.list_collection(path)
                    self._start_over(kind, items, resource_version)
                for event in kube.watch(path, resource_version=resource_version, timeout_s=timeout_s,
                                        read_timeout_s=read_timeout_s):
                    if stop.is_set():
                        return
                    self.liveness.step(loop)
                    kind_of_event = event.get("type")
                    body = event.get("object") or {}
                    if kind_of_event == "ERROR":  # 410 Gone (expired) or another failure: list again
                        logger.info("watch of %s: %s; listing again", kind, body.get("message"))
                        resource_version = ""
                        break
                    resource_version = str((body.get("metadata") or {}).get("resourceVersion") or resource_version)
                    failures = 0  # the watch works: a break after this is a fresh one
                    if said:
                        logger.info("watch of %s works again", kind)
                        said = ""
                        if kind == "namespace":
                            self._said.pop("namespaces", None)
                    if kind == "quota":
                        self.picture.quotas.mark(True)  # reopened from where it was: nothing missed
                    if kind_of_event != "BOOKMARK":
                        self.observe(kind, kind_of_event, body)
                    elif kind == "quota":
                        self.picture.quotas.advance(versions.version_of(body))
                backoff, failures = 0.5, 0
            except Exception as err:  # nothing ends the watch; the resync repairs what it missed
                if stop.is_set():
                    return  # stopping: the client closed its watch under it (`Transport.close`), nothing to say
                failures += 1
                if kind == "quota":
                    self.picture.quotas.mark(False)  # the quota guard lists quotas itself meanwhile
                if isinstance(err, errors.ApiError):
                    if err.status == 410 or failures >= RELIST_AFTER_FAILURES:
                        resource_version = ""
                else:  # a missing CRD (404) or an object that cannot be taken in: start over with a list
                    resource_version = ""
                if kind == "namespace" and isinstance(err, errors.ApiError) and self._namespaces_forbidden(err):
                    said = NAMESPACES_FORBIDDEN  # said once for list and watch together
                else:
                    said = self._say(kind, err, backoff, resource_version, said)
                stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _start_over(self, kind: str, items: list[Body], list_version: str) -> None:
        """Take in a fresh list of one kind as its watch's new start (client-go's Replace): what
        the picture holds and the list no longer has was deleted while no watch ran (a 410, a
        long outage), and is taken in as DELETED before the listed objects as ADDED. Each deletion
        is checked again under the picture's lock with the change: a write answer or the relist's
        event taken in since the list was compared (the name created again, a newer copy) is kept."""
        if kind == "quota":
            self._merge_quotas(items, list_version)
        elif kind == "namespace":
            self.weights.merge((items, list_version))
        for gone in self.picture.unlisted(kind, items, list_version):
            # Checked again with the change: an event another thread took in since is kept.
            self.observe(kind, "DELETED", versions.deleted_at(gone.body, list_version), if_held=gone.held)
        if kind == "node":  # a complete view: a node missing from it is gone
            self.picture.nodes.merge(items)
        for body in items:
            self.observe(kind, "ADDED", body)

    # -- the periodic relist's seam (`metadata_relist.RelistFeed`); the list functions above call
    # the private names, the relist reaches no private of the informer

    def keep_last_good(self, what: str, call: Callable[[], T]) -> T | None:
        """`call()` (a list of the optional kind `what`: nodes, pods, namespaces, quotas), or None
        when it fails, said once per reason: one voice for the start-up lists and the relist."""
        return self._try(what, call)

    def merge_quotas(self, items: list[Body], list_version: str) -> None:
        """Replace which namespaces have a quota with a fresh list of quotas (metadata is enough)."""
        self._merge_quotas(items, list_version)

    @staticmethod
    def _say(kind: str, err: Exception, backoff: float, resource_version: str, said: str) -> str:
        """Log a watch failure once per reason; returns the reason now said."""
        source = f"resourceVersion {resource_version}" if resource_version else "a new list"
        if isinstance(err, errors.ApiUnavailable) and err.status == 0:
            logger.debug("watch of %s: no answer, retrying in %.1fs from %s: %s", kind, backoff, source, err)
            return said
        reason = f"{type(err).__name__}: {err}"
        if reason == said:
            logger.debug("watch of %s failed again, retrying in %.1fs from %s: %s", kind, backoff, source, err)
        elif isinstance(err, errors.NotFound):
            logger.warning("watch of %s: its CustomResourceDefinition is not installed (404); waiting for it"
                           " (kubectl apply -f crds/)", kind)
        elif isinstance(err, errors.ElasticGPUError):
            logger.warning("watch of %s failed, retrying with backoff from %s: %s", kind, source, err)
        else:
            logger.error("watch of %s failed (a bug), retrying from a new list: %s", kind, reason, exc_info=err)
        return reason

    def start(self, stop: threading.Event, *, timeout_s: int = 60, listed: Listed | None = None,
              kinds: tuple[str, ...] = KINDS) -> list[threading.Thread]:
        """One daemon thread per watched kind (of `kinds`); `listed`: the resourceVersions `relist`
        returned, to watch from (a kind missing or "" lists first)."""
        threads = []
        for kind in kinds:
            self.liveness.expect(f"watch-{kind}")
            kwargs = {"timeout_s": timeout_s, "resource_version": (listed or {}).get(kind, "")}
            thread = threading.Thread(target=self.watch_kind, args=(kind, stop), kwargs=kwargs,
                                      name=f"watch-{kind}", daemon=True)
            thread.start()
            threads.append(thread)
        return threads
