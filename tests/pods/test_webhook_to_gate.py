"""The whole path with watches, as on a cluster: a pod created with only its annotations goes
through the admission webhook (a real process, HTTPS through the API server), which gates and
labels it; a running controller (its own watches and worker: no relists in between) sees it
through its label selector, makes and binds its inline claim, and lifts the gate; the claim's
watch events are what wake the pod. A pod without our annotations is never gated or touched."""

from __future__ import annotations

import threading
from typing import Any

from kubernetes import client

from elasticgpu.api import names
from elasticgpu.controller.decisions import pod_gate
from tests.binding import objects as o
from tests.pods.claim_world import World, controller_for, kube, wait_for, world

__all__ = ["kube", "world"]  # fixtures


def test_annotated_pod_is_gated_by_the_webhook_and_lifted_by_the_controller(
        world: World, webhook_factory: Any, api_client: client.ApiClient) -> None:
    webhook_factory(world.namespace)
    node = world.node(f"{world.prefix}-a")
    model = f"T{world.prefix}"
    world.gpu(o.gpu(f"gpu-{world.prefix}-0", node=node, model=model))
    world.klass(o.klass(f"{world.prefix}-default", default=True, parameters={"gpuModel": model}))
    controller = controller_for(world)
    stop = threading.Event()
    threads = controller.informer.start(stop, timeout_s=30, listed=controller.rebuild())
    worker = threading.Thread(target=controller.run_worker, args=(stop,), daemon=True)
    worker.start()
    core = client.CoreV1Api(api_client)
    try:
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "app", "annotations": {names.inline_request_annotation("main"): "gpu-core=25"}},
                "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]}}
        created = api_client.sanitize_for_serialization(core.create_namespaced_pod(world.namespace, body))
        assert pod_gate.is_gated(created)  # the webhook's work
        assert created["metadata"]["labels"] == {names.LABEL_USES_CLAIMS: "true"}
        plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
                 "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]}}
        core.create_namespaced_pod(world.namespace, plain)

        lifted = wait_for(lambda: (p := world.get_pod("app")) and not pod_gate.is_gated(p) and p,
                          "the controller to lift the gate")
        assert pod_gate.pinned_node(lifted) == node
        claim = world.get_claim("app-main")
        assert claim["status"]["phase"] == "Bound" and claim["status"]["nodeName"] == node
        assert claim["status"]["users"] == [{"name": "app", "uid": created["metadata"]["uid"]}]
        untouched = world.get_pod("plain")
        assert "labels" not in untouched["metadata"] and not untouched["spec"].get("affinity")

        world.delete_pod("app")
        wait_for(lambda: "app-main" not in {c["metadata"]["name"] for c in world.kube.list_claims(world.namespace)},
                 "the inline claim to go with its pod")
    finally:
        stop.set()
        for thread in [*threads, worker]:
            thread.join(timeout=40)
        controller.close()
