"""The allocator's inventory mirrors the GPU objects' allocations; `Ledger.repair_inventory` (run
by every resync) puts it back in step whatever left it out of step, sparing only the tentative
reservations of a batch whose write is in flight. The Ledger does no I/O: these tests feed it
GPU objects as the API server would."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from elasticgpu.allocator import CardShare, Placement
from elasticgpu.controller.picture.reservations import Ledger
from tests.binding import objects as o

NODE = "node-1"
CARDS = [f"gpu-{i}" for i in range(3)]


def _gpu(name: str, version: int, keys: dict[str, int]) -> dict[str, Any]:
    """GPU `name` at resourceVersion `version` holding `keys` (ElasticGPU -> cores, 1 GiB each)."""
    body = o.gpu(name, node=NODE, index=CARDS.index(name), allocations=[
        {"elasticGPU": key, "cores": cores, "memory": 1024, "exclusive": False,
         "reservedAt": "2026-12-03T00:00:00Z"} for key, cores in sorted(keys.items())])
    body["metadata"]["resourceVersion"] = str(version)
    return body


def _share(card: str, cores: int) -> Placement:
    return Placement(node=NODE, cards=(CardShare(uuid=card.upper(), cores=cores, memory_mib=1024, whole=False),))


def _mirror(ledger: Ledger) -> dict[str, Placement]:
    """What the inventory should hold: every key the GPU objects hold, as they hold it."""
    keys = {a.elastic_gpu for name in ledger.gpu_names() for a in (ledger.gpu(name) or _none()).status.allocations}
    return {key: placement for key in keys if (placement := ledger.held(key)) is not None}


def _none() -> Any:
    raise AssertionError("a listed GPU has no model")


def test_a_reservation_no_object_holds_is_released_a_young_tentative_one_is_kept() -> None:
    ledger = Ledger()
    ledger.observe_gpu(_gpu("gpu-0", 1, {"a": 50}))
    ledger.inventory.reserve("phantom", _share("gpu-0", 25))  # left behind by some path
    ledger.reserve_tentative("in-flight", _share("gpu-0", 25))  # a batch's write under way
    assert ledger.inventory.card("GPU-0").free_cores == 0

    assert ledger.repair_inventory() == ["phantom"]
    assert set(ledger.inventory.reservations) == {"a", "in-flight"}
    assert ledger.inventory.card("GPU-0").free_cores == 25

    # A tentative reservation whose write never finished (far older than any write takes) goes too.
    assert ledger.repair_inventory(tentative_for_s=0.0) == ["in-flight"]
    assert dict(ledger.inventory.reservations) == {"a": _share("gpu-0", 50)}


def test_a_reservation_the_objects_hold_is_mirrored_again() -> None:
    ledger = Ledger()
    ledger.observe_gpu(_gpu("gpu-0", 1, {"a": 50, "b": 25}))
    ledger.inventory.release("b")  # lost from the inventory: the card looks freer than it is
    assert ledger.repair_inventory() == ["b"]
    assert ledger.inventory.reservations["b"] == _share("gpu-0", 25)
    assert ledger.repair_inventory() == []  # in step: nothing to do, nothing said


def test_a_written_tentative_reservation_is_no_longer_tentative() -> None:
    ledger = Ledger()
    ledger.observe_gpu(_gpu("gpu-0", 1, {}))
    ledger.reserve_tentative("k", _share("gpu-0", 25))
    ledger.observe_gpu(_gpu("gpu-0", 2, {"k": 25}))  # the batch's write landed
    ledger.observe_gpu(_gpu("gpu-0", 3, {}))  # and was freed again later
    assert "k" not in ledger.inventory.reservations
    assert ledger.repair_inventory(tentative_for_s=1e9) == []


operation = st.one_of(
    st.tuples(st.just("observe"), st.sampled_from(CARDS),
              st.dictionaries(st.sampled_from("abcdef"), st.sampled_from([10, 20, 25]), max_size=3)),
    st.tuples(st.just("tentative"), st.sampled_from(CARDS), st.sampled_from("abcdefgh")),
    st.tuples(st.just("drop"), st.sampled_from(CARDS), st.sampled_from("abcdefgh")),
    st.tuples(st.just("lose"), st.sampled_from(CARDS), st.sampled_from("abcdefgh")),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(operation, max_size=30))
def test_after_any_sequence_the_repair_leaves_the_inventory_equal_to_the_objects(ops: list[Any]) -> None:
    ledger = Ledger()
    version = 0
    for card in CARDS:
        version += 1
        ledger.observe_gpu(_gpu(card, version, {}))
    for kind, card, arg in ops:
        if kind == "observe":
            # A key lives on one card at a time here (the allocator's own rule for slices).
            held_elsewhere = {k for k in arg for other in CARDS if other != card and ledger.allocation(other, k)}
            version += 1
            ledger.observe_gpu(_gpu(card, version, {k: c for k, c in arg.items() if k not in held_elsewhere}))
        elif kind == "tentative":
            if arg not in ledger.inventory.reservations and not ledger.inventory.conflict(_share(card, 10)):
                ledger.reserve_tentative(arg, _share(card, 10))
        elif kind == "drop":
            ledger.drop_tentative(arg)
        else:  # some path forgets an entry
            ledger.inventory.release(arg)
    ledger.repair_inventory(tentative_for_s=0.0)
    assert dict(ledger.inventory.reservations) == _mirror(ledger)
    for card in CARDS:
        used = sum(a.cores for a in (ledger.gpu(card) or _none()).status.allocations)
        assert ledger.inventory.card(card.upper()).free_cores == 100 - used
