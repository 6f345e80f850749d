"""Translation at admission (issue 45): `elasticgpu webhook --translate`, called by the API server over real
HTTPS, turns a pod's `nvidia.com/gpu` (and HAMi's names) into its inline claims in namespaces that opted in;
the controller then binds them like any claim, under the namespace's ElasticGPUQuota."""

from __future__ import annotations

import json
import re
import tempfile
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from elasticgpu.api import names, pod_claims
from elasticgpu.controller.decisions import cards_assigned, pod_gate
from elasticgpu.controller.pods import cards_event
from elasticgpu.controller.process.reconciling import Controller
from elasticgpu.controller.settings import ControllerSettings, QuotaSettings
from tests.binding import objects as o
from tests.kube_cluster import TestCluster
from tests.pods.claim_world import World, kube, settle, wait_for, world
from tests.pods.conftest import WebhookProcess, free_port, fresh_namespace, remove_configuration, start_webhook

__all__ = ["kube", "world"]  # fixtures

TRANSLATE_DENIED = 'admission webhook "translate.pods.elasticgpu.io" denied the request'
CLAIMS_DENIED = 'admission webhook "pods.elasticgpu.io" denied the request'
"""A pod with claim annotations meets the claims webhook first, which translates by the same rules."""
INLINE = names.ANNOTATION_INLINE_REQUEST_PREFIX


@pytest.fixture(scope="module")
def translating(
    kube_cluster: TestCluster, api_client: client.ApiClient, pod_update_policies: list[str]
) -> Iterator[tuple[WebhookProcess, int]]:
    """One `elasticgpu webhook --translate` for the module (cluster facts read afresh: each test makes its class),
    with its /metrics served on a port of its own."""
    if kube_cluster.external:
        pytest.skip("the API server must reach a webhook on 127.0.0.1: local test server only")
    metrics = free_port()
    with fresh_namespace(api_client, "translate") as home, tempfile.TemporaryDirectory() as logs:
        process = start_webhook(kube_cluster, api_client, namespace=home, log_dir=Path(logs), extra_args=(
            "--translate", "--translation-cache-s", "0",
            "--translation-namespace-cache-s", "0", "--metrics-bind-address", f"127.0.0.1:{metrics}"))
        try:
            yield process, metrics
        finally:
            process.stop()
            remove_configuration(api_client, process.configuration_name)


def _opt_in(world: World, class_name: str) -> None:
    world.core.patch_namespace(world.namespace, {"metadata": {
        "labels": {names.LABEL_TRANSLATE_RESOURCES: "true"},
        "annotations": {names.ANNOTATION_TRANSLATE_CLASS: class_name}}})


def _gpus(world: World, cards: int = 2) -> str:
    """A node with `cards` cards of a model of this test, and a class of that model; the class's name."""
    node = world.node(f"{world.prefix}-a")
    model = f"T{world.prefix}"
    for index in range(cards):
        world.gpu(o.gpu(f"gpu-{world.prefix}-{index}", node=node, model=model, index=index, memory=16384))
    class_name = f"{world.prefix}-translated"
    world.klass(o.klass(class_name, parameters={"gpuModel": model}))
    return class_name


def _pod(name: str, *containers: dict[str, Any], init: tuple[dict[str, Any], ...] = (),
         annotations: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers), "terminationGracePeriodSeconds": 0}
    if init:
        spec["initContainers"] = list(init)
    metadata: dict[str, Any] = {"name": name}
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _asks(name: str, limits: dict[str, str], **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "busybox:1.36", "resources": {"limits": limits}, **extra}


def _create(world: World, body: dict[str, Any]) -> dict[str, Any]:
    return dict(world.core.api_client.sanitize_for_serialization(world.core.create_namespaced_pod(world.namespace,
                                                                                                  body)))


def _refusal(world: World, body: dict[str, Any]) -> str:
    with pytest.raises(ApiException) as caught:
        world.core.create_namespaced_pod(world.namespace, body)
    assert caught.value.status == 422, caught.value.body
    message = str(json.loads(caught.value.body)["message"])
    assert message.startswith((TRANSLATE_DENIED, CLAIMS_DENIED)), message
    return message


def _wait_translating(world: World) -> None:
    """Until the API server's namespace informer has the label: a dry-run create of a pod asking a card comes
    back translated (dry run calls webhooks without side effects; nothing is stored)."""
    probe = _pod("probe", _asks("m", {"nvidia.com/gpu": "1"}))

    def translated() -> bool:
        try:
            answer = world.core.create_namespaced_pod(world.namespace, probe, dry_run="All")
        except ApiException:
            return False
        return bool((answer.metadata.annotations or {}).get(names.ANNOTATION_TRANSLATED))

    wait_for(translated, "the namespace's label to reach the API server")


def _reviews(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return sum(float(value) for value in re.findall(r"^elasticgpu_webhook_reviews_total\{[^}]*\} (\S+)$", text, re.M))


def test_a_device_plugin_pod_becomes_its_inline_claims(
    translating: tuple[WebhookProcess, int], world: World
) -> None:
    class_name = _gpus(world)
    _opt_in(world, class_name)
    _wait_translating(world)
    sidecar = _asks("proxy", {"nvidia.com/gpu.shared": "1"}, restartPolicy="Always")
    body = _pod("vllm", _asks("main", {"nvidia.com/gpu": "1", "cpu": "1"}), _asks("web", {"cpu": "1"}),
                init=(_asks("warm", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000",
                                     "nvidia.com/gpucores": "30"}), sidecar))
    pod = _create(world, body)
    annotations = pod["metadata"]["annotations"]
    assert annotations[f"{INLINE}main"] == f"gpu=1,class={class_name}"
    assert annotations[f"{INLINE}warm"] == f"gpu-core=30,gpu-memory=3000,class={class_name}"
    assert annotations[f"{INLINE}proxy"] == f"gpu-core=25,class={class_name}"
    assert f"{INLINE}web" not in annotations
    record = json.loads(annotations[names.ANNOTATION_TRANSLATED])
    assert record["main"]["removed"] == {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}} or \
        record["main"]["removed"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert set(record) == {"main", "warm", "proxy"}
    main = pod["spec"]["containers"][0]["resources"]
    assert "nvidia.com/gpu" not in (main.get("limits") or {}) and main["limits"]["cpu"] == "1"
    assert not any("nvidia.com" in key for c in pod["spec"]["initContainers"]
                   for key in (c["resources"].get("limits") or {}))
    assert pod_gate.is_gated(pod) and pod["metadata"]["labels"] == {names.LABEL_USES_CLAIMS: "true"}

    # A pod whose author wrote the annotation: bound the same way, but no Event (its cost stays one write).
    _create(world, _pod("annotated", _asks("main", {"cpu": "1"}),
                        annotations={f"{INLINE}main": f"gpu-core=10,gpu-memory=1000,class={class_name}"}))

    # The controller binds them as any inline claims: all three on the node of the class.
    controller = Controller(world.kube, ControllerSettings(), namespace=world.namespace)
    settle(controller)
    claims = {c: world.get_claim(f"vllm-{c}") for c in ("main", "warm", "proxy")}
    assert {c: claim["status"].get("phase") for c, claim in claims.items()} == dict.fromkeys(claims, "Bound")
    lifted = world.get_pod("vllm")
    assert not pod_gate.is_gated(lifted) and not pod_gate.is_gated(world.get_pod("annotated"))

    # Its own events say where its cards are: one CardsAssigned naming, per container, claim, card uuid(s), size
    # and node.
    told = wait_for(lambda: world.events(cards_assigned.REASON_CARDS_ASSIGNED, name="vllm"), "the pod's Event")
    node = pod_gate.pinned_node(lifted)
    message = told[0]["message"]
    assert told[0]["type"] == "Normal" and f"on node {node}:" in message, message
    sizes = {"main": "1 card", "warm": "30% cores", "proxy": "25% cores"}
    for container, claim in claims.items():
        egpu = world.kube.get_elastic_gpu(claim["spec"]["elasticGPUName"])["spec"]
        cards = (egpu.get("physicalGPU") or {}).get("gpuNames") or [egpu["gpuShare"]["gpuName"]]
        uuids = ", ".join(card.upper() for card in cards)  # o.gpu's uuid: its name in upper case
        said = f"container {container}: claim vllm-{container}, {sizes[container]}"
        assert said in message and f" on {uuids}" in message.split(said, 1)[1].split(";")[0], (said, message)

    # Once: a controller that restarts (or the other one) posting it again, as a crash between the Event and
    # the gate lift makes it, finds the name taken.
    again = Controller(world.kube, ControllerSettings(), namespace=world.namespace)
    settle(again)
    gated = {**lifted, "apiVersion": "v1", "kind": "Pod"}
    cards_event.post(again.events, again.picture, gated, pod_claims.read_pod_claims(lifted), str(node))
    wait_for(lambda: again.events.idle() and controller.events.idle(), "the Events to be written")
    assert len(world.events(cards_assigned.REASON_CARDS_ASSIGNED, name="vllm")) == 1
    assert not world.events(cards_assigned.REASON_CARDS_ASSIGNED, name="annotated")


def test_a_namespace_without_the_label_is_untouched_and_a_pod_without_gpus_costs_nothing(
    translating: tuple[WebhookProcess, int], world: World
) -> None:
    class_name = _gpus(world)
    world.core.patch_namespace(world.namespace, {"metadata": {
        "annotations": {names.ANNOTATION_TRANSLATE_CLASS: class_name}}})
    before = _reviews(translating[1])
    pod = _create(world, _pod("plugin", _asks("main", {"nvidia.com/gpu": "1"})))
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert not pod["metadata"].get("annotations") and not pod["spec"].get("schedulingGates")
    _opt_in(world, class_name)
    _wait_translating(world)
    counted = _reviews(translating[1])
    for index in range(3):
        plain = _create(world, _pod(f"plain-{index}", _asks("main", {"cpu": "1"})))
        assert not plain["metadata"].get("annotations")
    assert _reviews(translating[1]) == counted  # never sent to the webhook (matchConditions)
    assert counted > before


@pytest.mark.parametrize(("containers", "annotations", "words"), [
    ([_asks("main", {"nvidia.com/gpumem": "3000"})], None,
     "spec.containers[main].resources.limits[nvidia.com/gpumem]: a fraction of a card needs the card itself"),
    ([_asks("main", {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "150"})], None,
     "limits[nvidia.com/gpucores]: is percent of one card's compute: 1 to 100"),
    ([_asks("main", {"nvidia.com/gpu": "3"})], None, "holds 3 cards (the most on one node: 2)"),
    ([_asks("main", {"nvidia.com/gpu": "1"})], {f"{INLINE}main": "gpu-core=30"},
     "asks 30% cores, memory in proportion; keep one of the two"),
])
def test_what_cannot_be_translated_is_refused_with_the_field_and_the_fix(
    translating: tuple[WebhookProcess, int], world: World, containers: list[dict[str, Any]],
    annotations: dict[str, str] | None, words: str,
) -> None:
    _opt_in(world, _gpus(world))
    _wait_translating(world)
    message = _refusal(world, _pod("bad", *containers, annotations=annotations))
    assert words in message, message


def test_a_class_that_does_not_exist_is_refused(translating: tuple[WebhookProcess, int], world: World) -> None:
    _opt_in(world, f"{world.prefix}-missing")
    message = wait_for(lambda: _try_refusal(world), "the namespace's label to reach the API server")
    assert f"ElasticGPUClass {world.prefix}-missing does not exist" in message
    assert names.ANNOTATION_TRANSLATE_CLASS in message


def _try_refusal(world: World) -> str | None:
    try:
        world.core.create_namespaced_pod(world.namespace, _pod(f"p-{uuid.uuid4().hex[:6]}",
                                                               _asks("m", {"nvidia.com/gpu": "1"})))
    except ApiException as error:
        return str(json.loads(error.body)["message"])
    return None


def test_a_namespace_cannot_get_more_cards_than_its_quota(
    translating: tuple[WebhookProcess, int], world: World
) -> None:
    """Translated pods are charged to the namespace's ElasticGPUQuota like every claim: with a quota of one card,
    of two translated pods asking a card each, one is bound and the other waits (QuotaExceeded), never both."""
    class_name = _gpus(world, cards=2)
    custom = client.CustomObjectsApi(world.core.api_client)
    custom.create_namespaced_custom_object(names.GROUP, names.VERSION, world.namespace, names.PLURAL_QUOTA, {
        "apiVersion": names.API_VERSION, "kind": names.KIND_QUOTA, "metadata": {"name": "q"},
        "spec": {"hard": {names.RESOURCE_NVIDIA_GPU: 1}}})
    _opt_in(world, class_name)
    _wait_translating(world)
    for name in ("first", "second"):
        _create(world, _pod(name, _asks("m", {"nvidia.com/gpu": "1"})))
    settle(Controller(world.kube, ControllerSettings(quota=QuotaSettings(recheck_s=1.0, refresh_s=0.0)),
                      namespace=world.namespace))
    translated = [p for p in world.core.list_namespaced_pod(world.namespace).items
                  if (p.metadata.annotations or {}).get(names.ANNOTATION_TRANSLATED)]
    assert len(translated) == 2
    gated = [p.metadata.name for p in translated if pod_gate.is_gated(world.get_pod(p.metadata.name))]
    assert len(gated) == 1, gated
    # Its claim says why (an Immediate class: the claim waits, and the pod for it).
    assert world.events("QuotaExceeded", name=f"{gated[0]}-m"), world.claims_ready(gated[0])
    bound = [c for c in world.kube.list_claims(world.namespace) if (c.get("status") or {}).get("phase") == "Bound"]
    assert len(bound) == 1
