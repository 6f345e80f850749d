"""Watches with the controller's own client: list, then watch from the list's resourceVersion,
and feed every object to `Controller.observe`.

This is the default watch engine (`WatchSettings.engine = "client"`). kopf's (`operator.py`)
does the same job, but its per-event machinery (a deep copy of every body for its diff base,
cause detection, per-object worker tasks) cost about 70% of the controller's CPU under a burst
of binds (py-spy, `bench/binding.py`), more than the API server spent on the binds themselves.
Here an event costs one JSON parse and one `observe`.

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

from elasticgpu.controller import errors
from elasticgpu.controller.kube import KubeApi
from elasticgpu.controller.reconciling import Controller

logger = logging.getLogger(__name__)

KINDS = ("claim", "egpu", "gpu", "class", "pod")
RELIST_AFTER_FAILURES = 3
"""Failed attempts in a row to reopen a watch from its resourceVersion before listing again."""


def watch_kind(controller: Controller, kube: KubeApi, kind: str, stop: threading.Event, *,
               timeout_s: int = 60, namespace: str | None = None) -> None:
    """List and watch one kind until `stop` is set (blocking; run it on its own thread)."""
    path = kube.collection_path(kind, namespace)
    resource_version = ""
    backoff = 0.5
    failures = 0
    while not stop.is_set():
        try:
            if not resource_version:
                items, resource_version = kube.list_collection(path)
                for body in items:
                    controller.observe(kind, "ADDED", body)
            for event in kube.watch(path, resource_version=resource_version, timeout_s=timeout_s):
                if stop.is_set():
                    return
                kind_of_event = event.get("type")
                body = event.get("object") or {}
                if kind_of_event == "ERROR":  # 410 Gone (expired) or another failure: list again
                    logger.info("watch of %s: %s; listing again", kind, body.get("message"))
                    resource_version = ""
                    break
                resource_version = str((body.get("metadata") or {}).get("resourceVersion") or resource_version)
                failures = 0  # the watch works: a break after this is a fresh one
                if kind_of_event != "BOOKMARK":
                    controller.observe(kind, kind_of_event, body)
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


def start_watches(controller: Controller, kube: KubeApi, stop: threading.Event, *, timeout_s: int = 60,
                  namespace: str | None = None) -> list[threading.Thread]:
    """One daemon thread per watched kind."""
    threads = []
    for kind in KINDS:
        thread = threading.Thread(target=watch_kind, args=(controller, kube, kind, stop),
                                  kwargs={"timeout_s": timeout_s, "namespace": namespace}, name=f"watch-{kind}",
                                  daemon=True)
        thread.start()
        threads.append(thread)
    return threads
