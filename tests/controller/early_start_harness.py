"""What the early-start tests share (test_early_start, test_waiting_claims): a controller started as
`elasticgpu controller` starts one, on a thread of the test's, through a client whose lists the test
holds; the cards and class its claims bind to; waits with a deadline."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.process import startup
from elasticgpu.controller.process.operability import Operability
from elasticgpu.controller.process.reconciling import Controller
from elasticgpu.controller.settings import ControllerSettings, ResyncSettings
from tests.binding import objects as o
from tests.binding.conftest import Cluster

DEADLINE_S = 30.0


def start_in_thread(kube: KubeApi, namespace: str, *, name: str) -> tuple[threading.Event, threading.Thread]:
    """A controller on `kube` started as the process starts one; set the event to stop it (it
    closes `kube` on its way out)."""
    controller = Controller(kube, ControllerSettings(resync=ResyncSettings(orphan_grace_s=0.0)), namespace=namespace)
    operability = Operability(controller, kube)
    stop = threading.Event()

    def run() -> None:
        try:
            startup._run_with_client_watches(controller, operability, stop=stop)
        finally:
            operability.close()
            controller.close()
            kube.close()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return stop, thread


def wait(condition: Callable[[], bool], timeout_s: float = DEADLINE_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)  # bounded by the deadline
    return condition()


def phase(kube: KubeApi, namespace: str, name: str) -> str | None:
    found = (kube.get_claim(namespace, name).get("status") or {}).get("phase")
    return str(found) if found is not None else None


def cards(cluster: Cluster, count: int = 2) -> str:
    """`count` cards on one node and a class that selects only them; the class's name."""
    model = f"E{cluster.prefix}"
    for i in range(count):
        cluster.gpu(o.gpu(f"gpu-{cluster.prefix}-e{i}", node=f"{cluster.prefix}-n", index=i, model=model))
    class_name = f"{cluster.prefix}-early"
    cluster.klass(o.klass(class_name, parameters={"gpuModel": model}))
    return class_name
