"""The picture keeps a Bound claim or ElasticGPU as JSON and builds its model when read
(`controller.records`): readers see the same models as before, read-only, in resourceVersion
order, and an object at rest takes a fraction of a model's memory. Fed with watch events only."""

from __future__ import annotations

import gc
import threading
import tracemalloc
from typing import Any

import pytest

from elasticgpu.api import ElasticGPU, ElasticGPUClaim, names
from elasticgpu.controller.picture import compact, records
from elasticgpu.controller.picture.picture import Picture
from tests.binding import objects as o


def _bound_claim(index: int, version: int = 1) -> dict[str, Any]:
    body = o.claim(f"c{index}", egpu=f"egpu-{index}", uid=f"uid-{index}")
    body["metadata"].update(resourceVersion=str(version), finalizers=[names.FINALIZER_CLAIM_PROTECTION],
                            managedFields=[{"manager": "kubectl", "operation": "Update"}])
    body["status"] = {"phase": "Bound", "capacity": {names.RESOURCE_CORE: 30}, "gpus": ["GPU-A"],
                      "conditions": [{"type": "Bound", "status": "True", "reason": "Bound", "message": "bound"}]}
    return body


def _bound_egpu(index: int, version: int = 1) -> dict[str, Any]:
    body = o.share_egpu(f"egpu-{index}", "gpu-a", cores=30, memory="10Gi",
                        claim_ref={"namespace": "ns", "name": f"c{index}", "uid": f"uid-{index}"})
    body["metadata"]["resourceVersion"] = str(version)
    body["status"] = {"phase": "Bound", "nodeName": "node-1", "gpus": ["GPU-A"]}
    return body


def _small_picture(cache_size: int) -> Picture:
    picture = Picture()
    for store in (picture._claims, picture._egpus):
        store._cache_size = cache_size
    return picture


def test_a_bound_claim_read_back_from_json_is_the_model_it_was() -> None:
    picture = _small_picture(cache_size=1)
    body = _bound_claim(0)
    picture.observe("claim", "ADDED", body)
    picture.observe("claim", "ADDED", _bound_claim(1))  # evicts claim 0's model from the cache
    assert picture._claims.resting() == 2 and ("ns", "c0") not in picture._claims._cache

    model = picture.claim("ns", "c0")
    assert model == ElasticGPUClaim.model_validate(body)
    assert model is not None and model.spec.elastic_gpu_name == "egpu-0" and model.status.phase == "Bound"
    assert picture.claim_body("ns", "c0") == compact.identity(body)
    assert "managedFields" not in (picture.claim_body("ns", "c0") or {})["metadata"]
    with pytest.raises(TypeError, match="read-only"):
        model.status.phase = "Lost"  # a model built again is as read-only as the first
    assert model.model_copy(update={"kind": "x"}).kind == "x"


def test_a_bound_elastic_gpu_is_read_through_every_reader() -> None:
    picture = _small_picture(cache_size=1)
    for index in range(3):
        picture.observe("egpu", "ADDED", _bound_egpu(index))
    assert picture._egpus.resting() == 3
    expected = ElasticGPU.model_validate(_bound_egpu(0))
    assert picture.egpu("egpu-0") == expected
    assert picture.elastic_gpus().get("egpu-0") == expected and "egpu-0" in picture.elastic_gpus()
    assert picture.view().elastic_gpus["egpu-0"] == expected
    assert picture.view().by_claim_uid["uid-0"] == "egpu-0"
    assert sorted(picture.elastic_gpus()) == ["egpu-0", "egpu-1", "egpu-2"]
    assert picture.elastic_gpus().get("egpu-9") is None and "egpu-9" not in picture.elastic_gpus()


def test_resource_version_order_holds_for_objects_at_rest() -> None:
    picture = _small_picture(cache_size=1)
    picture.observe("claim", "ADDED", _bound_claim(0, version=5))
    picture.observe("claim", "ADDED", _bound_claim(1))  # claim 0 is JSON only now
    older = _bound_claim(0, version=4)
    older["metadata"]["labels"] = {"old": "yes"}
    assert picture.put_claim(older).metadata.labels == {"old": "yes"}  # the answer's own model...
    assert (picture.claim("ns", "c0") or ElasticGPUClaim.model_validate(older)).metadata.labels == {}  # ...not kept
    same = picture.put_claim(_bound_claim(0, version=5))
    assert same is picture.claim("ns", "c0")  # the kept one, from the cache now
    picture.observe("claim", "DELETED", _bound_claim(0, version=6))
    assert picture.claim("ns", "c0") is None
    picture.observe("claim", "MODIFIED", _bound_claim(0, version=5))  # a copy from before the deletion
    assert picture.claim("ns", "c0") is None


def test_a_claim_moves_between_model_and_json_with_its_phase() -> None:
    picture = _small_picture(cache_size=1)
    pending = _bound_claim(0, version=1)
    pending["status"] = {"phase": "Pending"}
    picture.observe("claim", "ADDED", pending)
    assert picture._claims.resting() == 0 and picture.pending_claim_keys() == [("claim", "ns", "c0")]
    picture.observe("claim", "MODIFIED", _bound_claim(0, version=2))
    assert picture._claims.resting() == 1 and picture.pending_claim_keys() == []
    deleting = _bound_claim(0, version=3)
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    picture.observe("claim", "MODIFIED", deleting)  # a claim being released is in motion
    assert picture._claims.resting() == 0
    assert (picture.claim("ns", "c0") or pytest.fail("gone")).metadata.deletion_timestamp == "2026-01-01T00:00:00Z"
    # the index of claims by the ElasticGPU they name followed every step
    assert picture._claims_naming == {"egpu-0": ("ns", "c0")}
    picture.observe("claim", "DELETED", _bound_claim(0, version=4))
    assert picture._claims_naming == {}


def test_a_resync_syncs_each_elastic_gpu_next_to_the_claims_naming_it() -> None:
    """Both syncs of a Bound pair read both models: side by side, the second finds them cached."""
    picture = _small_picture(cache_size=4)
    for index in range(3):
        picture.observe("claim", "ADDED", _bound_claim(index))
    picture.observe("claim", "ADDED", o.claim("lone", uid="uid-lone"))
    for index in reversed(range(3)):
        picture.observe("egpu", "ADDED", _bound_egpu(index))
    assert [k for k in picture.all_keys() if k[0] != "pod"] == [
        ("egpu", "egpu-2"), ("claim", "ns", "c2"), ("egpu", "egpu-1"), ("claim", "ns", "c1"),
        ("egpu", "egpu-0"), ("claim", "ns", "c0"), ("claim", "ns", "lone")]


def test_an_object_at_rest_takes_a_fraction_of_its_model() -> None:
    """2,000 Bound claims: JSON plus a small cache against the models the picture kept before
    (a claim's model was ~2.4 KB, its JSON here ~0.6 KB)."""
    bodies = [_bound_claim(index) for index in range(2000)]
    for body in bodies:
        del body["metadata"]["managedFields"]
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        store: records.Models[tuple[str, str], ElasticGPUClaim] = records.Models(
            ElasticGPUClaim, at_rest=lambda m: m.status.phase == "Bound", lock=threading.RLock(), cache_size=16)
        for index, body in enumerate(bodies):
            store.put(("ns", f"c{index}"), body, compact.share_fields(ElasticGPUClaim.model_validate(body)))
        gc.collect()
        at_rest, _ = tracemalloc.get_traced_memory()
        models = {("ns", f"c{i}"): compact.share_fields(ElasticGPUClaim.model_validate(body))
                  for i, body in enumerate(bodies)}
        gc.collect()
        as_models, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    per_rest = (at_rest - before) / len(bodies)
    per_model = (as_models - at_rest) / len(models)
    assert per_rest < 900, f"an object at rest takes {per_rest:.0f} bytes"
    assert per_rest < per_model / 2, f"at rest {per_rest:.0f} bytes, as a model {per_model:.0f}"
    assert store[("ns", "c1999")] == models[("ns", "c1999")] and store[("ns", "c0")] == models[("ns", "c0")]


def test_an_index_keeps_a_lone_member_bare() -> None:
    index: compact.Index[str, str] = {}
    compact.index_add(index, "e", "a")
    compact.index_add(index, "e", "a")
    assert index == {"e": "a"} and list(compact.index_members(index, "e")) == ["a"]
    compact.index_add(index, "e", "b")
    assert index == {"e": {"a", "b"}} and sorted(compact.index_members(index, "e")) == ["a", "b"]
    compact.index_discard(index, "e", "a")
    assert index == {"e": "b"}
    compact.index_discard(index, "e", "x")
    compact.index_discard(index, "e", "b")
    assert index == {} and list(compact.index_members(index, "e")) == []
