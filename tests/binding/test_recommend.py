"""Recommendations from measured use (issue 17) against the API server: usage written into a
claim's status as the agent writes it makes `status.recommendation`, an Event and the per-claim
gauges appear; with `resizePolicy: Auto` the claim's requests follow and the resize is done."""

from __future__ import annotations

import time
from typing import Any

from elasticgpu.api import names
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.metrics import ControllerMetrics
from elasticgpu.controller.process.reconciling import Controller
from elasticgpu.controller.settings import ControllerSettings, RecommendSettings
from tests.binding import objects as o
from tests.binding.conftest import Cluster, settle

CORE, MEMORY = names.RESOURCE_CORE, names.RESOURCE_MEMORY


def _setup(cluster: Cluster, **fields: Any) -> str:
    model = f"T{cluster.prefix}"
    cluster.gpu(o.gpu(f"gpu-{cluster.prefix}-0", node=f"{cluster.prefix}-node", index=0, model=model))
    class_name = f"{cluster.prefix}-class"
    body = o.klass(class_name, provisioner=names.PROVISIONER_GPUSHARE, parameters={"gpuModel": model})
    body["metadata"]["annotations"] = {names.ANNOTATION_PER_CLAIM_METRICS: "true"}  # the per-claim gauges
    cluster.klass({**body, **fields})
    return class_name


def _controller(kube: KubeApi, cluster: Cluster, *,
                shrink_after_s: float = RecommendSettings.shrink_after_s) -> tuple[Controller, ControllerMetrics]:
    settings = ControllerSettings(recommend=RecommendSettings(min_samples=3, shrink_after_s=shrink_after_s))
    controller = Controller(kube, settings, namespace=cluster.namespace)
    metrics = ControllerMetrics(process=False)
    controller.attach_metrics(metrics)
    return controller, metrics


def _agent_measures(kube: KubeApi, cluster: Cluster, controller: Controller, samples: list[tuple[int, int]]) -> None:
    """Write `status.usage` as the node agent does, one measurement after the other."""
    for second, (cores, memory) in enumerate(samples):
        kube.patch_claim_status(cluster.namespace, "c", {"status": {"usage": {
            "coresUsed": cores, "memoryUsed": memory, "updateTime": f"2026-01-01T00:00:{second:02d}Z"}}})
        settle(controller)


def _gauge(metrics: ControllerMetrics, name: str, cluster: Cluster) -> float | None:
    return metrics.registry.get_sample_value(name, {"namespace": cluster.namespace, "claim": "c"})


def _events(kube: KubeApi, namespace: str) -> list[dict[str, Any]]:
    return list(kube.list_events(namespace))


def test_measured_use_makes_a_recommendation_and_an_event(cluster: Cluster, kube: KubeApi) -> None:
    class_name = _setup(cluster)  # resizePolicy unset: Recommend
    cluster.claim(o.claim("c", cores=80, memory="8Gi", class_name=class_name))
    controller, metrics = _controller(kube, cluster)
    settle(controller)

    _agent_measures(kube, cluster, controller, [(10, 1000), (10, 1000)])
    assert "recommendation" not in cluster.get_claim("c")["status"]  # two samples: too few to say

    _agent_measures(kube, cluster, controller, [(12, 900)])
    claim = cluster.get_claim("c")
    rec = claim["status"]["recommendation"]
    # peak 12 % / 1000 MiB, +20 %: 15 % (14.4 up to 5 %) and 1280 MiB (1200 up to 256 MiB).
    assert (rec["cores"], rec["memory"], rec["state"]) == (15, 1280, "OverSized"), rec
    assert "peak 12% cores, 1000 MiB" in rec["reason"] and rec["since"]
    assert claim["spec"]["resources"]["requests"] == {CORE: 80, MEMORY: "8Gi"}  # Recommend never resizes
    [event] = [e for e in _events(kube, cluster.namespace) if e["reason"] == "OverSized"]
    assert event["type"] == "Normal" and "15% cores, 1280 MiB" in event["message"]
    assert _gauge(metrics, "elasticgpu_claim_requested_cores", cluster) == 80
    assert _gauge(metrics, "elasticgpu_claim_used_cores", cluster) == 12
    assert _gauge(metrics, "elasticgpu_claim_recommended_cores", cluster) == 15
    assert _gauge(metrics, "elasticgpu_claim_recommended_memory_bytes", cluster) == 1280 * 1024 * 1024
    totals = {"namespace": cluster.namespace, "class": class_name}
    assert metrics.registry.get_sample_value("elasticgpu_namespace_recommendable_requested_cores", totals) == 80
    assert metrics.registry.get_sample_value("elasticgpu_namespace_recommended_cores", totals) == 15

    _agent_measures(kube, cluster, controller, [(11, 950)])  # the same state: no second Event
    assert len([e for e in _events(kube, cluster.namespace) if e["reason"] == "OverSized"]) == 1
    assert cluster.get_claim("c")["status"]["recommendation"]["since"] == rec["since"]

    # The class turned resizePolicy Off (made anew: classes are immutable in part): the recommendation goes.
    kube.delete_class(class_name)
    model = f"T{cluster.prefix}"
    kube.create_class({**o.klass(class_name, provisioner=names.PROVISIONER_GPUSHARE, parameters={"gpuModel": model}),
                       "resizePolicy": "Off"})
    _agent_measures(kube, cluster, controller, [(11, 960)])
    assert "recommendation" not in cluster.get_claim("c")["status"]
    assert _gauge(metrics, "elasticgpu_claim_requested_cores", cluster) is None

    kube.delete_claim(cluster.namespace, "c")  # a deleted claim's series go
    settle(controller)
    assert _gauge(metrics, "elasticgpu_claim_requested_cores", cluster) is None


def test_auto_resizes_an_under_sized_claim_within_max_size(cluster: Cluster, kube: KubeApi) -> None:
    class_name = _setup(cluster, allowClaimResize=True, resizePolicy="Auto",
                        maxSize={"cores": 55, "memory": 4096})
    cluster.claim(o.claim("c", cores=30, memory="1Gi", class_name=class_name))
    controller, metrics = _controller(kube, cluster)
    settle(controller)

    _agent_measures(kube, cluster, controller, [(40, 2000), (45, 1800), (30, 1500)])

    claim = cluster.get_claim("c")
    # peak 45 % / 2000 MiB, +20 %: 55 % (54 up to 5 %, at maxSize) and 2560 MiB.
    assert claim["spec"]["resources"]["requests"] == {CORE: 55, MEMORY: "2560Mi"}, claim["spec"]
    assert claim["status"]["capacity"] == {CORE: 55, MEMORY: "2560Mi"}, claim["status"]  # resized on its card
    assert claim["status"]["recommendation"]["state"] == "RightSized"
    reasons = [e["reason"] for e in _events(kube, cluster.namespace)]
    assert "UnderSized" in reasons and "AutoResized" in reasons and "Resized" in reasons
    assert _gauge(metrics, "elasticgpu_claim_requested_cores", cluster) == 55

    # A peak above maxSize: the recommendation says so, Auto leaves the claim where it is.
    _agent_measures(kube, cluster, controller, [(60, 2000), (60, 2000), (60, 2000)])
    claim = cluster.get_claim("c")
    assert claim["spec"]["resources"]["requests"] == {CORE: 55, MEMORY: "2560Mi"}
    assert claim["status"]["recommendation"]["cores"] == 55
    assert reasons.count("AutoResized") == [e["reason"] for e in _events(kube, cluster.namespace)].count(
        "AutoResized")


def test_auto_shrinks_only_after_a_long_watch_never_below_the_peak(cluster: Cluster, kube: KubeApi) -> None:
    class_name = _setup(cluster, allowClaimResize=True, resizePolicy="Auto")
    cluster.claim(o.claim("c", cores=80, memory="8Gi", class_name=class_name))
    controller, _metrics = _controller(kube, cluster)  # shrinks after 30 minutes of watching
    settle(controller)
    _agent_measures(kube, cluster, controller, [(10, 1000), (12, 1100), (10, 900)])
    claim = cluster.get_claim("c")
    assert claim["status"]["recommendation"]["state"] == "OverSized"
    assert claim["spec"]["resources"]["requests"] == {CORE: 80, MEMORY: "8Gi"}  # watched for seconds only

    # Another controller (a restart, a new leader) starts with an empty window: three fresh samples
    # first; with no minimum watch it shrinks to the recommendation, which holds the peak.
    restarted, _metrics = _controller(kube, cluster, shrink_after_s=0.0)
    settle(restarted)
    assert cluster.get_claim("c")["spec"]["resources"]["requests"] == {CORE: 80, MEMORY: "8Gi"}
    _agent_measures(kube, cluster, restarted, [(10, 1000), (14, 1100), (10, 900)])
    claim = cluster.get_claim("c")
    # peak 14 % / 1100 MiB, +20 %: 20 % (16.8 up to 5 %) and 1536 MiB (1320 up to 256 MiB).
    assert claim["spec"]["resources"]["requests"] == {CORE: 20, MEMORY: "1536Mi"}, claim["spec"]
    assert claim["status"]["capacity"] == {CORE: 20, MEMORY: "1536Mi"}, claim["status"]
    assert claim["status"]["recommendation"]["state"] == "RightSized"


def test_every_sample_counts_when_a_busy_controller_syncs_the_claim_once_for_several(
        cluster: Cluster, kube: KubeApi) -> None:
    """Issue 44 (the flaky `test_two_controllers_auto_resizing_the_same_claims_never_oversubscribe`): the work
    queue coalesces a claim's changes, and the recommendation took only the usage its one sync saw: the samples
    written in between were lost, so a slow controller recommended less than a quick one. Here three samples
    arrive before the controller works at all: all three count."""
    class_name = _setup(cluster, allowClaimResize=True, resizePolicy="Auto",
                        maxSize={"cores": 55, "memory": 4096})
    cluster.claim(o.claim("c", cores=30, memory="1Gi", class_name=class_name))
    controller, _metrics = _controller(kube, cluster)
    settle(controller)
    for second, (cores, memory) in enumerate([(40, 2000), (45, 1800), (30, 1500)]):
        kube.patch_claim_status(cluster.namespace, "c", {"status": {"usage": {
            "coresUsed": cores, "memoryUsed": memory, "updateTime": f"2026-01-01T00:00:{second:02d}Z"}}})
    deadline = time.monotonic() + 30
    while True:  # until the watch delivered the last write into the picture (its key queued, not synced)
        seen = controller.claim(cluster.namespace, "c")
        if seen is not None and seen.status.usage is not None and seen.status.usage.cores_used == 30:
            break
        assert time.monotonic() < deadline, "the watch did not deliver the samples"
        time.sleep(0.1)
    settle(controller)
    claim = cluster.get_claim("c")
    # peak 45 % / 2000 MiB, +20 %: 55 % (at maxSize) and 2560 MiB, as when each sample is synced on its own.
    assert claim["spec"]["resources"]["requests"] == {CORE: 55, MEMORY: "2560Mi"}, claim["status"]
