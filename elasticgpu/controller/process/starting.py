"""Starting: the first list that fills the picture, and the threads started after it.

Both watch engines share these: `startup` (the controller's own watches) and `operator` (kopf's
startup handler). They live here so that `startup` and `operator` never import each other.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from elasticgpu.controller import errors
from elasticgpu.controller.process import garbage
from elasticgpu.controller.process.reconciling import Controller

logger = logging.getLogger(__name__)
T = TypeVar("T")


def start_worker(controller: Controller, stop: threading.Event) -> threading.Thread:
    """Start the worker (a daemon thread that ends when `stop` is set)."""
    thread = threading.Thread(target=controller.run_worker, args=(stop,), name="binder", daemon=True)
    thread.start()
    controller.liveness.track(thread)
    return thread


def start_threads(controller: Controller, stop: threading.Event, *,
                  worker: bool = True) -> list[threading.Thread]:
    """After the first list: take over full collections, freeze the picture, and start the
    worker (unless `worker` is False: an early start started it already) and the resync
    (daemon threads that end when `stop` is set)."""
    garbage.take_over_full_collections()
    garbage.collect_and_freeze()
    started = [start_worker(controller, stop)] if worker else []
    threads = [
        threading.Thread(target=controller.repair.run, args=(stop,), kwargs={"after": garbage.collect_and_freeze},
                         name="resync", daemon=True),
        threading.Thread(target=controller.resource_claims.run, args=(stop,), name="watch-resourceclaim",
                         daemon=True),
    ]
    autoscale = controller.settings.autoscale
    if autoscale.enabled or autoscale.protect_nodes:
        threads.append(threading.Thread(target=controller.node_autoscaling.run, args=(stop,), name="node-autoscaling",
                                        daemon=True))
    for thread in threads:
        thread.start()
        controller.liveness.track(thread)
    logger.info("controller ready: %d GPUs, picture rebuilt", len(controller.ledger.gpu_names()))
    return started + threads


def first_list(controller: Controller, stop: threading.Event) -> dict[str, str] | None:
    """Fill the picture with one list of each kind, retrying with backoff (up to 30 s) until it
    works; the resourceVersions listed at (`Informer.relist`), or None when `stop` was set."""
    return listing(stop, lambda: controller.rebuild(start=True))


def listing(stop: threading.Event, lists: Callable[[], T]) -> T | None:
    """`lists()` (a first list), retried with backoff (up to 30 s) until it works, with the
    collector paused; None when `stop` was set.

    Waiting is said once per reason, never as a crash: CRDs not installed yet (404) wait for
    `kubectl apply -f crds/`; an unreachable server is said by `KubeApi.reachability`; any
    other refusal (RBAC, a 5xx) is logged with the server's message."""
    backoff = 0.5
    said = ""
    while not stop.is_set():
        try:
            with garbage.paused():  # the picture is all survivors: collecting it is pure cost
                listed = lists()
        except Exception as err:  # never a crash loop: whatever it is, wait and try again
            reason = f"{type(err).__name__}: {err}"
            if reason == said or (isinstance(err, errors.ApiUnavailable) and err.status == 0):
                logger.debug("cannot list the cluster yet, retrying in %.1fs: %s", backoff, err)
            elif isinstance(err, errors.NotFound):
                logger.warning("the elasticgpu.io CustomResourceDefinitions are not installed (%s); waiting for"
                               " them: kubectl apply -f crds/", err)
            elif isinstance(err, errors.ElasticGPUError):
                logger.warning("cannot list the cluster yet, retrying with backoff: %s", err)
            else:
                logger.error("cannot list the cluster (a bug?), retrying with backoff: %s", reason, exc_info=err)
            said = reason
            stop.wait(backoff)
            backoff = min(backoff * 2, 30.0)
            continue
        if said:
            logger.info("the cluster answered the first list; starting")
        return listed
    return None
