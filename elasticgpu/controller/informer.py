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
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from elasticgpu.controller import errors
from elasticgpu.controller.kube import KubeApi
from elasticgpu.controller.liveness import Liveness
from elasticgpu.controller.picture import Body, Picture
from elasticgpu.controller.workqueue import WorkQueue

logger = logging.getLogger(__name__)

KINDS = ("claim", "egpu", "gpu", "class", "pod", "node")
RELIST_AFTER_FAILURES = 3
"""Failed attempts in a row to reopen a watch from its resourceVersion before listing again."""


class Informer:
    """Feeds `picture` from lists and watches of `kube`; queues what each change wakes."""

    def __init__(self, *, kube: KubeApi, picture: Picture, queue: WorkQueue, namespace: str | None,
                 liveness: Liveness | None = None) -> None:
        """`namespace` limits claims and pods to one namespace (None: all); each watch loop
        steps `liveness` (as `watch-<kind>`)."""
        self.liveness = liveness or Liveness()
        self.kube = kube
        self.picture = picture
        self.queue = queue
        self.namespace = namespace

    def observe(self, kind: str, event_type: str | None, body: Body) -> None:
        """Take in one watch event (`kind` in claim, egpu, gpu, class, pod, node)."""
        self.queue.add_all(self.picture.observe(kind, event_type, body))

    def relist(self, *, background: bool = False) -> None:
        """List everything and merge it into the picture (on start, before anything is bound,
        and on every relist); then queue every claim and ElasticGPU (`background`: behind the
        keys that events queued). See `Picture.merge_lists` for what a list may replace."""
        kube = self.kube
        nodes = self._try(kube.list_nodes) or []
        gpus, gpus_version = kube.list_collection(kube.collection_path("gpu"))
        egpus, egpus_version = kube.list_collection(kube.collection_path("egpu"))
        classes = kube.list_classes()
        claims, claims_version = kube.list_collection(kube.collection_path("claim", self.namespace))
        pods = self._try(lambda: kube.list_pods(self.namespace)) or []
        keys = self.picture.merge_lists(nodes=nodes, gpus=gpus, gpus_version=gpus_version, egpus=egpus,
                                        egpus_version=egpus_version, classes=classes, claims=claims,
                                        claims_version=claims_version, pods=pods)
        self.queue.add_all(keys)
        for key in self.picture.all_keys():
            self.queue.add(key, background=background)

    @staticmethod
    def _try(call: Callable[[], Any]) -> Any:
        try:
            return call()
        except errors.ApiError as err:
            logger.warning("optional list failed: %s", err)
            return None

    def watch_kind(self, kind: str, stop: threading.Event, *, timeout_s: int = 60) -> None:
        """List and watch one kind until `stop` is set (blocking; run it on its own thread)."""
        kube = self.kube
        path = kube.collection_path(kind, self.namespace)
        loop = f"watch-{kind}"
        resource_version = ""
        backoff = 0.5
        failures = 0
        while not stop.is_set():
            self.liveness.step(loop)
            try:
                if not resource_version:
                    items, resource_version = kube.list_collection(path)
                    for body in items:
                        self.observe(kind, "ADDED", body)
                for event in kube.watch(path, resource_version=resource_version, timeout_s=timeout_s):
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
                    if kind_of_event != "BOOKMARK":
                        self.observe(kind, kind_of_event, body)
                backoff, failures = 0.5, 0
            except errors.ApiError as err:
                failures += 1
                if err.status == 410 or failures >= RELIST_AFTER_FAILURES:
                    resource_version = ""
                logger.warning("watch of %s failed, retrying in %.1fs from %s: %s", kind, backoff,
                               f"resourceVersion {resource_version}" if resource_version else "a new list", err)
                stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
            except Exception:  # a bad object must not end the watch; the resync repairs what it missed
                logger.exception("watch of %s failed; listing again", kind)
                resource_version = ""
                stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def start(self, stop: threading.Event, *, timeout_s: int = 60) -> list[threading.Thread]:
        """One daemon thread per watched kind."""
        threads = []
        for kind in KINDS:
            self.liveness.expect(f"watch-{kind}")
            thread = threading.Thread(target=self.watch_kind, args=(kind, stop), kwargs={"timeout_s": timeout_s},
                                      name=f"watch-{kind}", daemon=True)
            thread.start()
            threads.append(thread)
        return threads
