"""The picture answers a wake with the waiting claims in bind order (fed with watch events only,
no server): FIFO by creationTimestamp whatever order they arrived in, FairShare by the cores each
namespace holds in the class, counted from the GPUs' reservations; and that count stays cheap."""

from __future__ import annotations

import time
from typing import Any

from elasticgpu.controller.picture.picture import Picture
from tests.binding import objects as o

CLASS = "shared"


def _at(body: dict[str, Any], version: int) -> dict[str, Any]:
    body["metadata"]["resourceVersion"] = str(version)
    return body


def _picture(bind_order: str, held: dict[str, int], *, cards: int = 1) -> tuple[Picture, int]:
    """A picture with class `shared` and, per namespace, one ElasticGPU of the class holding
    `held[namespace]` cores on one of `cards` cards (with its claimRef and the GPU's allocation)."""
    picture = Picture()
    version = 1
    klass = o.klass(CLASS)
    klass["bindOrder"] = bind_order
    picture.observe("class", "ADDED", _at(klass, version := version + 1))
    allocations: dict[int, list[dict[str, Any]]] = {}
    for index, (namespace, cores) in enumerate(held.items()):
        egpu = f"egpu-{namespace}-{index}"
        card = index % cards
        ref = {"namespace": namespace, "name": f"held-{index}", "uid": f"uid-held-{index}"}
        allocations.setdefault(card, []).append({"elasticGPU": egpu, "claimRef": ref, "cores": cores, "memory": 1024,
                                                 "exclusive": False, "reservedAt": "2026-01-01T00:00:00Z"})
        picture.observe("egpu", "ADDED", _at(o.share_egpu(egpu, f"gpu-{card}", cores=cores, memory="1Gi",
                                                          class_name=CLASS, claim_ref=ref), version := version + 1))
    for card in range(cards):
        gpu = o.gpu(f"gpu-{card}", node=f"node-{card // 8}", index=card % 8, allocations=allocations.get(card, []))
        picture.observe("gpu", "ADDED", _at(gpu, version := version + 1))
    return picture, version


def _waiting(picture: Picture, version: int, claims: list[tuple[str, str, str]]) -> int:
    """Claims (namespace, name, creationTimestamp) arrive in the order given, Pending."""
    for namespace, name, created in claims:
        body = o.claim(name, namespace, cores=10, memory=None, class_name=CLASS)
        body["metadata"]["creationTimestamp"] = created
        body["status"] = {"phase": "Pending"}
        picture.observe("claim", "ADDED", _at(body, version := version + 1))
    return version


def _names(picture: Picture) -> list[str]:
    return [key[2] for key in picture.pending_claim_keys()]


def test_fifo_wakes_the_oldest_first_whatever_the_arrival_order() -> None:
    picture, version = _picture("FIFO", {})
    _waiting(picture, version, [("a", "a-new", "2026-01-01T00:00:09Z"), ("b", "b-mid", "2026-01-01T00:00:05Z"),
                                ("z", "z-old", "2026-01-01T00:00:01Z"), ("c", "c-mid", "2026-01-01T00:00:05Z")])
    assert _names(picture) == ["z-old", "b-mid", "c-mid", "a-new"]


def test_fair_share_wakes_the_least_served_namespace_first_and_recharges_as_it_goes() -> None:
    picture, version = _picture("FairShare", {"a": 60, "b": 40, "c": 0}, cards=2)
    _waiting(picture, version, [("a", "a1", "2026-01-01T00:00:01Z"), ("b", "b1", "2026-01-01T00:00:02Z"),
                                ("c", "c1", "2026-01-01T00:00:03Z"), ("c", "c2", "2026-01-01T00:00:04Z"),
                                ("d", "d1", "2026-01-01T00:00:05Z")])
    # use: c 0 (but an ElasticGPU of 0 cores), d 0; then each bind charges 10 cores.
    assert _names(picture) == ["c1", "d1", "c2", "b1", "a1"]


def test_fair_share_use_follows_the_elastic_gpus() -> None:
    picture, version = _picture("FairShare", {"a": 60, "b": 40})
    version = _waiting(picture, version, [("a", "a1", "2026-01-01T00:00:01Z"), ("b", "b1", "2026-01-01T00:00:02Z")])
    assert _names(picture) == ["b1", "a1"]
    egpu = picture.egpu_body("egpu-b-1")
    assert egpu is not None
    picture.observe("egpu", "DELETED", _at(o.share_egpu("egpu-b-1", "gpu-0", cores=40, class_name=CLASS),
                                           version + 1))
    assert picture._egpu_owners == {"egpu-a-0": ("a", CLASS)}
    # b's reservation is still on the GPU but no ElasticGPU claims it: it counts for no namespace.
    assert _names(picture) == ["b1", "a1"]


def test_fair_share_wake_stays_cheap_with_many_reservations() -> None:
    held = {f"ns-{i}": 10 for i in range(4000)}
    picture, version = _picture("FairShare", held, cards=1000)
    _waiting(picture, version, [(f"ns-{i % 50}", f"w-{i}", f"2026-01-01T00:{i % 60:02d}:00Z") for i in range(1000)])
    started = time.perf_counter()
    for _ in range(5):
        keys = picture.pending_claim_keys()
    per_wake = (time.perf_counter() - started) / 5
    assert len(keys) == 1000
    assert per_wake < 0.4, f"a wake costs {per_wake * 1000:.0f} ms with 4,000 reservations and 1,000 waiting claims"


def test_a_batch_puts_its_waiting_claims_in_bind_order_and_leaves_other_keys_in_place() -> None:
    """Keys queued before the last wake (a claim's own update) keep their place in the queue; the
    worker's batch reorders the waiting claims among the places they hold."""
    picture, version = _picture("FairShare", {"a": 60, "b": 40, "c": 0}, cards=2)
    _waiting(picture, version, [("a", "a1", "2026-01-01T00:00:01Z"), ("b", "b1", "2026-01-01T00:00:02Z"),
                                ("c", "c1", "2026-01-01T00:00:03Z")])
    batch = [("claim", "a", "a1"), ("gpu", "gpu-0"), ("claim", "b", "b1"), ("claim", "x", "bound-or-gone"),
             ("claim", "c", "c1")]
    assert picture.in_bind_order(batch) == [("claim", "c", "c1"), ("gpu", "gpu-0"), ("claim", "b", "b1"),
                                            ("claim", "x", "bound-or-gone"), ("claim", "a", "a1")]
    assert picture.in_bind_order(batch[:2]) == batch[:2]
