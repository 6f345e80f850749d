"""Objects that cannot be served yet wait and say why, and are served once the cause goes away;
objects held up say what holds them (against the API server)."""

from __future__ import annotations

import time
from typing import Any

from elasticgpu.controller.edge.kube import KubeApi
from tests.binding import objects as o
from tests.binding.conftest import Cluster, new_controller, settle


def _events_about(kube: KubeApi, namespace: str, name: str) -> list[dict[str, Any]]:
    return [e for e in kube.list_events(namespace) if e["involvedObject"].get("name") == name]


def test_static_elastic_gpu_waits_for_its_gpu_and_binds_when_it_appears(cluster: Cluster, kube: KubeApi) -> None:
    # `kubectl apply -f examples/` applies the ElasticGPU (and the claim naming it) before the GPU.
    gpu_name = f"gpu-{cluster.prefix}-late"
    egpu_name = f"{cluster.prefix}-static"
    cluster.egpu(o.share_egpu(egpu_name, gpu_name, cores=50, memory="20Gi"))
    cluster.claim(o.claim("static", cores=40, memory="10Gi", egpu=egpu_name))
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    egpu = kube.get_elastic_gpu(egpu_name)
    assert (egpu["status"]["phase"], egpu["status"]["reason"]) == ("Pending", "GPUNotFound")
    assert gpu_name in egpu["status"]["message"]
    [event] = _events_about(kube, "default", egpu_name)
    assert (event["type"], event["reason"]) == ("Warning", "GPUNotFound")
    assert cluster.get_claim("static")["status"]["phase"] == "Pending"

    # Waiting says so once: another round writes nothing.
    before = egpu["metadata"]["resourceVersion"]
    settle(controller)
    assert kube.get_elastic_gpu(egpu_name)["metadata"]["resourceVersion"] == before

    time.sleep(1.0)
    cluster.gpu(o.gpu(gpu_name, node=f"{cluster.prefix}-node", model=f"T{cluster.prefix}"))
    settle(controller)
    egpu = kube.get_elastic_gpu(egpu_name)
    assert egpu["status"]["phase"] == "Bound", egpu["status"]
    claim = cluster.get_claim("static")
    assert claim["status"]["phase"] == "Bound", claim["status"]
    assert claim["spec"]["elasticGPUName"] == egpu_name


def test_deleting_a_bound_elastic_gpu_says_which_claim_keeps_it(cluster: Cluster, kube: KubeApi) -> None:
    gpu_name = f"gpu-{cluster.prefix}-0"
    egpu_name = f"{cluster.prefix}-kept"
    cluster.gpu(o.gpu(gpu_name, node=f"{cluster.prefix}-node", model=f"T{cluster.prefix}"))
    cluster.egpu(o.share_egpu(egpu_name, gpu_name, cores=50, memory="20Gi"))
    cluster.claim(o.claim("user", cores=40, memory="10Gi", egpu=egpu_name))
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    assert kube.get_elastic_gpu(egpu_name)["status"]["phase"] == "Bound"

    kube.delete_elastic_gpu(egpu_name)
    settle(controller)
    settle(controller)
    kept = kube.get_elastic_gpu(egpu_name)  # the finalizer holds it while the claim uses it
    assert kept["metadata"].get("deletionTimestamp")
    in_use = [e for e in _events_about(kube, "default", egpu_name) if e["reason"] == "ElasticGPUInUse"]
    assert len(in_use) == 1, in_use
    assert in_use[0]["type"] == "Warning"
    assert f"{cluster.namespace}/user" in in_use[0]["message"]
