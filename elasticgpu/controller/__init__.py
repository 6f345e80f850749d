"""The elasticgpu controller: binds ElasticGPUClaims to ElasticGPUs, provisions them, releases them.

Modules, one role each:
- pure decisions: `binder` (the state machine), `release` and `resync` (release and repair),
  `gpu_health` (a GPU ready for new reservations, or failed for good: heartbeat, fatal XID);
- the picture: `picture` (what the watches delivered, with its indexes), `reservations` (the
  GPU ledger and status bodies), `versions` (resourceVersion order, deletion tombstones);
- the flow: `informer` (list and watch; feeds the picture), `workqueue`, `worker` (the loop),
  `claim_sync`, `elasticgpu_sync`, `gpu_sync` (a GPU's readiness: its agent's heartbeat, a
  delayed recheck, the `Ready` condition), `commit` (the reservation commit), `handoff` (writes after
  the commit point, on a pool), `repair` (the periodic resync), `provisioner` (the ElasticGPU
  made for a claim), `events`, `failures` (what a failed sync does: backoff, logged once),
  `liveness` (threads alive and loops stepping: the /healthz check);
- pods that use claims: `pod_sync` (a gated pod, from its annotations to its gate lift),
  `pod_gate` (pure: the next step, the lift patch), `pod_placement` (pure: the node of a pod's
  WaitForFirstConsumer claims), `inline_claims` (claims owned by pods), `pod_index` (the pods
  and nodes of the picture);
- the process: `reconciling` (the roles wired into one `Controller`), `startup`
  (`run_controller`), `operator` (kopf wiring), `garbage` (garbage-collector tuning);
- the edge: `kube` (the only module that talks to the API server), `transport` (its HTTP
  connections), `reachability` (one WARNING when the server stops answering, one INFO when it
  is back); `settings`, `errors`.
"""

from __future__ import annotations

import threading

from elasticgpu.controller.settings import (
    ApiSettings,
    BindingSettings,
    ControllerSettings,
    ResyncSettings,
    WatchSettings,
)

__all__ = ["ApiSettings", "BindingSettings", "ControllerSettings", "ResyncSettings", "WatchSettings", "run_controller"]


def run_controller(
    *,
    kubeconfig: str | None = None,
    namespace: str | None = None,
    context: str | None = None,
    settings: ControllerSettings | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Run the controller until `stop` is set or the process is signalled (blocking); see
    `startup.run_controller`. Imported lazily: `elasticgpu --help` must not load the client."""
    from elasticgpu.controller.process import startup

    startup.run_controller(kubeconfig=kubeconfig, namespace=namespace, context=context, settings=settings, stop=stop)
