"""The agent and the controller together (issue 10 items 2 and 5): the real agent process
(simulated backend, heartbeat every 2 s) publishes its cards; a controller (heartbeat grace 5 s,
worked by `settle` from its watches) binds a claim there. The agent stops (SIGSTOP): its cards
become `Ready=False` (HeartbeatExpired) with no event to say so, take no new claim, keep the
bound one. The agent resumes: its writes keep the controller's condition, the cards are
`Ready=True` again and the waiting claim binds. A fatal XID injected into the agent fails the
bound claim's ElasticGPU (reason Xid79) and makes the claim Lost."""

from __future__ import annotations

import contextlib
import signal
import time
import uuid
from collections.abc import Callable
from typing import Any

from kubernetes import client

from elasticgpu.agent.discovery import simulated
from elasticgpu.api import names
from elasticgpu.controller import errors
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.process.reconciling import Controller
from elasticgpu.controller.settings import ControllerSettings, GPUHealthSettings
from tests.agent.conftest import RunningAgent, wait_for
from tests.agent.objects import condition, node_gpus
from tests.binding import objects as o
from tests.binding.conftest import Cluster, cluster, kube, settle

__all__ = ["cluster", "kube"]


def _until(what: str, controller: Controller, check: Callable[[], Any], *, timeout: float = 40.0) -> Any:
    """Work the controller (`settle`) until `check()` holds; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        settle(controller)
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        time.sleep(0.2)


def _ready(gpu: dict[str, Any]) -> tuple[str, str] | None:
    found = condition(gpu, "Ready")
    return None if found is None else (found["status"], found["reason"])


def test_heartbeat_and_xid_from_the_real_agent(api_client: client.ApiClient, node_name: str,
                                              start_agent: Callable[..., RunningAgent], cluster: Cluster,
                                              kube: KubeApi) -> None:
    model = f"T{uuid.uuid4().hex[:8]}"
    description = {"driver": {"version": "550.54.15", "cuda": "12.4"},
                   "cards": [{"model": model, "memory": "80Gi", "numa": 0, "count": 2}]}
    agent = start_agent(node_name, description)
    gpu_names = [names.gpu_object_name(simulated.simulated_uuid(node_name, i)) for i in range(2)]
    try:
        wait_for("both GPU objects with a heartbeat", lambda: (gpus := node_gpus(api_client, node_name))
                 and set(gpus) == set(gpu_names) and all(condition(g, "Heartbeat") for g in gpus.values()))
        class_name = f"{cluster.prefix}-class"
        cluster.klass(o.klass(class_name, parameters={"gpuModel": model}))
        cluster.claim(o.claim("c1", cores=60, memory="10Gi", class_name=class_name))
        settings = ControllerSettings(gpu_health=GPUHealthSettings(heartbeat_grace_s=5.0))
        controller = Controller(kube, settings, namespace=cluster.namespace)
        settle(controller)
        bound = cluster.get_claim("c1")
        assert bound["status"]["phase"] == "Bound", bound["status"]
        assert all(_ready(g) is None for g in node_gpus(api_client, node_name).values())

        # The agent stops: no event comes, the delayed recheck finds the heartbeats expired.
        agent.process.send_signal(signal.SIGSTOP)
        try:
            _until("both cards Ready=False", controller, lambda: all(
                _ready(g) == ("False", "HeartbeatExpired") for g in node_gpus(api_client, node_name).values()))
            cluster.claim(o.claim("c2", cores=60, memory="10Gi", class_name=class_name))
            settle(controller)
            assert cluster.get_claim("c2")["status"]["phase"] == "Pending"
            assert cluster.get_claim("c1")["status"]["phase"] == "Bound"
            held = [a for g in gpu_names for a in (kube.get_gpu(g).get("status") or {}).get("allocations") or []]
            assert [a["cores"] for a in held] == [60], "the bound claim's reservation is kept"
        finally:
            agent.process.send_signal(signal.SIGCONT)

        # Back: the agent's writes keep Ready (not its condition); the controller renews it.
        _until("both cards Ready=True", controller, lambda: all(
            _ready(g) == ("True", "HeartbeatRenewed") for g in node_gpus(api_client, node_name).values()))
        _until("c2 bound", controller, lambda: cluster.get_claim("c2")["status"]["phase"] == "Bound")
        for gpu in node_gpus(api_client, node_name).values():
            assert {c["type"] for c in gpu["status"]["conditions"]} >= {"Heartbeat", "Healthy", "Ready"}

        # A fatal XID on c1's card: its ElasticGPU fails with the XID, the claim is Lost with it.
        card = [simulated.simulated_uuid(node_name, i) for i in range(2)].index(bound["status"]["gpus"][0])
        simulated.inject(agent.inject_dir, {"xid": {"card": card, "code": 79, "message": "fell off the bus"}})
        lost = _until("c1 Lost", controller, lambda: (c := cluster.get_claim("c1"))["status"]["phase"] == "Lost"
                      and c)
        assert lost["status"]["reason"] == "ElasticGPUFailed" and "fatal XID 79" in lost["status"]["message"]
        egpu = kube.get_elastic_gpu(bound["spec"]["elasticGPUName"])
        assert (egpu["status"]["phase"], egpu["status"]["reason"]) == ("Failed", "Xid79")
        assert cluster.get_claim("c2")["status"]["phase"] == "Bound", "the other card's claim is untouched"
    finally:
        agent.process.terminate()  # first: a running agent would publish its cards again
        agent.process.wait(timeout=15)
        for name in gpu_names:
            with contextlib.suppress(errors.NotFound):
                kube.delete_gpu(name)
