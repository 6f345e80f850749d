"""Watches with the controller's own client: list, then watch from the list's resourceVersion,
and feed every object to `Controller.observe`.

This is the default watch engine (`WatchSettings.engine = "client"`). kopf's (`operator.py`)
does the same job, but its per-event machinery (a deep copy of every body for its diff base,
cause detection, per-object worker tasks) cost about 70% of the controller's CPU under a burst
of binds (py-spy, `bench/binding.py`), more than the API server spent on the binds themselves.
Here an event costs one JSON parse and one `observe`.

A watch that ends (server timeout) is reopened from the last resourceVersion; one that expired
(410 Gone, or any error) lists again. Deletions missed while not watching are repaired by the
periodic resync, which rebuilds the picture from lists.
"""

from __future__ import annotations

import logging
import threading

from elasticgpu.controller import errors
from elasticgpu.controller.kube import KubeApi
from elasticgpu.controller.reconciling import Controller

logger = logging.getLogger(__name__)

KINDS = ("claim", "egpu", "gpu", "class", "pod")


def watch_kind(controller: Controller, kube: KubeApi, kind: str, stop: threading.Event, *,
               timeout_s: int = 60, namespace: str | None = None) -> None:
    """List and watch one kind until `stop` is set (blocking; run it on its own thread)."""
    path = kube.collection_path(kind, namespace)
    resource_version = ""
    backoff = 0.5
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
                if kind_of_event != "BOOKMARK":
                    controller.observe(kind, kind_of_event, body)
            backoff = 0.5
        except errors.ApiError as err:
            logger.warning("watch of %s failed, retrying in %.1fs: %s", kind, backoff, err)
            resource_version = ""
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
