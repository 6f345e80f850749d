"""The elasticgpu controller: binds ElasticGPUClaims to ElasticGPUs, provisions them, releases them.

Modules: `binder` (pure decisions: the state machine), `release` and `resync` (pure decisions of
release and repair), `reservations` (the capacity picture and GPU status bodies), `provisioner`
(the ElasticGPU made for a claim), `reconciling` (picture, queue, executor), `kube` (the only
module that talks to the API server), `operator` (kopf wiring), `events`, `settings`, `errors`.
"""

from __future__ import annotations

import logging
import threading

from elasticgpu.controller.settings import ApiSettings, BindingSettings, ControllerSettings, ResyncSettings

__all__ = ["ApiSettings", "BindingSettings", "ControllerSettings", "ResyncSettings", "run_controller"]


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
    `settings` default to `ControllerSettings.from_env()`.
    """
    import kopf

    from elasticgpu.controller.kube import KubeApi
    from elasticgpu.controller.operator import build_registry
    from elasticgpu.controller.reconciling import Controller

    settings = settings or ControllerSettings.from_env()
    kube = KubeApi.from_kubeconfig(kubeconfig, context=context, settings=settings.api)
    controller = Controller(kube, settings, namespace=namespace)
    stop = stop or threading.Event()
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
