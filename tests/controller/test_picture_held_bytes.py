"""What the picture holds after the first list (issue 49 item 2: the controller at 40,000 cards /
50,000 claims within 1 GiB), on the list pages `bench/first_list.py` builds as the server sends
them (managedFields and all) and the controller's own `Informer.relist(start=True)` through
`KubeApi` (only its socket answers the pages): one process, so that tracemalloc sees the picture
and nothing else.

- Bytes held per object by kind (tracemalloc after a collection): a pod was its parsed dict,
  ~18.8 KB (bench/first_list.py --held at 8,000 cards / 10,000 claims: 18,803 B/pod on the old code).
- Nothing the picture keeps is an object of the parsed list: one string kept of a listed body
  kept its whole 1 MiB arena of Python's allocator, and the process held ~3x what the picture
  did (the old code kept every pod's dict and every GPU model's strings from the list).
- The reads answer as before: a pod's and a GPU's body are the listed ones without managedFields.
"""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

import pytest

from elasticgpu.api.claim import ElasticGPUClaim
from elasticgpu.controller.picture import compact
from tests.bench.bench_module import load

pytestmark = pytest.mark.timeout(300)

CARDS, CLAIMS = 400, 1600
"""Every card holding 4 claims, 80% of them pods' inline claims: 1,280 pods."""


def _served() -> tuple[Any, dict[str, list[bytes]], dict[str, int], dict[str, list[dict[str, Any]]]]:
    fl = load("first_list", "first_list.py")
    objects = fl.build(CARDS, CLAIMS, 80)
    served = {fl.PLURALS[k]: fl.pages(v, fl.PLURALS[k]) for k, v in objects.items()}
    return fl, served, {k: len(v) for k, v in objects.items()}, objects


def test_the_picture_holds_a_few_kib_per_object_by_kind() -> None:
    fl, served, counts, objects = _served()
    objects.clear()
    held = fl.held_by_kind(served, counts)
    per_object = {stage: size / sum(counts[k] for k in stage.split("+")) for stage, size in held.items()}
    everything = sum(held.values()) / sum(counts.values())
    print(f"held bytes per object: {per_object}, all kinds {everything:.0f}")
    # The old code at this size: pod 18,766 B, all kinds 10,648 B (gpu+class 14,596, egpu 6,290,
    # claim 7,523: every claim and ElasticGPU here fits the cache of built models, see records.py);
    # now 3,602 B and 6,665 B.
    assert per_object["pod"] < 9000, per_object
    assert everything < 9000, per_object


def test_nothing_the_picture_keeps_is_an_object_of_the_parsed_list() -> None:
    fl, served, counts, objects = _served()
    objects.clear()
    gc.collect()
    tracemalloc.start(1)
    try:
        picture = fl.relist(served, profile=False)[3]
        gc.collect()
        parsed = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(True, "*/elasticgpu/controller/edge/requesting.py")])
        kept = sum(stat.size for stat in parsed.statistics("filename"))
    finally:
        tracemalloc.stop()
    total = sum(counts.values())
    # What stays is orjson's cache of dict keys ("metadata", "finalizers", ...): a few KB in all.
    # The old code kept ~5 KB per object of the list's own dicts and strings.
    assert kept / total < 50, f"{kept} bytes of the parsed list kept, {kept / total:.0f} per object"
    assert len(picture.pods.keys()) == counts["pod"]


def test_the_reads_answer_the_listed_bodies() -> None:
    fl, served, _counts, objects = _served()
    picture = fl.relist(served, profile=False)[3]
    for body in objects["pod"][:50]:
        meta = body["metadata"]
        assert picture.pods.pod(meta["namespace"], meta["name"]) == compact.strip(body)
    assert not picture.pods.gated_keys()  # every gate lifted, every pod bound to its node
    assert picture.pods.pinned_to("fleet-node-00000") == []
    for body in objects["gpu"][:50]:
        name = body["metadata"]["name"]
        assert picture.ledger.gpu_body(name) == compact.strip(body)
        version = body["metadata"]["resourceVersion"]
        assert picture.ledger.gpu_version(name) == {"metadata": {"resourceVersion": version}}
        held = picture.ledger.gpu_and_body(name)
        assert held is not None and held[1] == compact.strip(body)
    for body in objects["claim"][:50]:
        meta = body["metadata"]
        assert picture.claim(meta["namespace"], meta["name"]) == ElasticGPUClaim.model_validate(body)
