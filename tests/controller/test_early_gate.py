"""Which keys the early gate lets through before the picture is whole (`early_gate.EarlyGate`):
only a new standalone claim whose bind reads nothing but the cards; every other key is held, and
`open` queues the held keys again. A real picture fed the objects as the watches would."""

from __future__ import annotations

from typing import Any

import pytest

from elasticgpu.api import names
from elasticgpu.controller.flow.machinery.early_gate import EarlyGate
from elasticgpu.controller.flow.machinery.workqueue import WorkQueue
from elasticgpu.controller.picture.picture import Picture
from tests.binding import objects as o


def _gate(*classes: dict[str, Any], quotas_known: bool = True) -> tuple[EarlyGate, Picture, WorkQueue]:
    picture = Picture()
    for body in classes or (o.klass("c"),):
        picture.observe("class", "ADDED", {**body, "metadata": {**body["metadata"], "resourceVersion": "2"}})
    if quotas_known:
        picture.quotas.merge({("quota-ns", "q"): 3}, "5")
    queue = WorkQueue()
    return EarlyGate(picture=picture, queue=queue), picture, queue


def _claim(picture: Picture, name: str, namespace: str = "ns", *, status: dict[str, Any] | None = None,
           **meta: Any) -> tuple[str, str, str]:
    body = o.claim(name, namespace, class_name="c", cores=10, memory="1Gi")
    body["metadata"].update(resourceVersion="7", **meta)
    if status is not None:
        body["status"] = status
    if name == "with-selector":
        body["spec"]["selector"] = {"matchLabels": {"a": "b"}}
    picture.observe("claim", "ADDED", body)
    return ("claim", namespace, name)


def test_a_new_standalone_claim_passes_and_every_other_key_waits_for_open() -> None:
    gate, picture, queue = _gate()
    new = _claim(picture, "new")
    pending = _claim(picture, "pending", status={"phase": "Pending"})
    waiting = [
        _claim(picture, "bound", status={"phase": "Bound"}),
        _claim(picture, "owned", ownerReferences=[{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u",
                                                   "controller": True}]),
        _claim(picture, "gang", labels={names.LABEL_GROUP: "g"}),
        _claim(picture, "with-selector"),
        _claim(picture, "in-quota", "quota-ns"),
        ("claim", "ns", "unknown"),
        ("egpu", "e-1"),
        ("gpu", "gpu-1"),
        ("pod", "ns", "p"),
    ]
    assert gate.admit([new, *waiting, pending]) == [new, pending]
    assert gate.held() == len(waiting)
    assert gate.open() == len(waiting)
    assert set(queue.take(limit=100, background_limit=100, timeout_s=0.0)) == set(waiting)
    assert gate.admit(waiting) == waiting  # open: everything passes


@pytest.mark.parametrize(("classes", "safe"), [
    ((o.klass("c", mode="WaitForFirstConsumer"),), False),  # reads its pod and node
    (({**o.klass("c"), "priority": 10}, {**o.klass("low"), "priority": 1}), False),  # may preempt: reads ElasticGPUs
    (({**o.klass("c"), "priority": 10, "preemptionPolicy": "Never"}, {**o.klass("low"), "priority": 1}), True),
    (({**o.klass("c"), "priorityClassName": "high"},), False),  # its value is read when needed: maybe
    (({**o.klass("c"), "priority": 1}, {**o.klass("high"), "priority": 5}), True),  # nothing ranks below
])
def test_the_class_decides_whether_a_new_claim_may_bind_early(classes: tuple[dict[str, Any], ...],
                                                            safe: bool) -> None:
    gate, picture, _queue = _gate(*classes)
    key = _claim(picture, "new")
    assert gate.early_safe(key) is safe


def test_quotas_not_listed_hold_every_claim() -> None:
    gate, picture, _queue = _gate(quotas_known=False)
    assert not gate.early_safe(_claim(picture, "new"))
