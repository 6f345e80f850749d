"""The picture's namespace weights (no server): the wake order divides each namespace's use by its
weight, and a list read before a watch event never rolls a weight back."""

from __future__ import annotations

from elasticgpu.controller.picture.namespace_weights import NamespaceWeights
from elasticgpu.controller.picture.picture import Picture
from tests.fair_share.test_picture_order import _names, _picture, _waiting


def test_the_wake_order_divides_use_by_the_weight() -> None:
    picture, version = _picture("FairShare", {"a": 30, "b": 60}, cards=2)
    _waiting(picture, version, [("a", "a1", "2026-01-01T00:00:01Z"), ("b", "b1", "2026-01-01T00:00:02Z")])
    assert _names(picture) == ["a1", "b1"]
    picture.weights.put("b", 3.0, version=100)  # b: 60 / 3 = 20 < 30
    assert _names(picture) == ["b1", "a1"]
    picture.weights.put("b", None, version=101)  # deleted: weight 1 again
    assert _names(picture) == ["a1", "b1"]


def test_a_list_older_than_the_watch_keeps_the_weight() -> None:
    weights = NamespaceWeights(Picture().lock)
    assert weights.put("b", 3.0, version=10)
    weights.merge({"b": (1.0, 4)}, "5")  # a copy from before the change
    assert weights.weight("b") == 3.0
    weights.merge({}, "5")  # missing from a list read before it changed: proves nothing
    assert weights.weight("b") == 3.0
    weights.merge({}, "20")  # missing from a newer list: gone
    assert weights.weight("b") == 1.0
    assert not weights.put("c", 1.0, version=30)  # weight 1 is no entry
    assert dict(weights.live()) == {}
