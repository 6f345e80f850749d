"""Topology against the API server (issue 27 item 3): a class that requires NVLink binds a claim's
cards only where they are linked, a claim's RDMA NICs come from its cards' PCIe roots and are
recorded on its ElasticGPU, and a claim no node can serve waits and says why."""

from __future__ import annotations

from elasticgpu.api import names
from elasticgpu.controller.edge.kube import KubeApi
from tests.binding import objects as o
from tests.binding.conftest import Cluster, new_controller, settle


def test_nvlink_class_and_rdma_nics(cluster: Cluster, kube: KubeApi) -> None:
    node, model = f"{cluster.prefix}-node", f"T{cluster.prefix}"
    names_ = [f"gpu-{cluster.prefix}-{i}" for i in range(4)]
    for index, name in enumerate(names_):
        body = o.gpu(name, node=node, index=index, model=model)
        # Cards 2 and 3 are an NVLink pair under one root that holds a NIC; 0 and 1 are alone.
        if index >= 2:
            body["spec"]["links"] = [names_[5 - index].upper()]
            body["spec"]["pcieRoot"] = "0000:00:03.0"
            body["spec"]["nics"] = ["mlx5_0"]
        cluster.gpu(body)
    class_name = f"{cluster.prefix}-class"
    klass = o.klass(class_name, provisioner=names.PROVISIONER_PHYSICAL, parameters={"gpuModel": model})
    klass["topology"] = "NVLink"
    cluster.klass(klass)
    pair = o.claim("pair", cards=2, class_name=class_name)
    pair["spec"]["resources"]["requests"][names.RESOURCE_RDMA] = 1
    cluster.claim(pair)
    cluster.claim(o.claim("three", cards=3, class_name=class_name))
    settle(new_controller(kube, cluster.namespace))

    bound = cluster.get_claim("pair")
    assert bound["status"]["phase"] == "Bound"
    egpu = kube.get_elastic_gpu(bound["spec"]["elasticGPUName"])
    assert sorted(egpu["spec"]["physicalGPU"]["gpuNames"]) == names_[2:]
    assert egpu["spec"]["physicalGPU"]["rdmaNics"] == ["mlx5_0"]
    waiting = cluster.get_claim("three")
    assert waiting["status"]["phase"] == "Pending"
    message = " ".join(c.get("message", "") for c in waiting["status"].get("conditions") or [])
    assert "topology NVLink" in message, message
