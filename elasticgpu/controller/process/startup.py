"""Start-up: build the controller, fill its picture, start its threads, run until stopped.

`run_controller` is the process's entry point (`elasticgpu controller`). With the default
watch engine ("client") it lists every kind, starts one watch thread per kind
(`Informer.start`), the worker and the resync; with "kopf", kopf's watches feed the picture and
its startup handler calls `starting.start_threads` (`operator.py`); both engines share `starting`.
"""

from __future__ import annotations

import logging
import signal
import threading

from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.edge.leader import LeaderSettings
from elasticgpu.controller.process import early_start, malloc_tuning
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
    health_host: str = "0.0.0.0",
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
    malloc_tuning.tune()  # before the threads start: see malloc_tuning.py for why
    settings = settings or ControllerSettings.from_env()
    kube = KubeApi.from_kubeconfig(kubeconfig, context=context, settings=settings.api)
    controller = Controller(kube, settings, namespace=namespace)
    stop = stop or threading.Event()
    operability = Operability(controller, kube, leader=leader, health_port=health_port, health_host=health_host)
    try:
        operability.start()
        malloc_tuning.Trimming(stop).start()
        if settings.watch.engine == "client":
            _run_with_client_watches(controller, operability, stop=stop)
        else:
            if not operability.lead(stop):
                return
            _run_with_kopf(controller, namespace=namespace, stop=stop)
    finally:
        stop.set()
        operability.close()
        controller.close()
        kube.close()
    operability.exit_if_lost()


def _run_with_client_watches(controller: Controller, operability: Operability, *, stop: threading.Event) -> None:
    """List the cluster and watch it, wait for the Lease, then bind and resync until `stop` is
    set; SIGTERM and SIGINT set it when this is the main thread. The cards are listed first and
    new standalone claims bind while the rest is listed (`early_start.py`).

    The list and the watches come before the Lease (issue 49): a standby keeps its picture as
    current as the leader's, so when it takes over it binds at once instead of listing every
    kind first (seconds at fleet size, on top of the lease). It only reads while it stands by:
    the worker, the resync and every writer start once it leads. Its queue collects the keys the
    list and the watches woke (a set: one entry per object), which the worker then processes, as
    after a fresh start's list."""
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    early_start.run(controller, operability, stop)


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
