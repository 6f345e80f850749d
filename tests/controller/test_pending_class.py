"""The pending gauges count a claim that names no class under the default class it binds with
(issue 38's alert on claims Pending beside free capacity reads capacity per class: under class ""
such claims were never matched)."""

from __future__ import annotations

from elasticgpu.api import names
from elasticgpu.controller.picture.picture import Picture
from tests.binding import objects as o


def test_a_claim_that_names_no_class_waits_under_the_default_class() -> None:
    picture = Picture()
    default = o.klass("everyday", parameters={})
    default["metadata"]["annotations"] = {names.ANNOTATION_DEFAULT_CLASS: "true"}
    picture.observe("class", "ADDED", {**default, "metadata": {**default["metadata"], "resourceVersion": "1"}})
    picture.observe("claim", "ADDED", {**o.claim("plain", "ns", cores=30, memory=None),
                                       "metadata": {"name": "plain", "namespace": "ns", "uid": "u1",
                                                    "resourceVersion": "2"}})
    picture.observe("claim", "ADDED", {**o.claim("named", "ns", cores=30, memory=None, class_name="other"),
                                       "metadata": {"name": "named", "namespace": "ns", "uid": "u2",
                                                    "resourceVersion": "3"}})
    assert sorted(c for c, _reason, _created in picture.waiting_claims()) == ["everyday", "other"]
