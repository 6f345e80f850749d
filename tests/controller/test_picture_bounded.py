"""Nothing in the picture outlives its object: indexes drop empty entries, the GPU ledger forgets
a card's uuid with the card, tombstones expire by age as well as by a relist. Fed with watch
events only (no server): the picture does no I/O."""

from __future__ import annotations

import time
from typing import Any

from elasticgpu.api import names
from elasticgpu.controller.picture import versions
from elasticgpu.controller.picture.picture import Picture
from tests.binding import objects as o


def _at(body: dict[str, Any], version: int) -> dict[str, Any]:
    body["metadata"]["resourceVersion"] = str(version)
    return body


def test_create_delete_churn_leaves_no_index_entry_behind() -> None:
    picture = Picture()
    version = 1
    for index in range(200):
        gpu = _at(o.gpu(f"gpu-churn-{index}", node=f"node-{index}"), version := version + 1)
        picture.observe("gpu", "ADDED", gpu)
        egpu = _at(o.share_egpu(f"egpu-churn-{index}", gpu["metadata"]["name"], cores=10, memory="1Gi",
                                claim_ref={"namespace": "ns", "name": f"c{index}", "uid": f"uid-{index}"}),
                   version := version + 1)
        picture.observe("egpu", "ADDED", egpu)
        claim = _at(o.claim(f"c{index}", egpu=egpu["metadata"]["name"], uid=f"uid-{index}"), version := version + 1)
        picture.observe("claim", "ADDED", claim)
        pod = _at({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": f"p{index}", "namespace": "ns", "annotations": {names.claim_annotation("main"): f"c{index}"}},
            "status": {"phase": "Running"}}, version := version + 1)
        picture.observe("pod", "ADDED", pod)
        for kind, body in (("pod", pod), ("claim", claim), ("egpu", egpu), ("gpu", gpu)):
            picture.observe(kind, "DELETED", _at(dict(body, metadata=dict(body["metadata"])), version := version + 1))

    assert picture.claim_keys() == [] and not picture.elastic_gpus()
    assert picture._claims_naming == {} and picture._egpus_on == {} and picture._by_claim_uid == {}
    assert picture._pod_claims == {} and picture._claims_of_pod == {} and picture._pod_versions == {}
    assert picture.ledger.gpu_names() == [] and picture.ledger._uuid_to_name == {}
    # tombstones: a relist newer than every deletion forgets them all
    picture.merge_lists(nodes=[], gpus=[], gpus_version=str(version), egpus=[], egpus_version=str(version),
                        classes=[], claims=[], claims_version=str(version), pods=[], pods_version=str(version))
    assert len(picture._deleted_claims) == len(picture._deleted_egpus) == len(picture._gone_pods) == 0
    assert len(picture.ledger._deleted) == 0


def test_tombstones_expire_by_age_without_a_relist() -> None:
    tombstones: versions.Tombstones[str] = versions.Tombstones(max_age_s=0.05)
    tombstones.bury("a", {"metadata": {"resourceVersion": "10"}})
    assert tombstones.holds("a", {"metadata": {"resourceVersion": "9"}})
    time.sleep(0.1)
    tombstones.bury("b", {"metadata": {"resourceVersion": "11"}})  # each burial expires the old ones
    assert not tombstones.holds("a", {"metadata": {"resourceVersion": "9"}})
    assert len(tombstones) == 1
    time.sleep(0.1)
    tombstones.prune("")  # a relist that could not be compared still expires by age
    assert len(tombstones) == 0


def _fill_the_json_string_cache() -> None:
    """Fill pydantic-core's JSON string cache: process-wide, a fixed 16,384 slots, kept across
    parses (the picture validates GPUs from their JSON, and shares their equal short strings
    through it). Full, a new string replaces an entry instead of adding one; filling it takes
    ~16,384 x ln(16,384) distinct strings (every slot hit at least once)."""
    import orjson
    from pydantic import TypeAdapter

    TypeAdapter(list[str]).validate_json(orjson.dumps([f"fill-{i}" for i in range(400_000)]))


def _rehash_the_interned_strings() -> None:
    """Make the interned-strings table (process-wide: the picture interns names, `compact.own`)
    allocate its table anew while the heap is traced: churn rehashes it now and then, and a rehash
    that frees a table allocated before tracing began reads as growth of the table's whole size
    (3.7 MiB after the tests before this one in the same process)."""
    import sys

    held = [sys.intern(f"rehash-{i}") for i in range(400_000)]
    del held


def test_the_heap_stays_flat_under_churn() -> None:
    """Create/delete cycles (a GPU, an ElasticGPU on it, its claim, a pod using the claim), with a
    relist now and then as the resync makes: the second half of the run must not grow the heap."""
    import gc
    import tracemalloc

    picture = Picture()
    version = [1]

    def at(body: dict[str, Any]) -> dict[str, Any]:
        version[0] += 1
        return _at(body, version[0])

    def cycle(index: int) -> None:
        gpu = at(o.gpu(f"gpu-heap-{index}", node=f"node-{index}"))
        egpu = at(o.share_egpu(f"egpu-heap-{index}", gpu["metadata"]["name"], cores=10, memory="1Gi",
                               claim_ref={"namespace": "ns", "name": f"c{index}", "uid": f"uid-{index}"}))
        claim = at(o.claim(f"c{index}", egpu=egpu["metadata"]["name"], uid=f"uid-{index}"))
        pod = at({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": f"p{index}", "namespace": "ns", "annotations": {names.claim_annotation("main"): f"c{index}"}},
            "status": {"phase": "Running"}})
        for kind, body in (("gpu", gpu), ("egpu", egpu), ("claim", claim), ("pod", pod)):
            picture.observe(kind, "ADDED", body)
        for kind, body in (("pod", pod), ("claim", claim), ("egpu", egpu), ("gpu", gpu)):
            picture.observe(kind, "DELETED", at(dict(body, metadata=dict(body["metadata"]))))

    def relist() -> None:
        now = str(version[0])
        picture.merge_lists(nodes=[], gpus=[], gpus_version=now, egpus=[], egpus_version=now, classes=[],
                            claims=[], claims_version=now, pods=[], pods_version=now)

    def run(first: int, count: int) -> None:
        for index in range(first, first + count):
            cycle(index)
            if index % 500 == 499:
                relist()

    run(0, 1000)  # warm-up: caches, interned strings, allocator pools
    gc.collect()
    tracemalloc.start()
    try:
        # Traced: the global tables' entries and tables are then freed as traced.
        _fill_the_json_string_cache()
        _rehash_the_interned_strings()
        run(1000, 2000)
        gc.collect()
        middle, _ = tracemalloc.get_traced_memory()
        run(3000, 2000)
        gc.collect()
        end, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert end - middle < 64 * 1024, f"the heap grew by {(end - middle) / 1024:.0f} KiB over 2,000 cycles"
