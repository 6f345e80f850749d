"""The controller's Prometheus counters follow what it does: binds, provisions, releases, API errors,
conflicts and sync latency (the metrics a dashboard of the controller reads)."""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry

from elasticgpu.controller import errors
from elasticgpu.controller.edge.kube import KubeApi
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
