"""What an operator gets around one controller: leader election, `/healthz`, `/readyz` and
`/metrics`. `startup.run_controller` builds one `Operability`, starts it, waits in `lead` until
this process may bind, and closes it on the way out.

    /healthz   fails when a controller thread died or a loop made no progress (`Liveness`), or
               when this process leads but its renewals of the Lease stopped (`LeaderElector`)
    /readyz    a standby is ready (it serves its purpose: waiting) unless the Lease cannot be taken
               at all (no Lease API, no such namespace: a 404); a leader once its worker runs
    /metrics   `ControllerMetrics`: queue depth, leadership and process_* are fed here; the
               counters of binds, provisions, releases, conflicts, API errors and the sync
               latency histogram are fed by the modules where those happen (`controller.metrics`
               is not passed to them yet: issue 8 item 6)

A leader that loses its Lease stops its work at once (`stop` is set) and the process exits
with status 1 (`exit_if_lost`), so that its Pod restarts as a standby, as client-go's
controllers do: nothing of the old leader's picture is trusted after another process led.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from prometheus_client import Histogram

from elasticgpu.controller.edge import leasing
from elasticgpu.controller.edge.leader import LeaderElector, LeaderSettings
from elasticgpu.controller.metrics import ControllerMetrics
from elasticgpu.controller.process import worker
from elasticgpu.controller.process.health import HealthServer

if TYPE_CHECKING:
    from elasticgpu.controller.edge.kube import KubeApi
    from elasticgpu.controller.process.reconciling import Controller

__all__ = ["Operability"]

logger = logging.getLogger(__name__)


class Operability:
    """Leader election and the probe/metrics server of one controller process."""

    def __init__(self, controller: Controller, kube: KubeApi, *, leader: LeaderSettings | None = None,
                 health_port: int | None = None, health_host: str = "0.0.0.0") -> None:
        """`leader` None or disabled: this process binds without asking (a single replica).
        `health_port` None: no HTTP server; 0: any free port (logged)."""
        self.controller = controller
        self.metrics = ControllerMetrics()
        self.metrics.watch_queue(lambda: len(controller.queue))
        controller.attach_metrics(self.metrics)
        self.lost = threading.Event()
        self.elector: LeaderElector | None = None
        self._renewer: threading.Thread | None = None
        self._leases: leasing.TransportLeases | None = None
        if leader is not None and leader.enabled:
            # A connection of its own on the controller's configuration (same server, TLS and
            # token): a renewal never queues behind the binder's requests (issue 49 item 2).
            leases = leasing.own_leases(kube.configuration)
            self._leases = leases if isinstance(leases, leasing.TransportLeases) else None
            renew_seconds = Histogram(
                "elasticgpu_leader_renew_seconds", "Seconds each attempt to renew the leader Lease took (the "
                "leader steps down when none succeeds within the renew deadline, 7 s by default).",
                buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 7), registry=self.metrics.registry)
            renew_late = Histogram(
                "elasticgpu_leader_renew_start_late_seconds", "Seconds each renewal attempt began after it was due "
                "(the renew thread waited for a CPU or for Python's GIL).",
                buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2), registry=self.metrics.registry)

            def renewed(seconds: float, late_s: float) -> None:
                renew_seconds.observe(seconds)
                renew_late.observe(late_s)

            self.elector = LeaderElector(leases, leader, on_change=self.metrics.leading, on_renew=renewed)
            # A standby's picture is warm (it lists before it leads): its picture's series stay
            # off until it leads, or the replicas would export them twice.
            self.metrics.leading(False)
        liveness: dict[str, Any] = {"controller": controller.liveness}
        if self.elector is not None:
            liveness["leaderElection"] = self.elector.healthy
        self.server = None if health_port is None else HealthServer(
            liveness=liveness, readiness={"controller": self._ready}, registry=self.metrics.registry,
            host=health_host, port=health_port)

    def _ready(self) -> tuple[bool, str]:
        if self.elector is not None and not self.elector.leading:
            # A standby is doing its job, unless the Lease cannot be taken at all (a 404).
            return self.elector.ready()
        if self.controller.liveness.last_step(worker.LOOP) is None:
            return False, "the picture is being listed; the worker has not started"
        return True, ""

    def start(self) -> None:
        """Serve the endpoints (before leading: a standby must pass its probes too)."""
        if self.server is not None:
            self.server.start()

    def lead(self, stop: threading.Event) -> bool:
        """Block until this process may bind (True), or `stop` was set first (False). Once
        leading, a thread renews the Lease; losing it sets `lost` and `stop`."""
        if self.elector is None:
            # Without election this one replica binds: it leads, and the gauge says so.
            self.metrics.leading(True)
            return True
        if not self.elector.acquire(stop):
            return False

        def on_lost() -> None:
            self.lost.set()
            stop.set()

        self._renewer = self.elector.keep(stop, on_lost=on_lost)
        return True

    def close(self) -> None:
        """Release the Lease (a standby takes over at once) and stop serving."""
        if self.elector is not None:
            if self._renewer is not None:
                # It releases the Lease itself once `stop` is set; wait for that, bounded.
                self._renewer.join(timeout=2 * self.elector.settings.request_timeout_s + 1)
            self.elector.release()
        if self._leases is not None:
            self._leases.close()
        if self.server is not None:
            self.server.stop()

    def exit_if_lost(self) -> None:
        """Exit with status 1 when the Lease was lost (the Pod restarts as a standby)."""
        if self.lost.is_set() and self.elector is not None:
            s = self.elector.settings
            raise SystemExit(f"lost the leader Lease {s.namespace}/{s.name}; exiting so that this process "
                             "restarts as a standby")
