"""The elasticgpu controller: binds ElasticGPUClaims to ElasticGPUs, provisions them, releases them.

Rooms, one package each, from the bottom up; a room imports only rooms below it (import-linter
contracts in pyproject.toml), so there are no cycles between rooms:
- `decisions/`: pure decisions: `binder` (the state machine), `release` and `resync` (release and
  repair), `gpu_health` (a GPU ready for new reservations, or failed for good), `pod_gate` (a
  gated pod's next step). No I/O, no picture: its objects come in as parameters;
- `picture/`: what the watches delivered, with its indexes (`picture`, `reading`), the GPU ledger
  and status bodies (`reservations`), `versions`, `records`, `compact`, `pod_index`. No I/O;
- `edge/`: the only room that talks to the API server: `kube`, `transport` (its HTTP
  connections), `reachability` (one WARNING when the server stops answering, one INFO when it is
  back), `leader` (leader election on a Lease). Independent of the picture;
- `flow/`: from an event to a write, in rooms by the behaviour each carries out (its `__init__`
  draws them): `machinery/` (watches, queue, Events, failures, liveness), `binding/`, `groups/`,
  `preemption/`, `elastic/` (resize, recommendations), beside `quota_guard`, `mig_binding`, and on
  top `claim_sync` (a claim's next step), `repair` and `gpu_sync`;
- `pods/`: pods that use claims: `pod_sync`, `pod_placement`, `pod_neighbours`, `inline_claims`;
- `process/`: the rooms wired into one process: `reconciling` (`Controller`), `worker`, `startup`
  (`run_controller`), `starting`, `operator` (kopf wiring), `operability`, `health`, `garbage`
  (log formats: `elasticgpu.logs`, shared with the webhook).
Beside the rooms, used by all and importing none: `settings`, `errors`, `metrics`; and
`admission/`, the webhook (its own process). Each room's `__init__` says what it may touch.
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
    `process.startup.run_controller`. Imported lazily: `elasticgpu --help` must not load the client."""
    from elasticgpu.controller.process import startup

    startup.run_controller(kubeconfig=kubeconfig, namespace=namespace, context=context, settings=settings, stop=stop)
