"""`api.accounting`: how a reservation's integral moves through its ElasticGPU's status (issue 38).

Rows of (status before, the write, status after), then a property: whatever sequence of binds,
resizes and releases, the value never decreases and equals the sum of size x time while Bound."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elasticgpu.api import accounting, names, timestamps

T0 = 1_800_000_000  # a whole second
SLICE = {names.RESOURCE_CORE: 30, names.RESOURCE_MEMORY: "10Gi"}
BIGGER = {names.RESOURCE_CORE: 50, names.RESOURCE_MEMORY: "20Gi"}
CARDS = {names.RESOURCE_CORE: 200, names.RESOURCE_NVIDIA_GPU: 2, names.RESOURCE_MEMORY: "160Gi"}


def body(phase: str | None, capacity: dict[str, Any], acc: dict[str, Any] | None = None,
         created: int = T0) -> dict[str, Any]:
    return {"metadata": {"creationTimestamp": timestamps.format_epoch(created)},
            "status": {"phase": phase, "capacity": capacity, "accounting": acc}}


def at(seconds: int) -> str:
    return timestamps.format_epoch(T0 + seconds)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("before", "phase", "capacity", "now", "after"), [
    # OBSERVATION: not bound yet, and the write binds it: a period opens now.
    (body("Pending", {}), "Bound", SLICE, T0 + 5,
     {"coreSeconds": 0, "memoryMibSeconds": 0, "cardSeconds": 0, "since": at(5)}),
    # OBSERVATION: Bound, same size (a message, a condition): nothing to write.
    (body("Bound", SLICE, {"since": at(0)}), "Bound", SLICE, T0 + 60, None),
    (body("Bound", SLICE, {"since": at(0)}), "Bound", None, T0 + 60, None),
    # OBSERVATION: a resize while Bound: the old size's period closes, a new one opens.
    (body("Bound", SLICE, {"since": at(0)}), "Bound", BIGGER, T0 + 10,
     {"coreSeconds": 300, "memoryMibSeconds": 10240 * 10, "cardSeconds": 0, "since": at(10)}),
    # OBSERVATION: released: the period closes, none opens.
    (body("Bound", CARDS, {"coreSeconds": 7, "since": at(0)}), "Released", None, T0 + 3,
     {"coreSeconds": 7 + 600, "memoryMibSeconds": 163840 * 3, "cardSeconds": 6, "since": None}),
    # OBSERVATION: failed (a fatal XID, a preemption) while Bound: the same.
    (body("Bound", SLICE, {"since": at(0)}), "Failed", None, T0 + 1,
     {"coreSeconds": 30, "memoryMibSeconds": 10240, "cardSeconds": 0, "since": None}),
    # OBSERVATION: Released already; a later write (Failed by GPU health): nothing moves.
    (body("Released", SLICE, {"coreSeconds": 30}), "Failed", None, T0 + 100, None),
    # OBSERVATION: Bound before status.accounting existed: the period began at creation.
    (body("Bound", SLICE, None, created=T0 - 100), "Released", None, T0,
     {"coreSeconds": 3000, "memoryMibSeconds": 1024000, "cardSeconds": 0, "since": None}),
])
def test_fold(before: dict[str, Any], phase: str, capacity: dict[str, Any] | None, now: float,
              after: dict[str, Any] | None) -> None:
    assert accounting.fold(before, phase=phase, capacity=capacity, now=now) == after


@pytest.mark.timeout(10)
def test_accrued_reads_closed_sums_and_the_open_period() -> None:
    bound = body("Bound", SLICE, {"coreSeconds": 100, "memoryMibSeconds": 5, "cardSeconds": 0, "since": at(0)})
    assert accounting.accrued(bound, now=T0 + 10.9) == accounting.Accrued(100 + 300, 5 + 102400, 0)
    released = body("Released", SLICE, {"coreSeconds": 100, "memoryMibSeconds": 5})
    assert accounting.accrued(released, now=T0 + 1e6) == accounting.Accrued(100, 5, 0)
    assert accounting.accrued(body("Pending", {}), now=T0) == accounting.Accrued()
    assert accounting.accrued(bound, now=T0 + 10.9).memory_byte_seconds == (5 + 102400) * 2**20


def apply(state: dict[str, Any], phase: str, capacity: dict[str, Any] | None, now: float) -> dict[str, Any]:
    """The status patch `set_status` writes, applied as a merge patch would apply it."""
    folded = accounting.fold(state, phase=phase, capacity=capacity, now=now)
    status = dict(state["status"])
    status["phase"] = phase
    if capacity is not None:
        status["capacity"] = capacity
    if folded is not None:
        status["accounting"] = {k: v for k, v in folded.items() if v is not None}
    return {**state, "status": status}


STEPS = st.lists(st.tuples(st.sampled_from(["Bound", "Released", "Failed"]), st.sampled_from([None, SLICE, BIGGER]),
                           st.floats(min_value=0, max_value=5000, allow_nan=False)), max_size=12)


@pytest.mark.timeout(60)
@settings(max_examples=200, deadline=None)
@given(steps=STEPS)
def test_value_never_decreases_and_counts_each_second_once(steps: list[tuple[str, dict[str, Any] | None,
                                                                              float]]) -> None:
    state = body("Pending", {})
    now = float(T0)
    # The reference: the Bound periods as (cores, first second, last second), kept independently.
    periods: list[list[int]] = []
    phase_now, size_now = "Pending", 0
    last = 0
    for phase, capacity, wait in steps:
        before_now = now
        now += wait
        middle = accounting.accrued(state, now=(before_now + now) / 2).core_seconds
        assert last <= middle <= accounting.accrued(state, now=now).core_seconds
        seen = accounting.accrued(state, now=now).core_seconds
        new_size = size_now if capacity is None else accounting.size_of(capacity).cores
        if phase_now == "Bound":
            periods[-1][2] = int(now)
        if phase == "Bound" and (phase_now != "Bound" or new_size != size_now):
            periods.append([new_size, int(now), int(now)])
        phase_now, size_now = phase, new_size
        state = apply(state, phase, capacity, now)
        kept = accounting.accrued(state, now=now).core_seconds
        assert kept == seen == sum(cores * (end - start) for cores, start, end in periods)
        last = kept
    later = now + 1000
    if phase_now == "Bound":
        periods[-1][2] = int(later)
    assert accounting.accrued(state, now=later).core_seconds == sum(c * (e - b) for c, b, e in periods)
