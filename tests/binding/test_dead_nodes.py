"""A dead or deleted node never holds its cards for ever (issue 23, item 3).

Against the API server with the real controller. A GPU's `status.runningClaims` is what its
agent last wrote; once the agent is silent for `GPUHealthSettings.running_claims_expire_s`, or
its Node is gone, the controller stops believing it: a released claim's reservation is freed and
its ElasticGPU reclaimed. GPU objects of a Node that stays gone for `node_gone_grace_s` are
deleted (the test server has no garbage collector to follow the agent's ownerReference). An
admin's annotation frees a reservation the agent still reports running, on purpose.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes import client

from elasticgpu.api import GPU, names
from elasticgpu.controller import errors
from elasticgpu.controller.decisions import running_holders
from elasticgpu.controller.decisions.running_holders import CONDITION_RELEASE_PENDING, REASON_CLAIM_STILL_RUNNING
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.picture.node_presence import NodePresence
from elasticgpu.controller.process.reconciling import Controller
from elasticgpu.controller.settings import ControllerSettings, GPUHealthSettings, ResyncSettings
from tests.binding import objects as o
from tests.binding.agent_status import write_gpu_status
from tests.binding.conftest import Cluster, settle


@pytest.fixture
def nodes(api_client: client.ApiClient) -> Iterator[Callable[[str], None]]:
    """Creates Nodes; deletes those left at the end."""
    core = client.CoreV1Api(api_client)
    made: list[str] = []

    def create(name: str) -> None:
        core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name)))
        made.append(name)

    yield create
    for name in made:
        with contextlib.suppress(client.ApiException):
            core.delete_node(name)


def _controller(kube: KubeApi, namespace: str, *, expire_s: float = 300.0, gone_grace_s: float = 3600.0
                ) -> Controller:
    settings = ControllerSettings(resync=ResyncSettings(orphan_grace_s=60.0), gpu_health=GPUHealthSettings(
        running_claims_expire_s=expire_s, node_gone_grace_s=gone_grace_s))
    return Controller(kube, settings, namespace=namespace)


def _running(claim: dict[str, Any]) -> dict[str, Any]:
    meta = claim["metadata"]
    return {"namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"],
            "pods": [f"{meta['namespace']}/job"], "since": "2026-01-01T00:00:00Z"}


def _beat(age_s: float) -> dict[str, Any]:
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - age_s))
    return {"type": "Heartbeat", "status": "True", "reason": "AgentHeartbeat", "message": "",
            "lastTransitionTime": when}


def _gone(read: Callable[[], Any]) -> bool:
    try:
        read()
    except errors.NotFound:
        return True
    return False


def _bound_and_running(cluster: Cluster, kube: KubeApi, controller: Controller, node: str,
                       **status: Any) -> tuple[str, str]:
    """One card on `node`, a claim bound to it whose pod the agent reports running; the claim deleted
    (its finalizer gone with its pods). Returns (GPU name, ElasticGPU name)."""
    model = f"T{cluster.prefix}"
    gpu_name = f"gpu-{cluster.prefix}-0"
    cluster.gpu(o.gpu(gpu_name, node=node, model=model))
    cluster.klass(o.klass(f"{cluster.prefix}-class", parameters={"gpuModel": model}))
    claim = cluster.claim(o.claim("job", cores=100, memory=None, class_name=f"{cluster.prefix}-class"))
    settle(controller)
    egpu_name = cluster.get_claim("job")["spec"]["elasticGPUName"]
    write_gpu_status(kube, gpu_name, runningClaims=[_running(claim)], **status)
    settle(controller)
    kube.patch_claim(cluster.namespace, "job", {"metadata": {"finalizers": []}})
    kube.delete_claim(cluster.namespace, "job")
    return gpu_name, egpu_name


def test_a_deleted_node_frees_its_reservations_and_its_gpu_objects(
        cluster: Cluster, kube: KubeApi, nodes: Callable[[str], None], api_client: client.ApiClient) -> None:
    node = f"{cluster.prefix}-node"
    nodes(node)
    controller = _controller(kube, cluster.namespace, gone_grace_s=1.0)
    gpu_name, egpu_name = _bound_and_running(cluster, kube, controller, node)
    settle(controller)
    pending = next(c for c in kube.get_elastic_gpu(egpu_name)["status"]["conditions"]
                   if c["type"] == CONDITION_RELEASE_PENDING)
    assert pending["reason"] == REASON_CLAIM_STILL_RUNNING, "the node is there: its agent's report holds"

    client.CoreV1Api(api_client).delete_node(node)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (_gone(lambda: kube.get_elastic_gpu(egpu_name))
                                               and _gone(lambda: kube.get_gpu(gpu_name))):
        settle(controller)
        time.sleep(0.2)
    assert _gone(lambda: kube.get_elastic_gpu(egpu_name)), (
        "the ElasticGPU of a claim on a deleted node is still held: "
        f"{kube.get_elastic_gpu(egpu_name).get('status')}")
    assert _gone(lambda: kube.get_gpu(gpu_name)), "the GPU object of a deleted node was not garbage-collected"


def test_a_silent_agent_s_running_claims_expire(cluster: Cluster, kube: KubeApi, nodes: Callable[[str], None]
                                               ) -> None:
    node = f"{cluster.prefix}-node"
    nodes(node)
    controller = _controller(kube, cluster.namespace, expire_s=600.0)
    gpu_name, egpu_name = _bound_and_running(cluster, kube, controller, node, conditions=[_beat(900.0)])
    settle(controller)
    assert _gone(lambda: kube.get_elastic_gpu(egpu_name)), (
        "an agent silent for 900 s (expiry 600 s) still holds the card: "
        f"{kube.get_elastic_gpu(egpu_name).get('status')}")
    assert [a["elasticGPU"] for a in kube.get_gpu(gpu_name)["status"].get("allocations") or []] == []
    assert not _gone(lambda: kube.get_gpu(gpu_name)), "the node is there: its GPU object stays"


def test_a_fresh_heartbeat_keeps_the_running_claim(cluster: Cluster, kube: KubeApi, nodes: Callable[[str], None]
                                                  ) -> None:
    node = f"{cluster.prefix}-node"
    nodes(node)
    controller = _controller(kube, cluster.namespace, expire_s=600.0)
    gpu_name, egpu_name = _bound_and_running(cluster, kube, controller, node, conditions=[_beat(5.0)])
    settle(controller)
    assert [a["elasticGPU"] for a in kube.get_gpu(gpu_name)["status"]["allocations"]] == [egpu_name]


def test_an_admin_forces_the_release(cluster: Cluster, kube: KubeApi, nodes: Callable[[str], None]) -> None:
    node = f"{cluster.prefix}-node"
    nodes(node)
    controller = _controller(kube, cluster.namespace)
    gpu_name, egpu_name = _bound_and_running(cluster, kube, controller, node)
    settle(controller)
    pending = next(c for c in kube.get_elastic_gpu(egpu_name)["status"]["conditions"]
                   if c["type"] == CONDITION_RELEASE_PENDING)
    assert "kubectl egpu release --force" in pending["message"], "the way out is named where the user looks"
    kube.patch_elastic_gpu(egpu_name, {"metadata": {"annotations": {names.ANNOTATION_FORCE_RELEASE: "true"}}})
    settle(controller)
    assert _gone(lambda: kube.get_elastic_gpu(egpu_name))
    assert kube.get_gpu(gpu_name)["status"].get("allocations") in (None, [])


# -- the rules, pure -----------------------------------------------------------------------------

_EVENTS = st.lists(st.tuples(st.sampled_from(["add", "delete", "list"]), st.sampled_from(["n1", "n2"]),
                             st.sampled_from(["u1", "u2"])), max_size=12)


def _gpu(node: str, owner_uid: str | None) -> GPU:
    body = o.gpu("gpu-x", node=node)
    if owner_uid is not None:
        body["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": owner_uid}]
    return GPU.model_validate(body)


@given(events=_EVENTS, owner_uid=st.sampled_from([None, "u1", "u2"]))
def test_a_gpu_s_node_is_gone_exactly_when_the_last_word_says_so(events: list[tuple[str, str, str]],
                                                                 owner_uid: str | None) -> None:
    """Over any order of Node watch events and lists: nothing is gone before a complete list; a GPU
    owned by a Node is gone when no Node of that name and uid exists (the garbage collector's rule); a GPU
    without an owner only once its Node was seen and is missing now."""
    presence = NodePresence(threading.RLock(), clock=lambda: 0.0)
    present: dict[str, str] = {}
    seen: set[str] = set()
    complete = False
    for kind, name, uid in events:
        body = {"metadata": {"name": name, "uid": uid}}
        if kind == "add":
            presence.put(body, deleted=False)
            present[name] = uid
            seen.add(name)
        elif kind == "delete":
            presence.put(body, deleted=True)
            if present.get(name) == uid:
                del present[name]
        else:  # a list of what is present now
            presence.merge([{"metadata": {"name": n, "uid": u}} for n, u in present.items()])
            complete = True
            seen |= set(present)
    gpu = _gpu("n1", owner_uid)
    if not complete:
        expected = False
    elif owner_uid is not None:
        expected = present.get("n1") != owner_uid
    else:
        expected = "n1" in seen and "n1" not in present
    assert (presence.gone_for(gpu) is not None) == expected
    why = running_holders.expired_reason(gpu, now=1000.0, expire_after_s=300.0, node_gone_for_s=presence.gone_for(gpu))
    assert bool(why) == expected  # no heartbeat: only a gone Node expires its reports


def test_the_expiry_settings_come_from_the_environment_and_are_checked() -> None:
    settings = ControllerSettings.from_env({"ELASTICGPU_RUNNING_CLAIMS_EXPIRE_S": "600",
                                            "ELASTICGPU_NODE_GONE_GRACE_S": "30"})
    assert (settings.gpu_health.running_claims_expire_s, settings.gpu_health.node_gone_grace_s) == (600.0, 30.0)
    assert "ELASTICGPU_RUNNING_CLAIMS_EXPIRE_S (300)" in ControllerSettings.environment_help()
    with pytest.raises(ValueError, match="ELASTICGPU_RUNNING_CLAIMS_EXPIRE_S=60 is below ELASTICGPU_HEARTBEAT_GRACE_S"):
        ControllerSettings.from_env({"ELASTICGPU_RUNNING_CLAIMS_EXPIRE_S": "60"})
