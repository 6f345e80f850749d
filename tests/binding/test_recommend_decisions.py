"""The recommendation rule (`decisions.recommend`), pure: worked examples and properties (never
below the measured peak, never above maxSize, stable under repeated samples, no Auto flapping)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elasticgpu.controller.decisions import recommend as r

CARD = 81920


def _samples(points: list[tuple[int, int]]) -> list[r.Sample]:
    return [r.Sample(float(i), cores, memory) for i, (cores, memory) in enumerate(points)]


@pytest.mark.parametrize(("points", "requested", "expected"), [
    # peak 50 % / 2000 MiB, +20 %: 60 % (a multiple of 5), 2400 -> 2560 MiB (a multiple of 256).
    ([(10, 1000), (50, 1500), (20, 2000)], (30, 1024), (60, 2560, r.UNDER_SIZED)),
    # The band is [60, 75] x [2560, 3328] (rec x 1.2 rounded up): inside is right-sized.
    ([(10, 1000), (50, 1500), (20, 2000)], (75, 3072), (60, 2560, r.RIGHT_SIZED)),
    ([(10, 1000), (50, 1500), (20, 2000)], (80, 3072), (60, 2560, r.OVER_SIZED)),
    # Under in one dimension wins over over in the other: the claim lacks something.
    ([(10, 1000), (50, 1500), (20, 2000)], (100, 2048), (60, 2560, r.UNDER_SIZED)),
    # An idle claim still gets one step of each.
    ([(0, 0), (0, 0), (0, 0)], (5, 256), (5, 256, r.RIGHT_SIZED)),
])
def test_worked_examples(points: list[tuple[int, int]], requested: tuple[int, int],
                         expected: tuple[int, int, str]) -> None:
    rec = r.recommend(_samples(points), bounds=r.bounds(margin=20, card_memory=CARD),
                      requested_cores=requested[0], requested_memory=requested[1])
    assert rec is not None
    assert (rec.cores, rec.memory, rec.state) == expected, rec.message


def test_too_few_samples_say_nothing() -> None:
    assert r.recommend(_samples([(50, 2000)] * 2), bounds=r.bounds(margin=20, card_memory=CARD),
                       requested_cores=10, requested_memory=256, min_samples=3) is None


def test_the_window_counts_a_measurement_once_and_forgets_old_ones() -> None:
    window = r.UsageWindow(window_s=10.0)
    assert window.add(r.Sample(0.0, 90, 9000), key="t0")
    assert not window.add(r.Sample(1.0, 90, 9000), key="t0")  # the same updateTime seen again
    assert window.add(r.Sample(5.0, 10, 100), key="t1")
    assert window.add(r.Sample(11.0, 20, 200), key="t2")
    assert [s.cores for s in window.samples] == [90, 10, 20]  # 90 held until 5.0: still in [1, 11]
    window.trim(15.0)
    assert [s.cores for s in window.samples] == [10, 20]  # it ended 10 s ago: out of the window
    assert window.watched_s(15.0) == 15.0  # watched since the first sample, trimmed or not
    # No new sample for long: the agent writes on change, so the last one is the use now.
    window.trim(100.0)
    assert [s.cores for s in window.samples] == [20]


def test_auto_leaves_a_peak_above_max_size_alone() -> None:
    bounds = r.bounds(margin=20, card_memory=CARD, max_cores=40)
    rec = r.recommend(_samples([(50, 1000)] * 3), bounds=bounds, requested_cores=30, requested_memory=2048)
    assert rec is not None and rec.cores == 40 and rec.state == r.UNDER_SIZED
    assert r.auto_target(rec, bounds=bounds, requested_cores=30, requested_memory=2048, watched_s=1e9,
                         since_last_auto_s=None, min_interval_s=0, shrink_after_s=0) is None


def test_auto_grows_at_once_but_shrinks_only_after_a_long_watch() -> None:
    bounds = r.bounds(margin=20, card_memory=CARD)
    rec = r.recommend(_samples([(50, 1000)] * 3), bounds=bounds, requested_cores=30, requested_memory=8192)
    assert rec is not None and (rec.cores, rec.memory) == (60, 1280)
    early = dict(requested_cores=30, requested_memory=8192, min_interval_s=300, shrink_after_s=1800)
    # Cores grow now; memory (a shrink) waits for 1800 s of watching.
    assert r.auto_target(rec, bounds=bounds, watched_s=60, since_last_auto_s=None, **early) == (60, 8192)
    assert r.auto_target(rec, bounds=bounds, watched_s=1800, since_last_auto_s=None, **early) == (60, 1280)
    # And never twice within the minimum interval.
    assert r.auto_target(rec, bounds=bounds, watched_s=1800, since_last_auto_s=10, **early) is None


usage = st.tuples(st.integers(0, 100), st.integers(0, CARD))
margins = st.integers(0, 100)
maybe_cores = st.none() | st.integers(1, 100)
maybe_memory = st.none() | st.integers(1, CARD)


@settings(max_examples=300)
@given(points=st.lists(usage, min_size=3, max_size=30), margin=margins, requested=usage,
       min_cores=maybe_cores, max_cores=maybe_cores, min_memory=maybe_memory, max_memory=maybe_memory,
       repeat=st.integers(0, 29), times=st.integers(1, 20))
def test_never_below_the_peak_never_above_max_and_stable(
        points: list[tuple[int, int]], margin: int, requested: tuple[int, int], min_cores: int | None,
        max_cores: int | None, min_memory: int | None, max_memory: int | None, repeat: int, times: int) -> None:
    bounds = r.bounds(margin=margin, card_memory=CARD, min_cores=min_cores, max_cores=max_cores,
                      min_memory=min_memory, max_memory=max_memory)
    samples = _samples(points)
    rec = r.recommend(samples, bounds=bounds, requested_cores=requested[0], requested_memory=requested[1])
    assert rec is not None
    peak_cores, peak_memory = max(c for c, _ in points), max(m for _, m in points)
    # Never above maxSize (nor the card), never below the peak unless maxSize is below it.
    assert bounds.min_cores <= rec.cores <= bounds.max_cores <= 100
    assert bounds.min_memory <= rec.memory <= bounds.max_memory <= CARD
    assert rec.cores >= min(peak_cores, bounds.max_cores)
    assert rec.memory >= min(peak_memory, bounds.max_memory)
    # Stable: the same measurements again (any of them, any number of times) change nothing.
    again = samples + [r.Sample(100.0 + i, *points[repeat % len(points)]) for i in range(times)]
    same = r.recommend(again, bounds=bounds, requested_cores=requested[0], requested_memory=requested[1])
    assert same is not None and (same.cores, same.memory, same.state) == (rec.cores, rec.memory, rec.state)
    # Auto: the target holds the peak and stays within maxSize; once applied, the claim is
    # right-sized under the same samples, so Auto does not move it again (no flapping).
    target = r.auto_target(rec, bounds=bounds, requested_cores=requested[0], requested_memory=requested[1],
                           watched_s=1e9, since_last_auto_s=None, min_interval_s=0, shrink_after_s=0)
    if target is None:
        return
    assert target[0] >= peak_cores and target[1] >= peak_memory
    assert target[0] <= bounds.max_cores and target[1] <= bounds.max_memory
    after = r.recommend(again, bounds=bounds, requested_cores=target[0], requested_memory=target[1])
    assert after is not None and after.state == r.RIGHT_SIZED, after.message
    assert r.auto_target(after, bounds=bounds, requested_cores=target[0], requested_memory=target[1], watched_s=1e9,
                         since_last_auto_s=None, min_interval_s=0, shrink_after_s=0) is None
