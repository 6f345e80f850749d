"""Start-up: build the controller, fill its picture, start its threads, run until stopped.

`run_controller` is the process's entry point (`elasticgpu controller`). With the default
watch engine ("client") it lists every kind, starts one watch thread per kind
(`Informer.start`), the worker and the resync; with "kopf", kopf's watches feed the picture and
its startup handler calls `start_threads` (`operator.py`).
"""

from __future__ import annotations

import logging
import signal
import threading

from elasticgpu.controller import errors
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.edge.leader import LeaderSettings
from elasticgpu.controller.process import garbage
from elasticgpu.controller.process.operability import Operability
from elasticgpu.controller.process.reconciling import Controller
from elasticgpu.controller.settings import ControllerSettings

logger = logging.getLogger(__name__)


def run_controller(
    *,
    kubeconfig: str | None = None,
    namespace: str | None = None,
    context: str | None = None,
    settings: ControllerSettings | None = None,
    stop: threading.Event | None = None,
    leader: LeaderSettings | None = None,
    health_port: int | None = None,
) -> None:
    """Run the controller until `stop` is set or the process is signalled (blocking).

    `leader`: elect a leader on a Lease first and bind only while leading (None: bind at once);
    `health_port`: serve /healthz, /readyz and /metrics there (0: a free port; None: none).
    A leader that loses its Lease exits with status 1 (`operability.py`).

    `kubeconfig` None means in-cluster config, then $KUBECONFIG / ~/.kube/config. `namespace`
    restricts the claims (and pods) watched to one namespace; None watches all namespaces.
    `settings` default to `ControllerSettings.from_env()`; `settings.watch.engine` picks the
    watches: the controller's own client (default, `informer.py`) or kopf (`operator.py`).
    """
    settings = settings or ControllerSettings.from_env()
    kube = KubeApi.from_kubeconfig(kubeconfig, context=context, settings=settings.api)
    controller = Controller(kube, settings, namespace=namespace)
    stop = stop or threading.Event()
    operability = Operability(controller, kube, leader=leader, health_port=health_port)
    try:
        operability.start()
        if not operability.lead(stop):
            return
        if settings.watch.engine == "client":
            _run_with_client_watches(controller, stop=stop)
        else:
            _run_with_kopf(controller, namespace=namespace, stop=stop)
    finally:
        stop.set()
        operability.close()
        controller.close()
        kube.close()
    operability.exit_if_lost()


def start_threads(controller: Controller, stop: threading.Event) -> list[threading.Thread]:
    """After the first list: take over full collections, freeze the picture, and start the
    worker and the resync (daemon threads that end when `stop` is set)."""
    garbage.take_over_full_collections()
    garbage.collect_and_freeze()
    threads = [
        threading.Thread(target=controller.run_worker, args=(stop,), name="binder", daemon=True),
        threading.Thread(target=controller.repair.run, args=(stop,), kwargs={"after": garbage.collect_and_freeze},
                         name="resync", daemon=True),
    ]
    for thread in threads:
        thread.start()
        controller.liveness.track(thread)
    logger.info("controller ready: %d GPUs, picture rebuilt", len(controller.ledger.gpu_names()))
    return threads


def first_list(controller: Controller, stop: threading.Event) -> dict[str, str] | None:
    """Fill the picture with one list of each kind, retrying with backoff (up to 30 s) until it
    works; the resourceVersions listed at (`Informer.relist`), or None when `stop` was set.

    Waiting is said once per reason, never as a crash: CRDs not installed yet (404) wait for
    `kubectl apply -f crds/`; an unreachable server is said by `KubeApi.reachability`; any
    other refusal (RBAC, a 5xx) is logged with the server's message."""
    backoff = 0.5
    said = ""
    while not stop.is_set():
        try:
            listed = controller.rebuild()
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


def _run_with_client_watches(controller: Controller, *, stop: threading.Event) -> None:
    """List every kind once (retrying until the API server answers), then watch from those
    lists, bind and resync until `stop` is set; SIGTERM and SIGINT set it when this is the main
    thread."""
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    listed = first_list(controller, stop)
    if listed is None:
        return
    for thread in controller.informer.start(stop, timeout_s=controller.settings.watch.timeout_s, listed=listed):
        controller.liveness.track(thread)
    start_threads(controller, stop)
    stop.wait()


def _run_with_kopf(controller: Controller, *, namespace: str | None, stop: threading.Event) -> None:
    import kopf

    from elasticgpu.controller.process.operator import build_registry

    registry = build_registry(controller, stop)
    logging.getLogger("kopf").setLevel(logging.WARNING)
    kopf.run(
        registry=registry,
        standalone=True,
        clusterwide=namespace is None,
        namespaces=[namespace] if namespace else (),
        stop_flag=stop,
    )
