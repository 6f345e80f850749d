"""The elasticgpu controller: binds ElasticGPUClaims to ElasticGPUs, provisions them, releases them.

Modules: `binder` (pure decisions: the state machine), `release` and `resync` (pure decisions of
release and repair), `reservations` (the capacity picture and GPU status bodies), `versions`
(resourceVersion order, deletion tombstones), `provisioner` (the ElasticGPU made for a claim),
`reconciling` (picture, queue, executor), `kube` (the only module that talks to the API server),
`transport` (its HTTP connections), `operator` (kopf wiring and garbage-collector settings),
`watching` (the default watches), `events`, `settings`, `errors`.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from elasticgpu.controller.settings import (
    ApiSettings,
    BindingSettings,
    ControllerSettings,
    ResyncSettings,
    WatchSettings,
)

if TYPE_CHECKING:
    from elasticgpu.controller.kube import KubeApi
    from elasticgpu.controller.reconciling import Controller

__all__ = ["ApiSettings", "BindingSettings", "ControllerSettings", "ResyncSettings", "WatchSettings", "run_controller"]


def run_controller(
    *,
    kubeconfig: str | None = None,
    namespace: str | None = None,
    context: str | None = None,
    settings: ControllerSettings | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Run the controller until `stop` is set or the process is signalled (blocking).

    `kubeconfig` None means in-cluster config, then $KUBECONFIG / ~/.kube/config. `namespace`
    restricts the claims (and pods) watched to one namespace; None watches all namespaces.
    `settings` default to `ControllerSettings.from_env()`; `settings.watch.engine` picks the
    watches: the controller's own client (default, `watching.py`) or kopf (`operator.py`).
    """
    import kopf

    from elasticgpu.controller.kube import KubeApi
    from elasticgpu.controller.operator import build_registry
    from elasticgpu.controller.reconciling import Controller

    settings = settings or ControllerSettings.from_env()
    kube = KubeApi.from_kubeconfig(kubeconfig, context=context, settings=settings.api)
    controller = Controller(kube, settings, namespace=namespace)
    stop = stop or threading.Event()
    if settings.watch.engine == "client":
        try:
            _run_with_client_watches(controller, kube, namespace=namespace, stop=stop)
        finally:
            stop.set()
            controller.close()
            kube.close()
        return
    registry = build_registry(controller, kube, stop)
    logging.getLogger("kopf").setLevel(logging.WARNING)
    try:
        kopf.run(
            registry=registry,
            standalone=True,
            clusterwide=namespace is None,
            namespaces=[namespace] if namespace else (),
            stop_flag=stop,
        )
    finally:
        stop.set()
        controller.close()
        kube.close()


def _run_with_client_watches(controller: Controller, kube: KubeApi, *, namespace: str | None,
                             stop: threading.Event) -> None:
    """Rebuild the picture (retrying until the API server answers), then watch, bind and resync
    until `stop` is set; SIGTERM and SIGINT set it when this is the main thread."""
    import signal

    from elasticgpu.controller import errors, watching
    from elasticgpu.controller.operator import collect_and_freeze, resync_loop, take_over_full_collections

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    backoff = 0.5
    while not stop.is_set():
        try:
            controller.rebuild()
            break
        except errors.ApiError as err:
            logging.getLogger(__name__).warning("cannot list the cluster yet, retrying in %.1fs: %s", backoff, err)
            stop.wait(backoff)
            backoff = min(backoff * 2, 30.0)
    if stop.is_set():
        return
    take_over_full_collections()
    collect_and_freeze()
    watching.start_watches(controller, kube, stop, timeout_s=controller.settings.watch.timeout_s,
                           namespace=namespace)
    threading.Thread(target=controller.run_worker, args=(stop,), name="binder", daemon=True).start()
    threading.Thread(target=resync_loop, args=(controller, stop), name="resync", daemon=True).start()
    logging.getLogger(__name__).info("controller ready: %d GPUs, picture rebuilt", len(controller.ledger.gpu_names()))
    stop.wait()
