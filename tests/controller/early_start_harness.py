"""What the early-start tests share (test_early_start, test_waiting_claims): a controller started as
`elasticgpu controller` starts one, on a thread of the test's, through a client whose lists the test
holds; the cards and class its claims bind to; waits with a deadline."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable

from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.process import startup
from elasticgpu.controller.process.operability import Operability
from elasticgpu.controller.process.reconciling import Controller
from elasticgpu.controller.settings import ControllerSettings, ResyncSettings
from tests.binding import objects as o
from tests.binding.conftest import Cluster

DEADLINE_S = 30.0

_STARTED: weakref.WeakKeyDictionary[threading.Thread, Controller] = weakref.WeakKeyDictionary()
"""The controller each `start_in_thread` thread runs, for `stopped`."""


def start_in_thread(kube: KubeApi, namespace: str, *, name: str) -> tuple[threading.Event, threading.Thread]:
    """A controller on `kube` started as the process starts one; set the event to stop it (it
    closes `kube` on its way out and joins the controller's threads), or call `stopped`."""
    controller = Controller(kube, ControllerSettings(resync=ResyncSettings(orphan_grace_s=0.0)), namespace=namespace)
    operability = Operability(controller, kube)
    stop = threading.Event()

    def run() -> None:
        try:
            startup._run_with_client_watches(controller, operability, stop=stop)
        finally:
            operability.close()
            controller.close()
            kube.close()  # ends the watches at once (`Transport.close`)
            deadline = time.monotonic() + DEADLINE_S
            for started in controller.liveness.threads():
                started.join(max(0.0, deadline - time.monotonic()))

    thread = threading.Thread(target=run, name=name, daemon=True)
    _STARTED[thread] = controller
    thread.start()
    return stop, thread


def stopped(stop: threading.Event, thread: threading.Thread) -> None:
    """Stop the controller `start_in_thread` started and check that none of its threads outlives
    the test (a straggler logs into later tests' caplog)."""
    stop.set()
    thread.join(2 * DEADLINE_S)
    assert not thread.is_alive(), f"the controller of {thread.name} did not stop"
    left = [t.name for t in _STARTED[thread].liveness.threads() if t.is_alive()]
    assert not left, f"threads of the stopped controller still run: {left}"


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
