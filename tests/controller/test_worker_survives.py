"""A worker never dies: a sync that raises (here a 404 of an object being deleted, the race
that used to end the binder thread) is retried, and the claims after it still bind. The
Event writer outlives a failing Event the same way."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from elasticgpu.controller import errors
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.machinery.events import NORMAL, EventRecorder
from elasticgpu.controller.process.reconciling import Controller
from elasticgpu.controller.process.starting import start_threads
from elasticgpu.controller.settings import BindingSettings, ControllerSettings
from tests.binding import objects as o
from tests.binding.conftest import Cluster


def _wait(condition: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def _phase(cluster: Cluster, name: str) -> str | None:
    return (cluster.get_claim(name).get("status") or {}).get("phase")


def test_a_sync_that_raises_not_found_keeps_the_worker_binding(cluster: Cluster, kube: KubeApi) -> None:
    model = f"T{cluster.prefix}"
    cluster.gpu(o.gpu(f"gpu-{cluster.prefix}-0", node=f"{cluster.prefix}-node", model=model))
    class_name = f"{cluster.prefix}-class"
    cluster.klass(o.klass(class_name, parameters={"gpuModel": model}))
    # workers=0: every write of a bind runs on the worker thread itself, where a 404 used to end it.
    controller = Controller(kube, ControllerSettings(binding=BindingSettings(workers=0)), namespace=cluster.namespace)
    raised: list[str] = []
    patch_status = kube.patch_elastic_gpu_status

    def gone_once(name: str, patch: dict[str, Any]) -> dict[str, Any]:
        if not raised:
            raised.append(name)
            raise errors.NotFound(kind="ElasticGPU", name=name, fix="it was deleted or never created")
        return patch_status(name, patch)

    kube.patch_elastic_gpu_status = gone_once  # type: ignore[method-assign]
    stop = threading.Event()
    try:
        controller.rebuild()
        for thread in controller.informer.start(stop, timeout_s=30):
            controller.liveness.track(thread)
        start_threads(controller, stop)
        cluster.claim(o.claim("first", cores=10, memory="1Gi", class_name=class_name))
        assert _wait(lambda: bool(raised)), "the injected 404 was never hit"
        cluster.claim(o.claim("second", cores=10, memory="1Gi", class_name=class_name))
        assert _wait(lambda: _phase(cluster, "second") == "Bound"), "the worker stopped binding after a 404"
        assert _phase(cluster, "first") == "Bound"
        first = cluster.get_claim("first")
        # the ElasticGPU status write that failed was retried
        assert _wait(lambda: kube.get_elastic_gpu(first["spec"]["elasticGPUName"])["status"]["phase"] == "Bound")
        assert controller.liveness.alive(), controller.liveness.reason()
    finally:
        del kube.patch_elastic_gpu_status
        stop.set()
        controller.close()


def test_the_event_writer_outlives_a_failing_event(cluster: Cluster, kube: KubeApi) -> None:
    create_event = kube.create_event
    calls: list[str] = []

    def broken_once(namespace: str, body: dict[str, Any]) -> None:
        calls.append(body["reason"])
        if len(calls) == 1:
            raise TypeError("a bug while writing an Event")
        create_event(namespace, body)

    kube.create_event = broken_once  # type: ignore[method-assign]
    recorder = EventRecorder(kube, background=True)
    try:
        claim = cluster.claim(o.claim("c", cores=10, memory="1Gi"))
        recorder.record(claim, type_=NORMAL, reason="First", message="lost to a bug")
        recorder.record(claim, type_=NORMAL, reason="Second", message="written")
        assert _wait(recorder.idle, 10.0), "the Event writer died"
        assert recorder.thread is not None and recorder.thread.is_alive()
        reasons = {e["reason"] for e in kube.list_events(cluster.namespace)}
        assert "Second" in reasons
    finally:
        del kube.create_event
        recorder.close()
