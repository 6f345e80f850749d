"""A GPU's health as the controller reads it (issue 10, items 2 and 5).

The decisions of `gpu_health` as a table; then against the API server, with GPU status written
the way the agent writes it (a merge patch of `status` with a resourceVersion precondition):
an expired heartbeat sets the card aside (no new reservations, `Ready=False`, reservations
kept) and a fresh one brings it back; a heartbeat that expires with no event is noticed (a
delayed requeue); a GPU that never had a heartbeat is taken as it is; an Unhealthy card takes
no new reservations; a fatal XID fails the card's ElasticGPU and makes its claim Lost.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from elasticgpu.agent.kube import AgentKube, load_api_client
from elasticgpu.api import GPU, names
from elasticgpu.controller.decisions import gpu_health
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.process.reconciling import Controller
from elasticgpu.controller.settings import ControllerSettings, GPUHealthSettings, ResyncSettings
from tests.binding import objects as o
from tests.binding.conftest import Cluster

NOW = 1_800_000_000.0


def _stamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(seconds)))


def _conditions(*, beat: float | None, healthy: tuple[str, str] = ("True", "NoFatalXid"),
                extra: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The agent's conditions: Heartbeat (when `beat`), Healthy, as `desired_status` writes them."""
    conditions = [{"type": "Healthy", "status": healthy[0], "reason": healthy[1],
                   "message": "fatal XID 79 at 2026-12-03T06:00:00Z" if healthy[0] == "False" else "",
                   "lastTransitionTime": _stamp(NOW)}]
    if beat is not None:
        conditions.append({"type": "Heartbeat", "status": "True", "reason": "AgentHeartbeat",
                           "message": "the agent sees this card", "lastTransitionTime": _stamp(beat)})
    return sorted(conditions + (extra or []), key=lambda c: str(c["type"]))


def _model(conditions: list[dict[str, Any]]) -> GPU:
    body = o.gpu("gpu-a")
    body["status"] = {"conditions": conditions}
    return GPU.model_validate(body)


# -- the decisions ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("beat", "ready", "reason", "recheck"), [
    (None, True, "", None),  # never had a heartbeat: taken as it is
    (NOW - 10, True, "", 111.0),  # fresh: recheck when the grace runs out (+1 s)
    (NOW - 120, True, "", 1.0),  # exactly the grace: still ready
    (NOW - 121, False, "HeartbeatExpired", None),  # expired: only a new beat (an event) changes it
])
def test_readiness_by_heartbeat_age(beat: float | None, ready: bool, reason: str, recheck: float | None) -> None:
    state = gpu_health.readiness(_model(_conditions(beat=beat)), now=NOW, grace_s=120.0)
    assert (state.ready, state.reason, state.recheck_in_s) == (ready, reason, recheck)
    if not ready:
        assert "no heartbeat from the agent of node node-1 for 121s (grace 120s)" in state.message


@pytest.mark.parametrize(("ready_condition", "ready", "writes"), [
    (None, True, None),  # never marked, ready: no write (a healthy cluster costs nothing)
    (None, False, ("False", "HeartbeatExpired")),
    (("False", "HeartbeatExpired"), False, None),  # said already
    (("False", "HeartbeatExpired"), True, ("True", "HeartbeatRenewed")),
    (("True", "HeartbeatRenewed"), True, None),
    (("True", "HeartbeatRenewed"), False, ("False", "HeartbeatExpired")),
])
def test_condition_to_write(ready_condition: tuple[str, str] | None, ready: bool,
                            writes: tuple[str, str] | None) -> None:
    extra = [] if ready_condition is None else [{"type": "Ready", "status": ready_condition[0],
                                                 "reason": ready_condition[1]}]
    model = _model(_conditions(beat=NOW if ready else NOW - 500, extra=extra))
    state = gpu_health.readiness(model, now=NOW, grace_s=120.0)
    written = gpu_health.condition_to_write(model, state, now_rfc3339=_stamp(NOW))
    assert (None if written is None else (written["status"], written["reason"])) == writes


def test_with_condition_keeps_the_agents_conditions() -> None:
    agents = _conditions(beat=NOW, extra=[{"type": "ApplicationXid", "status": "True", "reason": "Xid13"}])
    ready = {"type": "Ready", "status": "False", "reason": "HeartbeatExpired"}
    once = gpu_health.with_condition(agents, ready)
    twice = gpu_health.with_condition(once, {**ready, "status": "True", "reason": "HeartbeatRenewed"})
    assert [c["type"] for c in twice] == ["ApplicationXid", "Healthy", "Heartbeat", "Ready"]
    assert twice[:3] == agents and twice[3]["reason"] == "HeartbeatRenewed"


@pytest.mark.parametrize(("healthy", "fatal"), [
    (("True", "NoFatalXid"), None),
    (("True", "Recovered"), None),
    (("False", "Xid79"), "Xid79"),
    (("False", "Vanished"), "Vanished"),
    (("False", "XidUnknown"), None),  # not a reason the agent writes: not taken as fatal
    (("False", "Xid48"), "Xid48"),  # needs a reset
    (("False", "Xid4242"), "Xid4242"),  # not in the table: needs a reset
    (("False", "Xid94"), None),  # transient: no new reservations until it recovers, the work goes on
    (("False", "Xid63"), None),  # informational (an older agent failed the card for it)
    (("True", "Reset"), None),
    (("Unknown", "Xid79"), None),
])
def test_fatal_failure(healthy: tuple[str, str], fatal: str | None) -> None:
    failure = gpu_health.fatal_failure(_model(_conditions(beat=NOW, healthy=healthy)))
    assert (failure.reason if failure else None) == fatal
    if failure is not None and fatal == "Xid79":
        assert failure.message.startswith("GPU gpu-a on node node-1 fatal XID 79: fatal XID 79 at")


# -- against the API server ------------------------------------------------------------------------


class Agent:
    """Writes GPU status as the node agent does: a merge patch of `status` with the
    resourceVersion it last saw (`AgentKube.patch_gpu_status`), keeping the conditions that are
    not its own (inventory.desired_status)."""

    def __init__(self, kube: KubeApi, kubeconfig: str) -> None:
        self.kube = kube
        self.api = AgentKube(load_api_client(kubeconfig, None), node_name="node-1", field_manager="test-agent")

    def write(self, name: str, *, beat: float | None, health: str = "Healthy",
              healthy: tuple[str, str] = ("True", "NoFatalXid")) -> dict[str, Any]:
        current = self.kube.get_gpu(name)
        status = current.get("status") or {}
        others = [c for c in status.get("conditions") or []
                  if c.get("type") not in ("Heartbeat", "Healthy", "ApplicationXid")]
        desired = {"health": health, "conditions": _conditions(beat=beat, healthy=healthy, extra=others)}
        return self.api.patch_gpu_status(name, resource_version=current["metadata"]["resourceVersion"],
                                         status=desired)

    def close(self) -> None:
        self.api.close()


@pytest.fixture
def agent(kube: KubeApi, kube_cluster: Any) -> Iterator[Agent]:
    writer = Agent(kube, str(kube_cluster.kubeconfig))
    try:
        yield writer
    finally:
        writer.close()


def _controller(kube: KubeApi, namespace: str, *, grace_s: float = 120.0) -> Controller:
    settings = ControllerSettings(resync=ResyncSettings(orphan_grace_s=60.0),
                                  gpu_health=GPUHealthSettings(heartbeat_grace_s=grace_s))
    return Controller(kube, settings, namespace=namespace)


def _setup(cluster: Cluster) -> tuple[str, str]:
    model = f"T{cluster.prefix}"
    name = f"gpu-{cluster.prefix}-0"
    cluster.gpu(o.gpu(name, node=f"{cluster.prefix}-node", model=model))
    class_name = f"{cluster.prefix}-class"
    cluster.klass(o.klass(class_name, parameters={"gpuModel": model}))
    return name, class_name


def _work(controller: Controller, *, deadline_s: float = 30.0) -> None:
    """Work the queue off (no relist: what the syncs' answers and the test's events queue)."""
    deadline = time.monotonic() + deadline_s
    controller.drain()
    while controller.queue.waiting():
        assert time.monotonic() < deadline, f"{controller.queue.waiting()} keys still queued"
        time.sleep(0.05)
        controller.drain()


def _ready(kube: KubeApi, name: str) -> tuple[str, str] | None:
    for condition in (kube.get_gpu(name).get("status") or {}).get("conditions") or []:
        if condition["type"] == "Ready":
            return condition["status"], condition["reason"]
    return None


def _phase(cluster: Cluster, claim: str) -> str:
    return str((cluster.get_claim(claim).get("status") or {}).get("phase"))


def test_expired_heartbeat_sets_the_card_aside_and_a_fresh_one_brings_it_back(
        cluster: Cluster, kube: KubeApi, agent: Agent) -> None:
    gpu, class_name = _setup(cluster)
    agent.write(gpu, beat=time.time() - 600)
    cluster.claim(o.claim("c1", cores=30, memory="10Gi", class_name=class_name))
    controller = _controller(kube, cluster.namespace)
    controller.rebuild()
    _work(controller)
    assert _phase(cluster, "c1") == "Pending"
    assert _ready(kube, gpu) == ("False", "HeartbeatExpired")
    written = kube.get_gpu(gpu)
    types = [c["type"] for c in written["status"]["conditions"]]
    assert types == ["Healthy", "Heartbeat", "Ready"], "the agent's conditions are kept"
    assert not written["status"].get("allocations")
    events = [e for e in kube.list_events(kube.settings.events_namespace)
              if e["involvedObject"]["name"] == gpu and e["reason"] == "HeartbeatExpired"]
    assert events and events[0]["type"] == "Warning"

    # The agent comes back: its write keeps the controller's Ready (it is not the agent's).
    answer = agent.write(gpu, beat=time.time())
    assert _ready(kube, gpu) == ("False", "HeartbeatExpired")
    controller.observe("gpu", "MODIFIED", answer)
    _work(controller)
    assert _ready(kube, gpu) == ("True", "HeartbeatRenewed")
    assert _phase(cluster, "c1") == "Bound", "a card ready again wakes the claims waiting for capacity"


def test_reservations_on_a_card_whose_heartbeat_expires_are_kept(
        cluster: Cluster, kube: KubeApi, agent: Agent) -> None:
    gpu, class_name = _setup(cluster)
    agent.write(gpu, beat=time.time())
    cluster.claim(o.claim("c1", cores=30, memory="10Gi", class_name=class_name))
    controller = _controller(kube, cluster.namespace, grace_s=2.0)
    controller.rebuild()
    _work(controller)
    assert _phase(cluster, "c1") == "Bound"
    assert _ready(kube, gpu) is None, "a ready card that was never set aside gets no Ready write"

    # No event arrives: the heartbeat expires on the clock, and the delayed requeue notices.
    cluster.claim(o.claim("c2", cores=30, memory="10Gi", class_name=class_name))
    claim = kube.get_claim(cluster.namespace, "c2")
    deadline = time.monotonic() + 15.0
    while _ready(kube, gpu) is None:
        assert time.monotonic() < deadline, "the expired heartbeat was never noticed (no delayed requeue)"
        time.sleep(0.2)
        controller.drain()
    assert _ready(kube, gpu) == ("False", "HeartbeatExpired")
    controller.observe("claim", "ADDED", claim)
    _work(controller)
    assert _phase(cluster, "c1") == "Bound"
    assert _phase(cluster, "c2") == "Pending", "no new reservation on a card whose agent is silent"
    assert [a["cores"] for a in kube.get_gpu(gpu)["status"]["allocations"]] == [30]


def test_a_gpu_that_never_had_a_heartbeat_is_taken_as_it_is(cluster: Cluster, kube: KubeApi) -> None:
    gpu, class_name = _setup(cluster)
    cluster.claim(o.claim("c1", cores=30, memory="10Gi", class_name=class_name))
    controller = _controller(kube, cluster.namespace, grace_s=0.0)
    controller.rebuild()
    _work(controller)
    assert _phase(cluster, "c1") == "Bound"
    assert _ready(kube, gpu) is None


def test_an_unhealthy_card_takes_no_new_reservations(cluster: Cluster, kube: KubeApi, agent: Agent) -> None:
    gpu, class_name = _setup(cluster)
    # Unhealthy with no fatal reason in its conditions (as a hand-written object may say)
    agent.write(gpu, beat=time.time(), health="Unhealthy", healthy=("Unknown", "Probing"))
    cluster.claim(o.claim("c1", cores=30, memory="10Gi", class_name=class_name))
    controller = _controller(kube, cluster.namespace)
    controller.rebuild()
    _work(controller)
    claim = cluster.get_claim("c1")
    assert claim["status"]["phase"] == "Pending"
    assert "Unhealthy" in claim["status"]["conditions"][0]["message"]
    answer = agent.write(gpu, beat=time.time())
    controller.observe("gpu", "MODIFIED", answer)
    _work(controller)
    assert _phase(cluster, "c1") == "Bound"


def test_a_card_an_admin_marks_duplicate_takes_no_new_reservations(cluster: Cluster, kube: KubeApi) -> None:
    """Two nodes have one uuid (issue 23, item 8): the object's node may not be the card's node (an agent can
    create another node's card first). An admin who marks it DuplicateUUID keeps new reservations off it
    until settled (Ready=False, DuplicateUUID); what it holds is kept."""
    gpu, class_name = _setup(cluster)
    body = kube.get_gpu(gpu)
    body["status"] = {"conditions": [{
        "type": "DuplicateUUID", "status": "True", "reason": "ReportedByAdmin", "lastTransitionTime": _stamp(NOW),
        "message": f"card {body['spec']['uuid']} is on node other too"}]}
    kube.replace_gpu_status(body)
    cluster.claim(o.claim("c1", cores=30, memory="10Gi", class_name=class_name))
    controller = _controller(kube, cluster.namespace)
    controller.rebuild()
    _work(controller)
    assert _phase(cluster, "c1") == "Pending"
    assert _ready(kube, gpu) == ("False", "DuplicateUUID")
    ready = next(c for c in kube.get_gpu(gpu)["status"]["conditions"] if c["type"] == "Ready")
    assert "node other" in ready["message"] and "kubectl delete pgpu" in ready["message"]


def test_another_nodes_duplicate_report_sets_no_card_aside(cluster: Cluster, kube: KubeApi) -> None:
    """Issue 44: one node's token could write DuplicateUUID on every other node's GPU (the policy let an agent
    make that one write on another node's object), and the controller set each card aside: reservations
    stopped cluster-wide. A report another node wrote is acted on nowhere."""
    gpu, class_name = _setup(cluster)
    body = kube.get_gpu(gpu)
    body["status"] = {"conditions": [{
        "type": "DuplicateUUID", "status": "True", "reason": "SeenOnAnotherNode", "lastTransitionTime": _stamp(NOW),
        "message": f"node other: its driver reports card {body['spec']['uuid']} (index 0) too"}]}
    kube.replace_gpu_status(body)
    cluster.claim(o.claim("c1", cores=30, memory="10Gi", class_name=class_name))
    controller = _controller(kube, cluster.namespace)
    controller.rebuild()
    _work(controller)
    assert _phase(cluster, "c1") == "Bound"


def test_a_fatal_xid_fails_the_elastic_gpu_and_loses_its_claim(
        cluster: Cluster, kube: KubeApi, agent: Agent) -> None:
    gpu, class_name = _setup(cluster)
    agent.write(gpu, beat=time.time())
    created = cluster.claim(o.claim("c1", cores=30, memory="10Gi", class_name=class_name))
    controller = _controller(kube, cluster.namespace)
    controller.rebuild()
    _work(controller)
    assert _phase(cluster, "c1") == "Bound"
    answer = agent.write(gpu, beat=time.time(), health="Unhealthy", healthy=("False", "Xid79"))
    controller.observe("gpu", "MODIFIED", answer)
    _work(controller)
    egpu = kube.get_elastic_gpu(names.elastic_gpu_name_for_claim(created["metadata"]["uid"]))
    assert (egpu["status"]["phase"], egpu["status"]["reason"]) == ("Failed", "Xid79")
    assert "fatal XID 79" in egpu["status"]["message"]
    claim = cluster.get_claim("c1")
    assert claim["status"]["phase"] == "Lost"
    [lost] = claim["status"]["conditions"]
    assert lost["type"] == "Lost" and "fatal XID 79" in lost["message"]
    assert (claim["status"]["reason"], claim["status"]["message"]) == ("ElasticGPUFailed", lost["message"])
