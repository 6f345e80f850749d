"""The reserved-time counters against a real API server: they come from the ElasticGPU's own
status, so a restarted controller, or another replica taking the Lease, goes on from the same
value (its downtime included), a release folds the period once, and a deleted ElasticGPU's final
value stays exported for scrapes to see (issue 38)."""

from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry

from elasticgpu.api import names, timestamps
from elasticgpu.controller import errors
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.metrics import ControllerMetrics
from elasticgpu.controller.process.reconciling import Controller
from tests.binding import objects as o
from tests.binding.conftest import Cluster, new_controller, settle


def _started(kube: KubeApi, namespace: str, *, leading: bool
             ) -> tuple[Controller, ControllerMetrics, CollectorRegistry]:
    """A controller as a fresh process has it: nothing in memory but what it lists."""
    controller = new_controller(kube, namespace)
    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry, process=False)
    controller.attach_metrics(metrics)
    metrics.leading(leading)
    settle(controller)
    return controller, metrics, registry


def _reserved(registry: CollectorRegistry, egpu: str, metric: str = "elasticgpu_reserved_core_seconds_total"
              ) -> float | None:
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == metric and sample.labels.get("elasticgpu") == egpu:
                return sample.value
    return None


@pytest.mark.timeout(120)
def test_reserved_seconds_survive_restart_and_leader_change_without_double_counting(
        cluster: Cluster, kube: KubeApi) -> None:
    model = f"T{cluster.prefix}"
    cluster.gpu(o.gpu(f"gpu-{cluster.prefix}-0", node=f"{cluster.prefix}-node", model=model))
    class_name = f"{cluster.prefix}-class"
    body = o.klass(class_name, parameters={"gpuModel": model})
    body["metadata"]["annotations"] = {names.ANNOTATION_PER_CLAIM_METRICS: "true"}  # the per-ElasticGPU series
    cluster.klass(body)
    cluster.claim(o.claim("train", cores=30, memory="10Gi", class_name=class_name))

    first, _, first_registry = _started(kube, cluster.namespace, leading=True)
    egpu = cluster.get_claim("train")["spec"]["elasticGPUName"]
    body = kube.get_elastic_gpu(egpu)
    since = timestamps.epoch_seconds(body["status"]["accounting"]["since"])
    assert since is not None and body["status"]["phase"] == "Bound"
    labels = {"namespace": cluster.namespace, "claim": "train", "class": class_name, "elasticgpu": egpu}
    time.sleep(2.2)
    before = first_registry.get_sample_value("elasticgpu_reserved_core_seconds_total", labels)
    assert before is not None and before >= 30 * 2, before

    # A standby replica (no Lease) exports nothing: a sum over replicas counts the ElasticGPU once.
    standby, standby_metrics, standby_registry = _started(kube, cluster.namespace, leading=False)
    assert _reserved(standby_registry, egpu) is None

    # The leader goes (its process memory with it); the standby takes the Lease and goes on from
    # the same value, computed from the object alone.
    del first, first_registry
    time.sleep(1.1)
    standby_metrics.leading(True)  # what its Lease elector calls once it holds the Lease
    after = _reserved(standby_registry, egpu)
    assert after is not None, f"no {names.KIND_ELASTIC_GPU} {egpu} in the new leader's accounting"
    assert after >= before, (before, after)
    assert after == 30 * (int(time.time()) - int(since)) or after == 30 * (int(time.time()) - 1 - int(since))
    mib_seconds = _reserved(standby_registry, egpu, "elasticgpu_reserved_memory_byte_seconds_total")
    assert mib_seconds is not None and mib_seconds == after / 30 * 10240 * 2**20
    # The namespace total counts this tenure only: from (about) 0 at the takeover, never down.
    totals = {"namespace": cluster.namespace, "class": class_name}
    total = standby_registry.get_sample_value("elasticgpu_namespace_reserved_core_seconds_total", totals)
    assert total is not None and total <= 30 * 2, total

    # Release: the period is folded once, in the same write as the phase, and the value stops.
    kube.delete_claim(cluster.namespace, "train")
    settle(standby)
    deadline = time.time() + 30
    final = None
    while time.time() < deadline:
        try:
            current = kube.get_elastic_gpu(egpu)
        except errors.NotFound:
            break  # reclaimed (Delete): the linger below must still show its final value
        if current["status"].get("phase") != "Bound":
            final = current["status"]["accounting"]
            break
        time.sleep(0.2)
        settle(standby)
    # Reclaim Delete removes the ElasticGPU: its final value must outlive it (the linger).
    while time.time() < deadline:
        try:
            kube.get_elastic_gpu(egpu)
        except errors.NotFound:
            break
        time.sleep(0.2)
        settle(standby)
    else:
        pytest.fail(f"ElasticGPU {egpu} was not reclaimed (Delete) within 30 s")
    settle(standby)
    assert standby.picture.egpu(egpu) is None
    value = _reserved(standby_registry, egpu)
    assert value is not None, "a released or deleted ElasticGPU must stay exported with its final value"
    if final is not None:
        assert "since" not in final and final["coreSeconds"] == value
    final_total = standby_registry.get_sample_value("elasticgpu_namespace_reserved_core_seconds_total", totals)
    assert final_total is not None and final_total >= total, (total, final_total)
    time.sleep(1.1)
    assert _reserved(standby_registry, egpu) == value, "the value must stop when the reservation ends"
    assert value >= after
    assert standby_registry.get_sample_value("elasticgpu_namespace_reserved_core_seconds_total", totals
                                             ) == final_total, "a released ElasticGPU's time stays in the total"

