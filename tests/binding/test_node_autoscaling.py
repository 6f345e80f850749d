"""Node autoscalers against the API server: claims that wait for capacity get placeholder pods (one
node asked per need, not per retry), their NodeRequested condition says which, a node that never
comes gives a reason and an Event, the node that came serves them and the placeholders go, and a
node holds the autoscalers' do-not-remove annotations exactly while its cards hold claims.

The test plays the node autoscaler's part (a Node and its agent's GPU objects appear); the
real autoscaler's part is tests/realcluster/test_karpenter.py."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from elasticgpu.controller.decisions import node_protection, node_requests
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.process.reconciling import Controller
from elasticgpu.controller.settings import AutoscaleSettings, ControllerSettings, ResyncSettings
from tests.binding import objects as o
from tests.binding.conftest import Cluster, settle


@pytest.fixture
def nodes(api_client: client.ApiClient) -> Iterator[Callable[[str, dict[str, str]], None]]:
    """Creates Nodes (as a node autoscaler would); deletes those left at the end."""
    core = client.CoreV1Api(api_client)
    made: list[str] = []

    def create(name: str, labels: dict[str, str]) -> None:
        core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name, labels=labels)))
        made.append(name)

    yield create
    for name in made:
        with contextlib.suppress(client.ApiException):
            core.delete_node(name)


def _controller(kube: KubeApi, namespace: str) -> Controller:
    settings = ControllerSettings(resync=ResyncSettings(orphan_grace_s=60.0), autoscale=AutoscaleSettings(
        enabled=True, protect_nodes=True, namespace=namespace, give_up_s=600.0))
    return Controller(kube, settings, namespace=namespace)


def _placeholders(kube: KubeApi, namespace: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in kube.list_labelled_pods(namespace,
                                                                       f"{node_requests.LABEL_NODE_REQUEST}=true")}


def _asked(claim: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in claim["status"].get("conditions") or []
                 if c["type"] == node_requests.CONDITION_NODE_REQUESTED), None)


def _events(kube: KubeApi, namespace: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in kube.list_events(namespace) if e["reason"] == reason]


def _wait_for(check: Callable[[], bool], what: str, *, deadline_s: float = 60.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {deadline_s:g}s: {what}")
        time.sleep(0.1)


def test_waiting_claims_ask_for_one_node_each_need_and_bind_on_the_node_that_comes(
        cluster: Cluster, kube: KubeApi, nodes: Callable[[str, dict[str, str]], None]) -> None:
    prefix = cluster.prefix
    model = f"T{prefix}"
    parameters = {"gpuModel": model, "nodeSelector": f"pool={prefix}"}
    cluster.klass(o.klass(f"{prefix}-pool", parameters=parameters))
    cluster.klass(o.klass(f"{prefix}-whole", provisioner="elasticgpu.io/physical", parameters=parameters))
    for i in range(3):
        cluster.claim(o.claim(f"share-{i}", cores=30, memory="10Gi", class_name=f"{prefix}-pool"))
    cluster.claim(o.claim("pair", cards=2, cores=None, memory=None, class_name=f"{prefix}-whole"))
    controller = _controller(kube, cluster.namespace)
    settle(controller)
    assert {cluster.get_claim(n)["status"]["reason"] for n in ("share-0", "share-1", "share-2", "pair")} == {
        "NoCapacity"}

    # Scale from zero: three shares fit one card, the pair needs two on one node: two placeholders,
    # however many passes (retries) there are.
    for _ in range(3):
        controller.node_autoscaling.pass_once()
        settle(controller)
    placeholders = _placeholders(kube, cluster.namespace)
    asked = sorted(int(p["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"])
                   for p in placeholders.values())
    assert asked == [1, 2], placeholders
    assert all(p["spec"]["nodeSelector"] == {"pool": prefix} for p in placeholders.values())
    assert controller.node_autoscaling.asked == 2
    pair = cluster.get_claim("pair")
    condition = _asked(pair)
    assert condition is not None and condition["reason"] == "NodeRequested", pair["status"]
    assert f"placeholder pod {cluster.namespace}/egpu-node-request-" in condition["message"]
    assert "asks nvidia.com/gpu: 2 on a node with pool=" in condition["message"]
    assert pair["status"]["reason"] == "NoCapacity"  # still says why it waits
    assert len(_events(kube, cluster.namespace, "NodeRequested")) == 4  # one per claim, not per pass

    # No node within the wait: a reason and a Warning, once.
    later = time.time() + 601
    controller.node_autoscaling.pass_once(now=later)
    controller.node_autoscaling.pass_once(now=later + 5)
    settle(controller)
    condition = _asked(cluster.get_claim("share-0"))
    assert condition is not None and condition["reason"] == "NodeNotProvisioned"
    assert "no node came in" in condition["message"]
    warnings = _events(kube, cluster.namespace, "NodeNotProvisioned")
    assert len(warnings) == 4 and {e["type"] for e in warnings} == {"Warning"}

    # The node comes, its agent publishes three cards: every claim binds there.
    node = f"{prefix}-new"
    nodes(node, {"pool": prefix})
    for i in range(3):
        cluster.gpu(o.gpu(f"gpu-{prefix}-{i}", node=node, model=model, index=i))
    settle(controller)
    for name in ("share-0", "share-1", "share-2", "pair"):
        claim = cluster.get_claim(name)
        assert claim["status"]["phase"] == "Bound" and claim["status"]["nodeName"] == node, claim["status"]
    # The placeholders go; the node holding claims is kept from scale-down.
    controller.node_autoscaling.pass_once()
    assert _placeholders(kube, cluster.namespace) == {}
    annotations = kube.get_node(node)["metadata"].get("annotations") or {}
    assert {k: annotations.get(k) for k in node_protection.PROTECTING} == node_protection.PROTECTING

    # Claims deleted: the node may go.
    for name in ("share-0", "share-1", "share-2", "pair"):
        kube.delete_claim(cluster.namespace, name)
    settle(controller)

    def unprotected() -> bool:
        controller.node_autoscaling.pass_once()
        meta = kube.get_node(node)["metadata"]
        return not set(meta.get("annotations") or {}) & {*node_protection.PROTECTING,
                                                          node_protection.ANNOTATION_PROTECTS}

    _wait_for(unprotected, f"node {node} loses the scale-down protection once no claim holds its cards")


def test_an_admin_s_protection_stays_and_a_claim_that_never_fits_asks_nothing(
        cluster: Cluster, kube: KubeApi, nodes: Callable[[str, dict[str, str]], None]) -> None:
    prefix = cluster.prefix
    model = f"T{prefix}"
    node = f"{prefix}-kept"
    nodes(node, {"pool": prefix})
    kube.patch_node(node, {"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}}})
    cluster.klass(o.klass(f"{prefix}-pool", parameters={"gpuModel": model}))
    cluster.gpu(o.gpu(f"gpu-{prefix}-0", node=node, model=model, memory=40960))
    # 60Gi on 40Gi cards: no node of this pool helps (NeverFits), so none is asked.
    cluster.claim(o.claim("huge", cores=50, memory="60Gi", class_name=f"{prefix}-pool"))
    cluster.claim(o.claim("small", cores=50, memory="10Gi", class_name=f"{prefix}-pool"))
    controller = _controller(kube, cluster.namespace)
    settle(controller)
    assert cluster.get_claim("huge")["status"]["reason"] == "NeverFits"
    controller.node_autoscaling.pass_once()
    assert _placeholders(kube, cluster.namespace) == {}
    annotations = kube.get_node(node)["metadata"]["annotations"]
    assert annotations[node_protection.ANNOTATION_PROTECTS] == "cluster-autoscaler.kubernetes.io/scale-down-disabled"
    kube.delete_claim(cluster.namespace, "small")
    settle(controller)

    def only_the_admin_s_left() -> bool:
        controller.node_autoscaling.pass_once()
        left = kube.get_node(node)["metadata"].get("annotations") or {}
        return set(left) & {*node_protection.PROTECTING, node_protection.ANNOTATION_PROTECTS} == {
            "karpenter.sh/do-not-disrupt"}

    _wait_for(only_the_admin_s_left, "the controller removes only the annotation it added")


def test_a_placeholder_keeps_off_the_nodes_whose_cards_are_known_by_a_label_karpenter_reads(
        cluster: Cluster, kube: KubeApi, nodes: Callable[[str, dict[str, str]], None]) -> None:
    """Found by Karpenter (tests/realcluster/test_karpenter.py, ten claims): Karpenter ignores a pod
    whose node affinity uses matchFields or kubernetes.io/hostname, so a placeholder kept off a full
    node by `metadata.name` asked for nothing. The nodes to avoid carry our label, and the pod says
    NotIn on it. A node whose agent has not published its cards yet (the one Karpenter just added)
    is not avoided: avoiding it asked for another node."""
    prefix = cluster.prefix
    model = f"T{prefix}"
    full, coming = f"{prefix}-full", f"{prefix}-coming"
    nodes(full, {"pool": prefix})
    nodes(coming, {"pool": prefix})
    cluster.gpu(o.gpu(f"gpu-{prefix}-0", node=full, model=model))
    cluster.klass(o.klass(f"{prefix}-whole", provisioner="elasticgpu.io/physical",
                          parameters={"gpuModel": model, "nodeSelector": f"pool={prefix}"}))
    cluster.claim(o.claim("holder", cards=1, cores=None, memory=None, class_name=f"{prefix}-whole"))
    cluster.claim(o.claim("waiter", cards=1, cores=None, memory=None, class_name=f"{prefix}-whole"))
    controller = _controller(kube, cluster.namespace)
    settle(controller)
    assert cluster.get_claim("holder")["status"]["phase"] == "Bound"
    assert cluster.get_claim("waiter")["status"]["reason"] == "NoCapacity"
    controller.node_autoscaling.pass_once()
    [placeholder] = _placeholders(kube, cluster.namespace).values()
    [term] = placeholder["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert term == {"matchExpressions": [{"key": node_requests.LABEL_NODE_ID, "operator": "NotIn", "values": [full]}]}
    assert kube.get_node(full)["metadata"]["labels"][node_requests.LABEL_NODE_ID] == full
    assert node_requests.LABEL_NODE_ID not in kube.get_node(coming)["metadata"]["labels"]
