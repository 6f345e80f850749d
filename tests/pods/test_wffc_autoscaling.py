"""A WaitForFirstConsumer pod that no node can take with its claims asks the node autoscaler for
one node holding all of them (against the API server), and runs there once the node comes."""

from __future__ import annotations

from elasticgpu.controller.decisions import node_requests
from elasticgpu.controller.process.reconciling import Controller
from elasticgpu.controller.settings import AutoscaleSettings, ControllerSettings
from tests.binding import objects as o
from tests.pods.claim_world import World, kube, settle, world

__all__ = ["kube", "world"]  # fixtures


def test_a_pod_no_node_can_take_asks_one_node_for_all_its_claims_and_binds_there(world: World) -> None:
    pool = f"{world.prefix}-pool"
    wffc = f"{world.prefix}-wffc"
    world.klass(o.klass(wffc, mode="WaitForFirstConsumer",
                        parameters={"gpuModel": f"T{world.prefix}", "nodeSelector": f"pool={pool}"}))
    settings = ControllerSettings(autoscale=AutoscaleSettings(enabled=True, namespace=world.namespace))
    controller = Controller(world.kube, settings, namespace=world.namespace)
    world.pod("p", inline={"main": f"gpu-core=20,gpu-memory=1Gi,class={wffc}",
                           "side": f"gpu-core=30,gpu-memory=1Gi,class={wffc}"}, cpu="1", containers=("main", "side"))
    settle(controller)
    assert world.get_claim("p-main")["status"]["reason"] == "FailedClaimPlacement"

    controller.node_autoscaling.pass_once()
    controller.node_autoscaling.pass_once()
    [placeholder] = world.kube.list_labelled_pods(world.namespace, f"{node_requests.LABEL_NODE_REQUEST}=true")
    assert placeholder["spec"]["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "2"}
    assert placeholder["spec"]["nodeSelector"] == {"pool": pool}
    assert sorted(placeholder["metadata"]["annotations"][node_requests.ANNOTATION_FOR_CLAIMS].split(",")) == [
        f"{world.namespace}/p-main", f"{world.namespace}/p-side"]

    node = world.node(f"{world.prefix}-new", labels={"pool": pool})
    world.gpu(o.gpu(f"gpu-{node}-0", node=node, model=f"T{world.prefix}"))
    settle(controller)
    assert {world.get_claim(c)["status"].get("nodeName") for c in ("p-main", "p-side")} == {node}
    controller.node_autoscaling.pass_once()
    assert world.kube.list_labelled_pods(world.namespace, f"{node_requests.LABEL_NODE_REQUEST}=true") == []
