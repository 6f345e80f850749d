"""Objects that cannot be served yet wait and say why, and are served once the cause goes away;
objects held up say what holds them (against the API server)."""

from __future__ import annotations

import time
from typing import Any

from elasticgpu.api import names
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


def test_a_claim_that_can_never_fit_says_so_apart_from_no_room_now(cluster: Cluster, kube: KubeApi) -> None:
    model = f"T{cluster.prefix}"
    for index in range(2):
        cluster.gpu(o.gpu(f"gpu-{cluster.prefix}-{index}", node=f"{cluster.prefix}-node", index=index, model=model))
    share, whole = f"{cluster.prefix}-share", f"{cluster.prefix}-whole"
    cluster.klass(o.klass(share, parameters={"gpuModel": model}))
    cluster.klass(o.klass(whole, provisioner=names.PROVISIONER_PHYSICAL, parameters={"gpuModel": model}))
    cluster.claim(o.claim("huge", cores=50, memory="96Gi", class_name=share))  # the cards have 80Gi
    cluster.claim(o.claim("many", cores=None, memory=None, cards=3, class_name=whole))  # the node has 2
    cluster.claim(o.claim("both", cores=None, memory=None, cards=2, class_name=whole))  # fits: binds
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    cluster.claim(o.claim("later", cores=None, memory=None, cards=1, class_name=whole))  # no room now
    settle(controller)

    def said(name: str) -> tuple[str, str, str]:
        status = cluster.get_claim(name)["status"]
        return status["phase"], status.get("reason", ""), status["message"]

    phase, reason, message = said("huge")
    assert (phase, reason) == ("Pending", "NeverFits")
    assert "80Gi" in message and "largest" in message and model in message, message
    phase, reason, message = said("many")
    assert (phase, reason) == ("Pending", "NeverFits")
    assert "the most on one node is 2" in message, message
    assert said("both")[0] == "Bound"
    assert said("later")[:2] == ("Pending", "NoCapacity")
