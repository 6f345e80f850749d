"""A class's isolation mode against the API server (issue 25): a slice binds only to a card whose agent
publishes the mode, Pending with a reason that names it meanwhile; the claim's status.isolation says
what protects it (WholeCard for whole cards, which need no mode)."""

from __future__ import annotations

from typing import Any

from elasticgpu.api import names
from elasticgpu.controller.edge.kube import KubeApi
from tests.binding import objects as o
from tests.binding.conftest import Cluster, new_controller, settle


def _setup(cluster: Cluster, *, isolation: str, provisioner: str = names.PROVISIONER_GPUSHARE) -> tuple[str, str]:
    model = f"I{cluster.prefix}"
    gpu_name = f"gpu-{cluster.prefix}-0"
    cluster.gpu(o.gpu(gpu_name, node=f"{cluster.prefix}-node", model=model))
    class_name = f"{cluster.prefix}-{isolation.lower()}"
    body = o.klass(class_name, provisioner=provisioner, parameters={"gpuModel": model})
    body["isolation"] = isolation
    cluster.klass(body)
    return gpu_name, class_name


def _offer(kube: KubeApi, gpu_name: str, modes: list[str]) -> None:
    """What the node's agent does when it finds the mode's mechanism (inventory.desired_status)."""
    body: dict[str, Any] = kube.get_gpu(gpu_name)
    body.setdefault("status", {})["isolation"] = modes
    kube.replace_gpu_status(body)


def test_a_slice_waits_for_a_card_that_provides_its_mode(cluster: Cluster, kube: KubeApi) -> None:
    gpu_name, class_name = _setup(cluster, isolation="MPS")
    cluster.claim(o.claim("isolated", cores=30, memory="10Gi", class_name=class_name))
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    pending = cluster.get_claim("isolated")["status"]
    assert (pending["phase"], pending["reason"]) == ("Pending", "NoCapacity")
    assert "no card on any node supports isolation MPS" in pending["message"], pending["message"]

    _offer(kube, gpu_name, ["MPS"])
    settle(controller)
    bound = cluster.get_claim("isolated")["status"]
    assert (bound["phase"], bound.get("isolation")) == ("Bound", "MPS"), bound


def test_whole_cards_need_no_mode_and_say_so(cluster: Cluster, kube: KubeApi) -> None:
    _gpu, class_name = _setup(cluster, isolation="HAMiCore", provisioner=names.PROVISIONER_PHYSICAL)
    cluster.claim(o.claim("card", cards=1, class_name=class_name))
    settle(new_controller(kube, cluster.namespace))
    status = cluster.get_claim("card")["status"]
    assert (status["phase"], status["isolation"]) == ("Bound", "WholeCard")


def test_a_class_without_a_mode_binds_anywhere_advisory(cluster: Cluster, kube: KubeApi) -> None:
    model = f"N{cluster.prefix}"
    cluster.gpu(o.gpu(f"gpu-{cluster.prefix}-0", node=f"{cluster.prefix}-node", model=model))
    created = cluster.klass(o.klass(f"{cluster.prefix}-plain", parameters={"gpuModel": model}))
    assert created["isolation"] == "None"  # the schema's default
    cluster.claim(o.claim("plain", class_name=f"{cluster.prefix}-plain"))
    settle(new_controller(kube, cluster.namespace))
    status = cluster.get_claim("plain")["status"]
    assert (status["phase"], status["isolation"]) == ("Bound", "None")


def test_a_resizable_mps_claim_says_new_processes_get_a_new_size(cluster: Cluster, kube: KubeApi) -> None:
    gpu_name, _ = _setup(cluster, isolation="None")
    _offer(kube, gpu_name, ["MPS"])
    model = f"I{cluster.prefix}"
    body = o.klass(f"{cluster.prefix}-mps-resize", parameters={"gpuModel": model})
    body.update(isolation="MPS", allowClaimResize=True)
    cluster.klass(body)
    cluster.claim(o.claim("grow", cores=20, memory="4Gi", class_name=f"{cluster.prefix}-mps-resize"))
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    bound = cluster.get_claim("grow")["status"]
    assert (bound["phase"], bound["isolation"]) == ("Bound", "MPS")
    assert "processes started after the resize" in bound["message"], bound["message"]

    kube.patch_claim(cluster.namespace, "grow", {"spec": {"resources": {"requests": {
        names.RESOURCE_CORE: 40, names.RESOURCE_MEMORY: "8Gi"}}}})
    settle(controller)
    assert cluster.get_claim("grow")["status"]["capacity"] == {names.RESOURCE_CORE: 40, names.RESOURCE_MEMORY: "8Gi"}
    resized = [e["message"] for e in kube.list_events(cluster.namespace) if e["reason"] == "Resized"]
    assert resized and "processes already running keep the limits they started with" in resized[-1], resized
