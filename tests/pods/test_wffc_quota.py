"""WaitForFirstConsumer under an ElasticGPUQuota: a pod whose claim the quota refuses stays gated
with ClaimsReady=False reason QuotaExceeded (and nothing reserved); it starts once the quota is raised."""

from __future__ import annotations

import time

from kubernetes import client

from elasticgpu.api import names
from elasticgpu.controller.process.reconciling import Controller
from elasticgpu.controller.settings import ControllerSettings, QuotaSettings
from tests.binding import objects as o
from tests.pods.claim_world import World, kube, settle, world

__all__ = ["kube", "world"]  # fixtures


def _quota_body(cores: int) -> dict[str, object]:
    return {"apiVersion": names.API_VERSION, "kind": names.KIND_QUOTA, "metadata": {"name": "q"},
            "spec": {"hard": {names.RESOURCE_CORE: cores}}}


def test_a_pod_whose_claim_is_over_quota_stays_gated_until_the_quota_is_raised(world: World) -> None:
    node = world.node(f"{world.prefix}-a")
    gpu = f"gpu-{node}-0"
    world.gpu(o.gpu(gpu, node=node, model=f"T{world.prefix}"))
    wffc = f"{world.prefix}-wffc"
    world.klass(o.klass(wffc, mode="WaitForFirstConsumer", parameters={"gpuModel": f"T{world.prefix}"}))
    custom = client.CustomObjectsApi(world.core.api_client)
    custom.create_namespaced_custom_object(names.GROUP, names.VERSION, world.namespace, names.PLURAL_QUOTA,
                                           _quota_body(20))
    world.claim(o.claim("big", cores=40, memory="1Gi", class_name=wffc))
    world.pod("user", claims={"main": "big"})
    controller = Controller(world.kube, ControllerSettings(quota=QuotaSettings(recheck_s=1.0, refresh_s=0.0)),
                            namespace=world.namespace)
    settle(controller)
    ready = world.claims_ready("user")
    assert ready is not None and ready["status"] == "False" and ready["reason"] == "QuotaExceeded", ready
    assert "ElasticGPUQuota q" in ready["message"] and "limit 20" in ready["message"], ready["message"]
    assert not (world.kube.get_gpu(gpu).get("status") or {}).get("allocations")  # nothing reserved

    custom.patch_namespaced_custom_object(names.GROUP, names.VERSION, world.namespace, names.PLURAL_QUOTA, "q",
                                          {"spec": {"hard": {names.RESOURCE_CORE: 40}}})
    deadline = time.monotonic() + 30
    while world.get_claim("big")["status"].get("phase") != "Bound":
        assert time.monotonic() < deadline, world.get_claim("big")["status"]
        controller.drain()
        time.sleep(0.05)
