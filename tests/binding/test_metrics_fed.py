"""The controller's Prometheus counters follow what it does: binds, provisions, releases, API errors,
conflicts and sync latency (the metrics a dashboard of the controller reads)."""

from __future__ import annotations

import contextlib
import logging

import pytest
from prometheus_client import CollectorRegistry

from elasticgpu.controller import errors
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.machinery.events import NORMAL, WARNING, EventRecorder
from elasticgpu.controller.metrics import ControllerMetrics
from tests.binding import objects as o
from tests.binding.conftest import Cluster, new_controller, settle


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def test_counters_follow_binds_releases_and_errors(cluster: Cluster, kube: KubeApi) -> None:
    model = f"T{cluster.prefix}"
    cluster.gpu(o.gpu(f"gpu-{cluster.prefix}-0", node=f"{cluster.prefix}-node", model=model))
    class_name = f"{cluster.prefix}-class"
    cluster.klass(o.klass(class_name, parameters={"gpuModel": model}))
    cluster.claim(o.claim("c1", cores=30, memory="10Gi", class_name=class_name))
    cluster.claim(o.claim("c2", cores=30, memory="10Gi", class_name=class_name))
    controller = new_controller(kube, cluster.namespace)
    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry, process=False)
    controller.attach_metrics(metrics)
    try:
        settle(controller)
        assert _value(registry, "elasticgpu_claims_bound_total", mode="dynamic") == 2
        assert _value(registry, "elasticgpu_elasticgpus_provisioned_total") == 2
        assert _value(registry, "elasticgpu_sync_duration_seconds_count", kind="claim", outcome="ok") >= 2

        kube.delete_claim(cluster.namespace, "c2")
        settle(controller)
        assert _value(registry, "elasticgpu_elasticgpus_released_total") == 1

        with contextlib.suppress(errors.NotFound):
            kube.get_gpu(f"gpu-{cluster.prefix}-missing")
        assert _value(registry, "elasticgpu_api_errors_total", code="404", verb="get") >= 1
    finally:
        kube.metrics = None


def test_gauges_read_claims_by_phase_and_free_capacity_by_class(cluster: Cluster, kube: KubeApi) -> None:
    model = f"T{cluster.prefix}"
    for index in range(2):
        cluster.gpu(o.gpu(f"gpu-{cluster.prefix}-{index}", node=f"{cluster.prefix}-node", index=index, model=model))
    class_name = f"{cluster.prefix}-class"
    cluster.klass(o.klass(class_name, parameters={"gpuModel": model}))
    cluster.claim(o.claim("a", cores=30, memory="10Gi", class_name=class_name))
    cluster.claim(o.claim("b", cores=50, memory="20Gi", class_name=class_name))
    cluster.claim(o.claim("waits", cores=30, memory="10Gi", class_name=f"{cluster.prefix}-missing"))
    controller = new_controller(kube, cluster.namespace)
    registry = CollectorRegistry()
    controller.attach_metrics(ControllerMetrics(registry, process=False))
    settle(controller)
    assert _value(registry, "elasticgpu_claims", phase="Bound", **{"class": class_name}) == 2
    assert _value(registry, "elasticgpu_claims", phase="Pending", **{"class": f"{cluster.prefix}-missing"}) == 1
    free = {"class": class_name}
    assert _value(registry, "elasticgpu_class_free_cores", **free) == 200 - 80
    assert _value(registry, "elasticgpu_class_free_memory_bytes", **free) == (2 * 81920 - 30 * 1024) * 2**20
    assert _value(registry, "elasticgpu_class_free_cards", **free) in (0, 1)  # 1 when both share a card

    kube.delete_claim(cluster.namespace, "a")
    settle(controller)
    assert _value(registry, "elasticgpu_claims", phase="Bound", **{"class": class_name}) == 1
    assert _value(registry, "elasticgpu_class_free_cores", **free) == 200 - 50


def test_warning_events_are_logged_at_warning(kube: KubeApi, namespace: str,
                                              caplog: pytest.LogCaptureFixture) -> None:
    recorder = EventRecorder(kube)
    about = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": namespace, "uid": "u"}}
    with caplog.at_level(logging.INFO, logger="elasticgpu.controller.flow.machinery.events"):
        recorder.record(about, type_=WARNING, reason="Bad", message="something to fix")
        recorder.record(about, type_=NORMAL, reason="Fine", message="all is well")
    levels = {r.getMessage().split(": ")[1]: r.levelno for r in caplog.records}
    assert levels == {"Bad": logging.WARNING, "Fine": logging.INFO}
