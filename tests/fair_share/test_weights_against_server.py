"""FairShare weights from the Namespace annotation, against the API server: a full card, namespace
a holds 30 cores, namespace b 60 (more than a, less than 3x a), each has one claim waiting, and
room for one frees. With weight 1 a (less held) gets it; with weight 3 on b, b does (60/3 < 30),
whether the annotation was there at start-up or set while the controller runs (the watch). A bad
value leaves b at weight 1, with one Warning Event on the Namespace, and the controller binds on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from elasticgpu.controller.decisions import bind_order
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.machinery import informer, namespace_weight_feed
from elasticgpu.controller.process.reconciling import Controller
from tests.binding import objects as o
from tests.binding.conftest import Cluster, new_controller, settle
from tests.binding.namespaces import fresh_namespaces

DEADLINE_S = 10.0


@pytest.fixture
def two_namespaces(api_client: client.ApiClient, kube: KubeApi, namespace: str) -> Iterator[tuple[str, str]]:
    """Namespaces a and b (no annotation yet); their claims and ElasticGPUs are removed after."""
    made = (f"{namespace}-a", f"{namespace}-b")
    with fresh_namespaces(api_client, kube, made):
        yield made


def _annotate(api_client: client.ApiClient, namespace: str, weight: str | None) -> None:
    client.CoreV1Api(api_client).patch_namespace(
        namespace, {"metadata": {"annotations": {bind_order.ANNOTATION_FAIR_SHARE_WEIGHT: weight}}})


def _claim(kube: KubeApi, namespace: str, name: str, cores: int, class_name: str) -> None:
    body = o.claim(name, namespace, cores=cores, memory=None, class_name=class_name)
    body["metadata"].pop("uid")
    kube.create_claim(body)


def _phase(kube: KubeApi, namespace: str, name: str) -> str:
    return str((kube.get_claim(namespace, name).get("status") or {}).get("phase"))


def _wait(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {DEADLINE_S:g}s: {what}")
        time.sleep(0.05)


def _full_card(cluster: Cluster, kube: KubeApi, ns_a: str, ns_b: str) -> tuple[Controller, str]:
    """A FairShare class on one card; a holds 10+30 cores, b 60 (the card full); the controller running."""
    model = f"T{cluster.prefix}"
    cluster.gpu(o.gpu(f"gpu-{cluster.prefix}-0", node=f"{cluster.prefix}-node", model=model))
    class_name = f"{cluster.prefix}-class"
    body = o.klass(class_name, parameters={"gpuModel": model})
    body["bindOrder"] = "FairShare"
    cluster.klass(body)
    for namespace, name, cores in ((ns_a, "a1", 10), (ns_a, "a2", 30), (ns_b, "b1", 60)):
        _claim(kube, namespace, name, cores, class_name)
    controller = new_controller(kube, None)
    settle(controller)
    assert all(_phase(kube, ns, n) == "Bound" for ns, n in ((ns_a, "a1"), (ns_a, "a2"), (ns_b, "b1")))
    # Waiting: a3 the older (so age alone would pick it too), then b2; 10 cores each.
    _claim(kube, ns_a, "a3", 10, class_name)
    time.sleep(1.1)  # timestamps have one-second resolution
    _claim(kube, ns_b, "b2", 10, class_name)
    settle(controller)
    assert [_phase(kube, ns_a, "a3"), _phase(kube, ns_b, "b2")] == ["Pending", "Pending"]
    return controller, class_name


def _free_room(controller: Controller, kube: KubeApi, ns_a: str, ns_b: str) -> dict[str, str]:
    """Delete a1 (10 cores: room for one waiting claim; a then holds 30, b 60); the phases of a3 and b2."""
    kube.delete_claim(ns_a, "a1")
    settle(controller)
    return {"a3": _phase(kube, ns_a, "a3"), "b2": _phase(kube, ns_b, "b2")}


@pytest.mark.parametrize(("when", "weight", "winner"), [
    ("none", None, "a3"),        # weight 1: a holds less
    ("at-start", "3", "b2"),     # b: 60 / 3 = 20 < 30
    ("while-running", "3", "b2"),  # the watch delivers the annotation
    ("while-running", "0.5", "a3"),
])
def test_freed_room_goes_by_the_weighted_share(cluster: Cluster, kube: KubeApi, api_client: client.ApiClient,
                                               two_namespaces: tuple[str, str], when: str, weight: str | None,
                                               winner: str) -> None:
    ns_a, ns_b = two_namespaces
    if when == "at-start":
        _annotate(api_client, ns_b, weight)
    controller, _ = _full_card(cluster, kube, ns_a, ns_b)
    try:
        if when == "while-running":
            _annotate(api_client, ns_b, weight)
            _wait(lambda: controller.picture.weights.weight(ns_b) == float(weight or 1),
                  f"the picture takes weight {weight} of {ns_b} from the watch")
        phases = _free_room(controller, kube, ns_a, ns_b)
    finally:
        controller.close()
    loser = "a3" if winner == "b2" else "b2"
    assert phases == {winner: "Bound", loser: "Pending"}, f"weight {weight} on b ({when}): {winner} should win"


def _weight_events(kube: KubeApi, namespace: str) -> list[dict[str, Any]]:
    return [e for e in kube.list_events(kube.settings.events_namespace)
            if (e.get("involvedObject") or {}).get("kind") == "Namespace"
            and (e.get("involvedObject") or {}).get("name") == namespace]


def test_a_bad_weight_is_weight_one_said_once_with_a_warning_event(
        cluster: Cluster, kube: KubeApi, api_client: client.ApiClient, two_namespaces: tuple[str, str],
        caplog: pytest.LogCaptureFixture) -> None:
    ns_a, ns_b = two_namespaces
    _annotate(api_client, ns_b, "-3")
    caplog.set_level("WARNING", logger=informer.__name__)
    controller, _ = _full_card(cluster, kube, ns_a, ns_b)
    try:
        controller.rebuild()  # a relist sees the same bad value: not said again
        _annotate(api_client, ns_a, "2")  # another namespace's change: b's value is not said again
        _wait(lambda: controller.picture.weights.weight(ns_a) == 2.0, "the picture takes a's weight")
        _annotate(api_client, ns_a, None)
        _wait(lambda: controller.picture.weights.weight(ns_a) == 1.0, "the picture drops a's weight")
        _wait(controller.events.idle, "the Event is written")
        events = _weight_events(kube, ns_b)
        assert controller.picture.weights.weight(ns_b) == 1.0
        phases = _free_room(controller, kube, ns_a, ns_b)  # alive, and b counted with weight 1
    finally:
        controller.close()
    assert [(e["type"], e["reason"]) for e in events] == [("Warning", namespace_weight_feed.REASON_INVALID_WEIGHT)]
    message = events[0]["message"]
    assert ns_b in message and bind_order.ANNOTATION_FAIR_SHARE_WEIGHT in message and "0.01 to 100" in message
    said = [r for r in caplog.records if namespace_weight_feed.REASON_INVALID_WEIGHT in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING"
    assert phases == {"a3": "Bound", "b2": "Pending"}
