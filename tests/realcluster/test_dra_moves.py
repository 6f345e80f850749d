"""Issue 48 item 3's last two sentences, on Kubernetes' own kubelet (1.36.3) and scheduler with the test
containerd (CDI on), our controller, webhook and agent (the DRA driver), the node and product of
tests/realcluster/test_dra_kubelet.py (its fixtures, imported):

- our claims and DRA claims run side by side on one node: a pod with an ElasticGPUClaim (a slice of
  the card that is ours) and a pod with a ResourceClaim (the card that is DRA's) run at once, each
  sees only its own card, and deleting each frees exactly its card;
- a card moved from our controller to DRA and back while claims come and go is never given twice:
  both cards of the node move ElasticGPU -> DRA -> ElasticGPU, one after the other, while pods of
  both kinds are created and deleted; the GPU objects and ResourceClaims (watched, in etcd's
  order) and the containers (as containerd holds them) never show a card held by both sides,
  every move completes (OwnerMove Done), and every pod runs or is Pending with a reason.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes import client

from elasticgpu.api import dra_names, names
from tests.kube_cluster import kube_request
from tests.realcluster import card_holders
from tests.realcluster.test_claim_pod import CUSTOM, _claim_body, _container_env, container_env
from tests.realcluster.test_claim_pod import _pod as _our_pod
from tests.realcluster.test_claim_pod import product as product  # the module fixture: controller and webhook
from tests.realcluster.test_dra_kubelet import GPUS, RESOURCE, DraNode, _gpus, _running, _template, _wait
from tests.realcluster.test_dra_kubelet import _pod as _dra_pod
from tests.realcluster.test_dra_kubelet import dra_card as dra_card  # card 0 DRA's, card 1 ours
from tests.realcluster.test_dra_kubelet import dra_node as dra_node  # the node: kubelet, containerd, agent

pytestmark = pytest.mark.realcluster

CHURN_S = 75.0
"""How long pods come and go while the cards move (the whole file stays under 4 min on a loaded 2-core box)."""
HOLD_S = 4.0
"""How long a pod that reached Running keeps its card before the churn deletes it."""
PENDING_S = 25.0
"""How long a pod may stay Pending before the churn checks its reason and, with one, deletes it."""
START_S = 60.0
"""How long a pod may stay Pending with no reason (in flight: gate lifted, being placed or started on the
loaded node) before it is a problem."""
MOVE_S = 90.0
"""The most one move may take: its card's pods live HOLD_S once Running, then the grace (10 s) and a resync."""
PER_SIDE = 2
"""Pods of each side alive at once (each a half card, so one card of a side holds both)."""


def _class(api: client.ApiClient) -> str:
    name = f"moves-{uuid.uuid4().hex[:8]}"
    klass = {"apiVersion": names.API_VERSION, "kind": names.KIND_CLASS, "metadata": {"name": name},
             "provisioner": names.PROVISIONER_GPUSHARE, "parameters": {"gpuModel": "A100"},
             "reclaimPolicy": "Delete", "bindingMode": "Immediate"}  # fmt: skip
    assert kube_request(api, "POST", f"{CUSTOM}/{names.PLURAL_CLASS}", body=klass).status == 201
    return name


def _webhook_gates(api: client.ApiClient, namespace: str, node: DraNode) -> None:
    """Wait until the API server calls the webhook (its configuration is the webhook's own write at start):
    a pod with a claim created before would not be gated, and would run without its card."""

    def gated() -> bool:
        probe = _our_pod("probe", "x", node.image)
        made = kube_request(api, "POST", f"/api/v1/namespaces/{namespace}/pods", body=probe,
                            query=[("dryRun", "All")]).json()  # fmt: skip
        return any(g.get("name") == names.SCHEDULING_GATE for g in made["spec"].get("schedulingGates") or [])

    _wait("the webhook to gate a pod with a claim", gated, node)


def _gpu(api: client.ApiClient, name: str) -> dict[str, Any]:
    answer = kube_request(api, "GET", f"{GPUS}/{name}")
    assert answer.status == 200, answer.body
    body: dict[str, Any] = answer.json()
    return body


def _move(api: client.ApiClient, name: str, owner: str) -> None:
    patched = kube_request(api, "PATCH", f"{GPUS}/{name}", body={"spec": {"owner": owner}},
                           headers={"Content-Type": "application/merge-patch+json"})  # fmt: skip
    assert patched.status == 200, patched.body


def _move_done(gpu: dict[str, Any], owner: str) -> bool:
    status = gpu.get("status") or {}
    move = next((c for c in status.get("conditions") or [] if c["type"] == names.CONDITION_OWNER_MOVE), None)
    return (status.get("owner") or card_holders.OURS) == owner and move is not None and (
        move["status"], move["reason"]) == ("True", names.REASON_OWNER_DONE)  # fmt: skip


def _claim_path(namespace: str, name: str = "") -> str:
    return f"{CUSTOM}/namespaces/{namespace}/{names.PLURAL_CLAIM}" + (f"/{name}" if name else "")


def _dra_claim_of(api: client.ApiClient, core: client.CoreV1Api, namespace: str, pod: str) -> dict[str, Any]:
    [status] = core.read_namespaced_pod(pod, namespace).status.resource_claim_statuses
    answer = kube_request(api, "GET", f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{status.resource_claim_name}")
    assert answer.status == 200, answer.body
    body: dict[str, Any] = answer.json()
    return body


def test_our_claim_and_a_dra_claim_run_side_by_side_on_one_node_and_each_frees_its_card(
    api_client: client.ApiClient, dra_node: DraNode, dra_card: tuple[dict[str, Any], dict[str, Any]], namespace: str
) -> None:
    card, ours = dra_card
    core = client.CoreV1Api(api_client)
    klass = _class(api_client)
    _webhook_gates(api_client, namespace, dra_node)
    assert kube_request(api_client, "POST", _claim_path(namespace), body=_claim_body("slice", klass, 30, "10Gi")
                        ).status == 201  # fmt: skip
    _template(api_client, namespace, "whole", {"deviceClassName": "gpu.elasticgpu.io"})
    core.create_namespaced_pod(namespace, _our_pod("ours", "slice", dra_node.image))
    core.create_namespaced_pod(namespace, _dra_pod("theirs", "whole", dra_node.image))
    for pod in ("ours", "theirs"):
        assert _running(core, namespace, pod, dra_node).spec.node_name == dra_node.name
    bound = kube_request(api_client, "GET", _claim_path(namespace, "slice")).json()["status"]
    assert bound["gpus"] == [ours["spec"]["uuid"]], bound
    claim = _dra_claim_of(api_client, core, namespace, "theirs")
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert (result["pool"], result["device"]) == (dra_node.name, dra_names.device_name(card["spec"]["index"]))
    # Each process sees its own card and not the other's (what the container was given, run inside it).
    for pod, mine, other in (("ours", ours, card), ("theirs", card, ours)):
        inside = container_env(dra_node.runtime_endpoint, namespace, pod)
        assert inside.get("NVIDIA_VISIBLE_DEVICES") == mine["spec"]["uuid"], (pod, inside)
        assert other["spec"]["uuid"] not in str(inside), (pod, inside)
    assert [a["elasticGPU"] for a in _gpu(api_client, ours["metadata"]["name"])["status"]["allocations"]]
    assert not (_gpu(api_client, card["metadata"]["name"]).get("status") or {}).get("allocations")

    # Deleting ours frees card 1 only: its reservation goes; the DRA pod keeps running on card 0.
    core.delete_namespaced_pod("ours", namespace)
    kube_request(api_client, "DELETE", _claim_path(namespace, "slice"))
    _wait("our reservation released from card 1", lambda: not (
        _gpu(api_client, ours["metadata"]["name"]).get("status") or {}).get("allocations"), dra_node)  # fmt: skip
    assert core.read_namespaced_pod("theirs", namespace).status.phase == "Running"
    assert _dra_claim_of(api_client, core, namespace, "theirs")["status"]["allocation"] == claim["status"]["allocation"]
    assert claim["metadata"]["uid"] in card_holders_checkpoint(dra_node)
    # Deleting theirs frees card 0 only: kubelet unprepares the claim, the claim goes; card 1 stays free.
    core.delete_namespaced_pod("theirs", namespace)
    claims = f"{RESOURCE}/namespaces/{namespace}/resourceclaims"
    _wait("the DRA pod gone and its claim unprepared and deleted", lambda: not core.list_namespaced_pod(
        namespace).items and claim["metadata"]["uid"] not in card_holders_checkpoint(dra_node) and kube_request(
        api_client, "GET", claims).json()["items"] == [], dra_node)  # fmt: skip
    for gpu in _gpus(api_client):
        assert not (gpu.get("status") or {}).get("allocations"), gpu["status"]
    kube_request(api_client, "DELETE", f"{CUSTOM}/{names.PLURAL_CLASS}/{klass}")


def card_holders_checkpoint(node: DraNode) -> dict[str, Any]:
    """The driver's checkpoint entries (claim uid -> entry): the claims it prepared and not yet unprepared."""
    import json

    claims: dict[str, Any] = json.loads(node.checkpoint.read_text())["claims"]
    return claims


@dataclass
class Churned:
    """One pod of the churn."""

    name: str
    side: str
    created: float
    ran_on: set[str] = field(default_factory=set)  # the card uuids its claim held when it ran
    had: set[str] = field(default_factory=set)  # NVIDIA_VISIBLE_DEVICES of its container, as containerd holds it
    pending_reason: str = ""
    deleted: bool = False


class Churn:
    """Pods of both sides created and deleted, PER_SIDE of each alive at once (see the module docstring)."""

    def __init__(self, api: client.ApiClient, node: DraNode, namespace: str, klass: str,
                 uuid_of: Callable[[int], str]) -> None:  # fmt: skip
        self.api, self.node, self.namespace, self.klass, self.uuid_of = api, node, namespace, klass, uuid_of
        self.core = client.CoreV1Api(api)
        self.pods: dict[str, Churned] = {}
        self.problems: list[str] = []
        self._made = 0

    def side_of(self, namespace: str, pod: str) -> str | None:
        churned = self.pods.get(pod) if namespace == self.namespace else None
        return churned.side if churned is not None else None

    def alive(self, side: str | None = None) -> list[Churned]:
        return [p for p in self.pods.values() if not p.deleted and side in (None, p.side)]

    def create(self, side: str) -> None:
        self._made += 1
        name = f"{'ours' if side == card_holders.OURS else 'dra'}-{self._made}"
        # Known before it exists: the container sampler may see it before this returns.
        self.pods[name] = Churned(name, side, time.monotonic())
        if side == card_holders.OURS:
            answer = kube_request(self.api, "POST", _claim_path(self.namespace),
                                  body=_claim_body(name, self.klass, 50, "10Gi"))  # fmt: skip
            assert answer.status == 201, answer.body
            self.core.create_namespaced_pod(self.namespace, _our_pod(name, name, self.node.image))
        else:
            self.core.create_namespaced_pod(self.namespace, _dra_pod(name, "half", self.node.image))

    def delete(self, pod: Churned) -> None:
        pod.deleted = True
        self.core.delete_namespaced_pod(pod.name, self.namespace)
        if pod.side == card_holders.OURS:
            kube_request(self.api, "DELETE", _claim_path(self.namespace, pod.name))

    def step(self) -> None:
        """One look at every live pod: a Running pod's cards recorded and, after HOLD_S, deleted; a pod
        Pending past PENDING_S must say why, then goes; anything else is a problem."""
        now = time.monotonic()
        for pod in self.alive():
            body = self.core.read_namespaced_pod(pod.name, self.namespace)
            phase = body.status.phase
            if phase == "Running":
                if not pod.ran_on:
                    pod.ran_on = self._cards(pod)
                    env = _container_env(self.node.runtime_endpoint, self.namespace, pod.name)
                    pod.had = set(env.get("NVIDIA_VISIBLE_DEVICES", "<unset>").split(","))
                    pod.created = now  # from now, HOLD_S
                elif now - pod.created > HOLD_S:
                    self.delete(pod)
            elif phase == "Pending" and now - pod.created > PENDING_S:
                pod.pending_reason = self._pending_reason(pod, body)
                if pod.pending_reason or now - pod.created > START_S:
                    if not pod.pending_reason:
                        self.problems.append(f"{pod.name} Pending {START_S:g}s with no reason: "
                                             f"{self._story(pod, body)}")  # fmt: skip
                    self.delete(pod)
            elif phase not in ("Pending", "Running"):
                self.problems.append(f"{pod.name} {phase}: {self._story(pod, body)}")
                self.delete(pod)

    def _story(self, pod: Churned, body: Any) -> str:
        """What a pod in trouble went through: its node, containers' states, and its Events."""
        events = self.core.list_namespaced_event(self.namespace, field_selector=f"involvedObject.name={pod.name}")
        said = [f"{e.reason}: {e.message}" for e in events.items]
        states = [(c.name, c.state.waiting or c.state.terminated) for c in body.status.container_statuses or []]
        gates = [g.name for g in body.spec.scheduling_gates or []]
        agent = [line for line in self.node.agent.log.read_text(errors="replace").splitlines() if pod.name in line]
        return f"node {body.spec.node_name}, gates {gates}, containers {states}, events {said}, agent {agent[-6:]}"

    def _cards(self, pod: Churned) -> set[str]:
        """The cards the pod's claim holds, from the claim: ours' status.gpus, or the DRA allocation."""
        if pod.side == card_holders.OURS:
            status = kube_request(self.api, "GET", _claim_path(self.namespace, pod.name)).json().get("status") or {}
            return set(status.get("gpus") or [])
        claim = _dra_claim_of(self.api, self.core, self.namespace, pod.name)
        return {self.uuid_of(i) for pool, i in dra_names.allocated_cards(claim) if pool == self.node.name}

    def _pending_reason(self, pod: Churned, body: Any) -> str:
        """Why a Pending pod waits, as our controller (its claim, for ours) or the scheduler says it; "" when
        nothing says (in flight)."""
        if pod.side == card_holders.OURS:
            status = kube_request(self.api, "GET", _claim_path(self.namespace, pod.name)).json().get("status") or {}
            if status.get("phase") == "Pending" and status.get("reason") and status.get("message"):
                return f"claim {status['reason']}: {status['message']}"
        return next((f"{c.reason}: {c.message}" for c in body.status.conditions or []
                     if c.type == "PodScheduled" and c.status == "False" and c.message), "")  # fmt: skip


def test_cards_moved_to_dra_and_back_while_claims_come_and_go_are_never_given_twice(
    api_client: client.ApiClient, dra_node: DraNode, dra_card: tuple[dict[str, Any], dict[str, Any]], namespace: str
) -> None:
    card, ours = dra_card
    start = {card["metadata"]["name"]: card_holders.DRA, ours["metadata"]["name"]: card_holders.OURS}
    uuids = {g["spec"]["index"]: g["spec"]["uuid"] for g in (card, ours)}
    klass = _class(api_client)
    _webhook_gates(api_client, namespace, dra_node)
    _template(api_client, namespace, "half", {"deviceClassName": "gpu.elasticgpu.io",
                                              "capacity": {"requests": {"cores": "50", "memory": "10Gi"}}})  # fmt: skip
    churn = Churn(api_client, dra_node, namespace, klass, uuids.__getitem__)
    # Each card makes the round trip ElasticGPU -> DRA -> ElasticGPU (card 0 starts on DRA's side), one
    # move at a time, so that each side mostly has a card; repeated while the churn lasts.
    plan = [(ours, card_holders.DRA), (card, card_holders.OURS), (ours, card_holders.OURS), (card, card_holders.DRA)]
    moves: list[tuple[str, str, float]] = []
    waited: set[str] = set()  # the Waiting messages seen: what the moves waited for
    with card_holders.recording(api_client, dra_node.name, dra_node.runtime_endpoint, churn.side_of) as record:
        began = time.monotonic()
        move: tuple[dict[str, Any], str, float] | None = None
        step = 0
        # Pods come and go for CHURN_S, and longer until the plan made one round (every move once).
        while (churning := time.monotonic() - began < CHURN_S or step < len(plan)) or move is not None:
            for side in (card_holders.OURS, card_holders.DRA):
                while churning and len(churn.alive(side)) < PER_SIDE:
                    churn.create(side)
            churn.step()
            if move is None and churning:
                gpu, owner = plan[step % len(plan)]
                _move(api_client, gpu["metadata"]["name"], owner)
                move, step = (gpu, owner, time.monotonic()), step + 1
            elif move is not None:
                gpu, owner, since = move
                now = _gpu(api_client, gpu["metadata"]["name"])
                condition = next((c for c in (now.get("status") or {}).get("conditions") or []
                                  if c["type"] == names.CONDITION_OWNER_MOVE), {})  # fmt: skip
                if condition.get("reason") == names.REASON_OWNER_WAITING:
                    waited.add(condition["message"])
                if _move_done(now, owner):
                    moves.append((gpu["metadata"]["name"], owner, time.monotonic() - since))
                    move = None
                else:
                    assert time.monotonic() - since < MOVE_S, (
                        f"the move of {gpu['metadata']['name']} to {owner} not done in {MOVE_S:g}s: {now['status']}"
                        f"\n{dra_node.agent.tail(20)}")  # fmt: skip
            time.sleep(0.5)
        for pod in churn.alive():
            churn.delete(pod)
        core = client.CoreV1Api(api_client)
        _wait("every pod of the churn gone, every claim of both sides released", lambda: not core.list_namespaced_pod(
            namespace).items and not kube_request(api_client, "GET", _claim_path(namespace)).json()["items"] and not
            kube_request(api_client, "GET", f"{RESOURCE}/namespaces/{namespace}/resourceclaims").json()["items"]
            and not any((g.get("status") or {}).get("allocations") for g in _gpus(api_client)), dra_node)  # fmt: skip
        time.sleep(2)  # the last watch events and container samples
    # Back where the move plan started, so the module's other tests (and a rerun) find card 0 DRA's.
    for name, owner in start.items():
        _move(api_client, name, owner)
    for name, owner in start.items():
        _wait(f"{name} back to {owner}", lambda n=name, o=owner: _move_done(_gpu(api_client, n), o), dra_node)

    ran = [p for p in churn.pods.values() if p.ran_on]
    pending = [p for p in churn.pods.values() if p.pending_reason]
    summary = (f"{len(moves)} moves {[(n[:12], o, round(s, 1)) for n, o, s in moves]}; {len(churn.pods)} pods, "
               f"{len(ran)} ran ({sum(p.side == card_holders.DRA for p in ran)} DRA), {len(pending)} Pending "
               f"with a reason; {len(record.changes)} watch events, {record.samples} container samples; "
               f"waited for: {sorted(waited)[:4]}; recorder errors: {record.errors[:5]}")  # fmt: skip
    print(summary)
    twice = card_holders.violations(record.changes)
    for finding in (*twice, *record.overlaps, *churn.problems):
        print("FINDING:", finding)  # whole: an assertion's message is cut short
    assert not (twice or record.overlaps or churn.problems), (twice[:10], record.overlaps[:10], churn.problems)
    # Every pod that ran had exactly the card its claim held (as containerd holds its container: read when the
    # pod was seen Running, and in every sample that caught it; a pod that ran between samples has no sample).
    for pod in ran:
        seen = record.seen.get((namespace, pod.name), pod.ran_on)
        assert pod.had == seen == pod.ran_on, f"{pod.name} ({pod.side}) held {pod.ran_on}, its container had " \
                                              f"{pod.had}, in the samples {seen}"  # fmt: skip
    assert sum((namespace, p.name) in record.seen for p in ran) >= len(ran) // 2, summary  # the samples do sample
    # The loop did what it claims: both cards went both ways, with pods of both sides on both cards.
    assert {(n, o) for n, o, _ in moves} >= {(g["metadata"]["name"], o) for g in (card, ours)
                                            for o in (card_holders.DRA, card_holders.OURS)}, summary  # fmt: skip
    for side in (card_holders.OURS, card_holders.DRA):
        assert {u for p in ran if p.side == side for u in p.ran_on} == set(uuids.values()), (side, summary)
    assert any("waiting for" in m for m in waited), summary  # some move had to wait for a holder
    assert all(p.ran_on or p.pending_reason or p.created > began + CHURN_S - START_S for p in churn.pods.values()
               ), summary  # fmt: skip
