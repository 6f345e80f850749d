"""The GPU's ALLOCATABLE column follows the reservations the controller commits."""

from __future__ import annotations

from elasticgpu.controller.edge.kube import KubeApi
from tests.binding import objects as o
from tests.binding.conftest import Cluster, new_controller, settle


def test_allocatable_summary_follows_reservations(cluster: Cluster, kube: KubeApi) -> None:
    model = f"T{cluster.prefix}"
    gpu_name = f"gpu-{cluster.prefix}-0"
    cluster.gpu(o.gpu(gpu_name, node=f"{cluster.prefix}-node", model=model, memory=81920))
    class_name = f"{cluster.prefix}-class"
    cluster.klass(o.klass(class_name, parameters={"gpuModel": model}))
    cluster.claim(o.claim("c1", cores=30, memory="10Gi", class_name=class_name))
    cluster.claim(o.claim("c2", cores=20, memory="30Gi", class_name=class_name))
    controller = new_controller(kube, cluster.namespace)
    settle(controller)

    status = kube.get_gpu(gpu_name)["status"]
    assert status["allocatableSummary"] == "50%/40Gi"

    kube.delete_claim(cluster.namespace, "c2")
    settle(controller)
    assert kube.get_gpu(gpu_name)["status"]["allocatableSummary"] == "70%/70Gi"
