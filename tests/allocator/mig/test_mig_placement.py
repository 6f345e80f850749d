"""MIG placement: the slot rules hold whatever the sequence of requests and releases, and the
fragmentation-aware choice keeps room for the largest profiles where first-fit does not.

Properties (hypothesis): never two instances on one memory slice, never a profile at a start it
does not allow, never more compute or memory slices than the card has; release restores the
card exactly; a stale placement is refused by `reserve`, never squeezed in.
"""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elasticgpu.allocator import ReservationConflict
from elasticgpu.allocator.mig import (
    EMPTY,
    MODELS,
    MigAllocator,
    MigCard,
    MigInstance,
    MigModel,
    MigPlacement,
    MigRequest,
    MigUnplaceable,
    Slots,
    by_name,
    model_for,
    profile_for,
)

A100_80 = by_name("A100-80GB")


def _cluster(policy: str, models: list[list[str]]) -> MigAllocator:
    allocator = MigAllocator(policy=policy)  # type: ignore[arg-type]
    for n, node in enumerate(models):
        for i, name in enumerate(node):
            model = by_name(name)
            allocator.add_card(
                MigCard(uuid=f"GPU-{n}-{i}", node=f"node-{n}", index=i, model=model, memory_mib=model.memory_gb * 1024)
            )
    return allocator


def _check_card(model: MigModel, instances: list[MigInstance], slots: Slots) -> None:
    memory = 0
    compute = 0
    for instance in instances:
        profile = model.profile(instance.profile)
        assert instance.start in profile.starts, f"{profile.name} at {instance.start}"
        taken = profile.slots(instance.start)
        assert not memory & taken, f"overlap at {instance}"
        assert taken < 1 << model.memory_slices, f"{instance} runs past the card"
        memory |= taken
        compute += profile.compute
    assert compute <= model.compute_slices
    assert slots == Slots(memory, compute)


requests = st.one_of(
    st.builds(MigRequest, cores=st.integers(1, 100), memory_mib=st.one_of(st.none(), st.integers(1, 100_000))),
    st.builds(MigRequest, cores=st.just(100), cards=st.integers(1, 3)),
)
operations = st.lists(
    st.one_of(st.tuples(st.just("allocate"), requests), st.tuples(st.just("release"), st.integers(0, 40))),
    max_size=40,
)
nodes = st.lists(st.lists(st.sampled_from([m.name for m in MODELS]), min_size=1, max_size=3), min_size=1, max_size=3)


@settings(max_examples=150)
@given(policy=st.sampled_from(["fragmentation", "first-fit"]), cluster=nodes, ops=operations)
def test_instances_keep_every_slot_rule(policy: str, cluster: list[list[str]], ops: list[tuple[str, object]]) -> None:
    allocator = _cluster(policy, cluster)
    keys: list[str] = []
    for step, (kind, arg) in enumerate(ops):
        if kind == "allocate":
            assert isinstance(arg, MigRequest)
            before = {c.uuid: allocator.slots(c.uuid) for c in allocator.cards()}
            found = allocator.allocate(f"k{step}", arg)
            if isinstance(found, MigPlacement):
                keys.append(f"k{step}")
                assert len({i.uuid for i in found.instances}) == max(arg.cards, 1)
            else:
                assert isinstance(found, MigUnplaceable)
                assert {c.uuid: allocator.slots(c.uuid) for c in allocator.cards()} == before
        elif keys:
            assert isinstance(arg, int)
            key = keys.pop(arg % len(keys))
            held = allocator.reservations[key]
            before = {c.uuid: allocator.slots(c.uuid) for c in allocator.cards()}
            allocator.release(key)
            for instance in held.instances:
                model = next(c.model for c in allocator.cards() if c.uuid == instance.uuid)
                profile = model.profile(instance.profile)
                assert allocator.slots(instance.uuid).memory == before[instance.uuid].memory & ~profile.slots(
                    instance.start
                )
        for card in allocator.cards():
            _check_card(card.model, list(allocator.instances(card.uuid).values()), allocator.slots(card.uuid))
    for key in keys:
        allocator.release(key)
    assert all(allocator.slots(c.uuid) == EMPTY for c in allocator.cards())


@given(
    profile=st.sampled_from(A100_80.profiles),
    start=st.integers(0, 7),
    taken=st.lists(st.tuples(st.sampled_from(A100_80.profiles), st.integers(0, 7)), max_size=4),
)
def test_reserve_refuses_what_breaks_a_rule(profile: object, start: int, taken: list[tuple[object, int]]) -> None:
    allocator = _cluster("fragmentation", [["A100-80GB"]])
    for i, (p, s) in enumerate(taken):
        with contextlib.suppress(ReservationConflict):
            allocator.reserve(f"t{i}", MigPlacement("node-0", (MigInstance("GPU-0-0", p.name, s),)))  # type: ignore[attr-defined]
    before = allocator.slots("GPU-0-0")
    try:
        allocator.reserve("new", MigPlacement("node-0", (MigInstance("GPU-0-0", profile.name, start),)))  # type: ignore[attr-defined]
    except ReservationConflict as err:
        assert allocator.slots("GPU-0-0") == before
        assert "reservation new" in str(err)
    _check_card(A100_80, list(allocator.instances("GPU-0-0").values()), allocator.slots("GPU-0-0"))


def test_a100_80gb_starts_follow_nvidias_table() -> None:
    starts = {p.name: (p.compute, p.size, p.starts) for p in A100_80.profiles}
    assert starts == {
        "1g.10gb": (1, 1, (0, 1, 2, 3, 4, 5, 6)),
        "1g.20gb": (1, 2, (0, 2, 4, 6)),
        "2g.20gb": (2, 2, (0, 2, 4)),
        "3g.40gb": (3, 4, (0, 4)),
        "4g.40gb": (4, 4, (0,)),
        "7g.80gb": (7, 8, (0,)),
    }


@pytest.mark.parametrize(
    ("product", "memory", "model"),
    [
        ("NVIDIA A100-SXM4-80GB", 81920, "A100-80GB"),
        ("NVIDIA A100-PCIE-40GB", 40960, "A100-40GB"),
        ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
        ("NVIDIA H100 NVL", 95830, "H100-94GB"),
        ("NVIDIA H200", 143771, "H200-141GB"),
        ("Tesla T4", 15360, None),
    ],
)
def test_card_models_from_what_nvml_reports(product: str, memory: int, model: str | None) -> None:
    found = model_for(product, memory)
    assert (found.name if found else None) == model


@pytest.mark.parametrize(
    ("cores", "memory", "profile"),
    [(10, 8192, "1g.10gb"), (10, 15000, "1g.20gb"), (15, None, "2g.20gb"), (30, None, "3g.40gb"),
     (47, None, "4g.40gb"), (58, None, "7g.80gb"), (100, None, "7g.80gb"), (14, 10240, "1g.10gb")],
)
def test_smallest_profile_covering_cores_and_memory(cores: int, memory: int | None, profile: str) -> None:
    need = memory if memory is not None else 81920 * cores // 100
    found = profile_for(A100_80, cores=cores, memory_mib=need, card_memory_mib=81920)
    assert found is not None and found.name == profile


def test_a_request_no_profile_covers_names_the_largest() -> None:
    allocator = _cluster("fragmentation", [["A100-80GB"]])
    found = allocator.place(MigRequest(cores=50, memory_mib=90_000))
    assert isinstance(found, MigUnplaceable) and found.never
    assert "7g.80gb" in found.reason


def test_a_3g_goes_where_a_4g_still_fits() -> None:
    # First-fit puts a 3g at slice 0, where it blocks the card's only 4g start; ours puts it at 4.
    for policy, start, four_fits in (("first-fit", 0, False), ("fragmentation", 4, True)):
        allocator = _cluster(policy, [["A100-80GB"]])
        found = allocator.allocate("a", MigRequest(cores=30))
        assert isinstance(found, MigPlacement) and found.instances[0].start == start, policy
        assert isinstance(allocator.place(MigRequest(cores=50)), MigPlacement) is four_fits, policy


def test_small_instances_fill_a_started_card_before_an_empty_one() -> None:
    allocator = _cluster("fragmentation", [["A100-80GB", "A100-80GB"]])
    first = allocator.allocate("a", MigRequest(cores=10))
    second = allocator.allocate("b", MigRequest(cores=10))
    assert isinstance(first, MigPlacement) and isinstance(second, MigPlacement)
    assert first.instances[0].uuid == second.instances[0].uuid
    assert isinstance(allocator.place(MigRequest(cores=100)), MigPlacement)


def test_cluster_leaves_out_cards_it_cannot_trust() -> None:
    from elasticgpu.allocator.mig import cluster
    from elasticgpu.api import GPU

    def card(name: str, allocations: list[dict[str, object]], *, mig: bool = True) -> cluster.ClusterCard:
        return cluster.ClusterCard(GPU.model_validate({
            "metadata": {"name": name.lower()},
            "spec": {"index": 0, "uuid": name, "model": "NVIDIA A100-SXM4-80GB", "memory": 81920, "nodeName": name,
                     "mig": mig},
            "status": {"allocations": allocations},
        }), {})

    built = cluster.build([
        card("GPU-OK", [{"elasticGPU": "a", "cores": 42, "memory": 40960, "partition": {"profile": "3g.40gb",
                                                                                          "start": 4}}]),
        card("GPU-SOFT", [{"elasticGPU": "b", "cores": 30, "memory": 10240}]),
        card("GPU-BAD", [{"elasticGPU": "c", "cores": 57, "memory": 40960, "partition": {"profile": "4g.40gb",
                                                                                           "start": 0}},
                         {"elasticGPU": "d", "cores": 42, "memory": 40960, "partition": {"profile": "3g.40gb",
                                                                                           "start": 0}}]),
        card("GPU-OFF", [], mig=False),
    ])
    assert [c.uuid for c in built.cards()] == ["GPU-OK"]
    assert built.slots("GPU-OK") == Slots(0b11110000, 3)
