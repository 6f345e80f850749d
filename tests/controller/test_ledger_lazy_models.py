"""The GPU ledger keeps a record and the JSON of each GPU and builds its model when read, with a
bounded cache of the models built last (`picture.gpu_records`, issue 49 item 2). Whatever it
keeps, its answers are the old ones: the model, the allocations, the body, the inventory's card
and reservations, and what the model's validation refused is refused.

The old path is written out here (`_old_model`: `compact.kept`'s validation of the packed JSON,
what the ledger kept per GPU until now) and compared with what the ledger answers after its
cache has let the model go (a cache of one model, two GPUs: every read builds it again)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from elasticgpu.allocator import CardRecord, Health
from elasticgpu.api import GPU, names
from elasticgpu.controller.picture import compact, gpu_records
from elasticgpu.controller.picture.reservations import Ledger

pytestmark = pytest.mark.timeout(300)

STAMP = "2026-12-07T00:00:00Z"

claim_refs = st.one_of(st.none(), st.fixed_dictionaries(
    {"kind": st.just(names.KIND_CLAIM), "namespace": st.sampled_from(["ns", "team-a"]),
     "name": st.sampled_from(["c0", "c1", "claim-x"])},
    optional={"uid": st.sampled_from(["uid-0", "uid-1"])}))

partitions = st.one_of(st.none(), st.fixed_dictionaries(
    {"profile": st.sampled_from(["1g.10gb", "3g.40gb"]), "start": st.integers(0, 7)}))


@st.composite
def allocations(draw: st.DrawFn) -> list[dict[str, Any]]:
    keys = draw(st.lists(st.sampled_from([f"egpu-{i}" for i in range(6)]), unique=True, max_size=4))
    out = []
    for key in keys:
        allocation: dict[str, Any] = {"elasticGPU": key, "cores": draw(st.integers(0, 25)),
                                      "memory": draw(st.integers(0, 10240))}
        if draw(st.booleans()):
            allocation["exclusive"] = draw(st.booleans())
        if draw(st.booleans()):
            allocation["reservedAt"] = STAMP
        if (ref := draw(claim_refs)) is not None:
            allocation["claimRef"] = ref
        if (partition := draw(partitions)) is not None:
            allocation["partition"] = partition
        if draw(st.booleans()):
            allocation["limit"] = {"cores": draw(st.integers(0, 25)), "memory": draw(st.integers(0, 1024))}
        if draw(st.booleans()):
            allocation["group"] = {"token": "t1", "anchor": "a", "anchorGPU": "gpu-a",
                                   "state": draw(st.sampled_from(["Committing", "Complete", "Aborted"]))}
        out.append(allocation)
    return out


@st.composite
def gpu_bodies(draw: st.DrawFn, name: str, version: int) -> dict[str, Any]:
    spec: dict[str, Any] = {"index": draw(st.integers(0, 7)), "uuid": name.upper(), "memory": 81920,
                            "nodeName": draw(st.sampled_from(["node-a", "node-b"]))}
    if draw(st.booleans()):
        spec["model"] = draw(st.sampled_from(["NVIDIA A100-SXM4-80GB", "A100", "H100"]))
    for field, values in (("mig", st.booleans()), ("owner", st.sampled_from(["ElasticGPU", "DRA"])),
                          ("numa", st.integers(0, 1)), ("links", st.lists(st.sampled_from(["GPU-X", "GPU-Y"]))),
                          ("pcieRoot", st.just("0000:00:01.0")), ("nics", st.lists(st.just("mlx5_0")))):
        if draw(st.booleans()):
            spec[field] = draw(values)
    status: dict[str, Any] = {"allocations": draw(allocations())}
    for field, values in (
            ("health", st.sampled_from(["Healthy", "Unhealthy", "Unknown"])),
            ("owner", st.sampled_from(["ElasticGPU", "DRA"])),
            ("isolation", st.lists(st.sampled_from(["MPS", "HAMiCore"]), unique=True)),
            ("capacity", st.just({names.RESOURCE_CORE: 100, names.RESOURCE_MEMORY: 81920})),
            ("conditions", st.just([{"type": "Ready", "status": "True", "reason": "Healthy", "message": "",
                                     "lastTransitionTime": STAMP}])),
            ("usage", st.just({"memoryUsed": 10, "coresUsed": 5, "updateTime": STAMP})),
            ("runningClaims", st.just([{"namespace": "ns", "name": "c0", "pods": ["ns/p"]}]))):
        if draw(st.booleans()):
            status[field] = draw(values)
    return {"apiVersion": names.API_VERSION, "kind": names.KIND_GPU,
            "metadata": {"name": name, "resourceVersion": str(version), "uid": f"uid-{name}",
                         "managedFields": [{"manager": "elasticgpu-agent", "operation": "Update"}]},
            "spec": spec, "status": status}


def _old_model(body: dict[str, Any]) -> GPU:
    """The model the old ledger kept of `body` (`compact.kept`)."""
    return compact.kept(body, GPU)[1]


def _health(model: GPU, ready: bool = True) -> Health:
    """The card's health in the inventory as the old ledger set it."""
    return gpu_records.health_of(model) if ready and not model.spec.mig else Health.UNHEALTHY


@settings(max_examples=80, deadline=None)
@given(first=gpu_bodies("gpu-a", 1), second=gpu_bodies("gpu-b", 2), later=gpu_bodies("gpu-a", 3))
def test_a_model_built_on_read_is_the_model_the_old_path_kept(
        first: dict[str, Any], second: dict[str, Any], later: dict[str, Any]) -> None:
    ledger = Ledger()
    ledger._models = gpu_records.Models(cache_size=1)  # every read of the other GPU builds its model again
    for body in (first, second, later):
        try:
            old = _old_model(body)
        except ValidationError:
            with pytest.raises(ValidationError):
                ledger.observe_gpu(body)
            continue
        ledger.observe_gpu(body)
        name = body["metadata"]["name"]
        other = "gpu-b" if name == "gpu-a" else "gpu-a"
        if ledger.gpu_body(other) is not None:
            ledger.gpu(other)  # evicts `name`'s model: the reads below build it from its JSON
        assert ledger.gpu(name) == old
        held = ledger.gpu_and_body(name)
        assert held is not None and held == (old, compact.strip(body))
        for allocation in old.status.allocations:
            assert ledger.allocation(name, allocation.elastic_gpu) == allocation
            assert name in ledger.gpus_holding(allocation.elastic_gpu)
        assert ledger.allocation(name, "not-held") is None
        assert name in ledger.gpus_on_node(old.spec.node_name)
        # The card as the old ledger added it, Unhealthy in MIG mode (`set_health`).
        assert ledger.inventory.card(old.spec.uuid).record == replace(CardRecord.from_gpu(old), health=_health(old))
        assert (name in ledger.mig_gpu_names()) == old.spec.mig
        # What a GPU event's waking reads of the copy held before it (`picture.waking`), from the record.
        record = ledger.gpu_record(name)
        assert record is not None
        assert record.sizes() == {a.elastic_gpu: (a.cores, a.memory, a.limit) for a in old.status.allocations}
        assert record.card.isolation == frozenset(old.status.isolation)
        assert record.said_unhealthy == (old.status.health == "Unhealthy")
        assert sum(c + m for _k, c, m, _w in record.all_shares()) == sum(
            a.cores + a.memory for a in old.status.allocations)
        assert (name in ledger.owner_moving_gpu_names()) == (old.spec.owner != (old.status.owner or "ElasticGPU"))
    assert len(ledger._models) <= 1


def test_a_body_the_model_refuses_is_refused_and_not_kept() -> None:
    ledger = Ledger()
    good = {"apiVersion": names.API_VERSION, "kind": names.KIND_GPU,
            "metadata": {"name": "gpu-a", "resourceVersion": "1"},
            "spec": {"index": 0, "uuid": "GPU-A", "memory": 81920, "nodeName": "node-a"},
            "status": {"allocations": [{"elasticGPU": "e", "cores": 25, "memory": 1024}]}}
    refused = [
        {**good, "spec": {**good["spec"], "memory": 0}},
        {**good, "spec": {**good["spec"], "uuid": ""}},
        {**good, "status": {"allocations": [{"elasticGPU": "e", "cores": 101, "memory": 1}]}},
        {**good, "status": {"allocations": [{"elasticGPU": "", "cores": 1, "memory": 1}]}},
        {**good, "status": {"health": "Sick"}},
        {**good, "status": {"usage": {"memoryUsed": -1}}},
        {**good, "status": {"runningClaims": [{"namespace": "", "name": "c"}]}},
    ]
    for body in refused:
        with pytest.raises(ValidationError):
            ledger.observe_gpu(body)
    assert ledger.gpu_names() == [] and len(ledger.inventory.reservations) == 0
    ledger.observe_gpu(good)
    assert ledger.gpu("gpu-a") == _old_model(good)


def test_the_cache_of_built_models_is_bounded_and_the_records_answer_without_it() -> None:
    ledger = Ledger()
    ledger._models = gpu_records.Models(cache_size=4)
    for i in range(40):
        ledger.observe_gpu({"apiVersion": names.API_VERSION, "kind": names.KIND_GPU,
                            "metadata": {"name": f"gpu-{i}", "resourceVersion": str(i + 1)},
                            "spec": {"index": i % 8, "uuid": f"GPU-{i}", "memory": 81920, "nodeName": f"n{i // 8}",
                                     "mig": i == 3},
                            "status": {"allocations": [{"elasticGPU": f"e{i}", "cores": 25, "memory": 1024}]}})
    assert len(ledger._models) == 4
    assert ledger.gpus_on_node("n1") == sorted(f"gpu-{i}" for i in range(8, 16))
    assert ledger.mig_gpu_names() == ["gpu-3"]
    held = ledger.held("e0")
    assert held is not None and held.node == "n0" and held.cards[0].uuid == "GPU-0"
    assert len(ledger._models) == 4  # none of those built a model
    assert ledger.gpu("gpu-0") is ledger.gpu("gpu-0")  # built once, then cached


def test_a_cached_model_answers_only_for_the_record_it_was_built_from() -> None:
    """A reader that built a model of an older copy while a newer one was taken in (no picture lock
    held) leaves it in the cache: the newer record's read must not get it."""
    body = {"apiVersion": names.API_VERSION, "kind": names.KIND_GPU,
            "metadata": {"name": "gpu-a", "resourceVersion": "1"},
            "spec": {"index": 0, "uuid": "GPU-A", "memory": 81920, "nodeName": "node-a"},
            "status": {"allocations": [{"elasticGPU": "e", "cores": 25, "memory": 1024}]}}
    newer = {**body, "metadata": {"name": "gpu-a", "resourceVersion": "2"}, "status": {"allocations": []}}
    models = gpu_records.Models(cache_size=4)
    old_record, old_model = gpu_records.take_in(body)
    new_record, new_model = gpu_records.take_in(newer)
    models.put("gpu-a", new_record, new_model)
    assert models.get("gpu-a", old_record) == old_model  # the late reader's build lands in the cache
    assert models.get("gpu-a", new_record) == new_model
    assert models.get("gpu-a", new_record).status.allocations == []
