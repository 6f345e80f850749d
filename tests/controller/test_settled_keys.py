"""`SettledKeys` alone (flow/machinery/settled.py): which keys a resync pass queues."""

from __future__ import annotations

from elasticgpu.controller.flow.machinery.settled import SettledKeys
from elasticgpu.controller.flow.machinery.workqueue import WorkQueue

A, B, C = ("claim", "ns", "a"), ("egpu", "b"), ("gpu", "c")


def _settle(keys: SettledKeys, *settled: tuple[str, ...]) -> None:
    for key in settled:
        keys.begin(key)
        keys.end(key, settled=True)


def test_settled_keys_leave_the_pass_and_an_event_brings_one_back() -> None:
    queue = WorkQueue()
    keys = queue.settled
    for key in (A, B, C):
        queue.add(key, background=True)  # a start-up list: known, not settled yet
    assert sorted(keys.to_look_at(walk=0)) == sorted([A, B, C])
    _settle(keys, A, B, C)
    assert keys.to_look_at(walk=0) == []
    queue.add(B)  # a watch event
    assert keys.to_look_at(walk=0) == [B]
    queue.add(A, delay_s=60.0, recheck=True)  # a timer of its own: not the resync's to bring
    assert keys.to_look_at(walk=0) == [B]


def test_a_change_during_the_sync_keeps_the_key_unsettled() -> None:
    keys = SettledKeys()
    keys.begin(A)
    keys.unsettle(A)  # an event arrived after the sync read the picture
    keys.end(A, settled=True)
    assert keys.to_look_at(walk=0) == [A]
    keys.begin(A)
    keys.end(A, settled=False)  # a Pending claim, a write, a failure
    assert not keys.is_settled(A) and keys.to_look_at(walk=0) == [A]


def test_the_walk_takes_the_keys_verified_longest_ago_and_walks_on() -> None:
    keys = SettledKeys()
    _settle(keys, A, B, C)
    assert keys.to_look_at(walk=2) == [A, B]
    assert keys.to_look_at(walk=2) == [C, A]
    assert keys.walk_size(interval_s=30, relist_interval_s=300, per_s=50) == 1  # 3 keys a relist interval
    assert keys.walk_size(interval_s=30, relist_interval_s=300, per_s=0) == 0
    many = SettledKeys()
    _settle(many, *[("gpu", str(i)) for i in range(100_000)])
    assert many.walk_size(interval_s=30, relist_interval_s=300, per_s=50) == 1500  # the rate, not 10,000


def test_a_relist_unsettles_what_changed_forgets_what_went_and_a_class_change_unsettles_all() -> None:
    keys = SettledKeys()
    _settle(keys, A, B, C)
    before = {A: (1, 2), B: (2, (), ()), C: 3, ("class", "k"): "7"}
    keys.relisted(before, {A: (1, None), C: 3, ("class", "k"): "7"})  # B gone, A lost its ElasticGPU
    assert keys.to_look_at(walk=0) == [A] and keys.is_settled(C) and not keys.is_settled(B)
    _settle(keys, A)
    keys.relisted({A: (1, None), C: 3, ("class", "k"): "7"}, {A: (1, None), C: 3, ("class", "k"): "8"})
    assert sorted(keys.to_look_at(walk=0)) == sorted([A, C])
