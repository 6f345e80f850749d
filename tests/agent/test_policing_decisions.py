"""The over-limit decision (issue 25), pure: never stops before the claim stayed over its memory for
the whole grace, always stops once it has (StopContainer), Warn never stops, a container is
stopped once, and the containers chosen are the fewest largest ones that bring the claim back
within its reservation. Hypothesis drives sample sequences; the runtime's answer is drawn too."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from elasticgpu.agent.policing import decisions, policy_of
from elasticgpu.agent.policing.decisions import Policy, Sample, Watch

CONTAINERS = ("c1", "c2", "c3", "c4")


@dataclass(frozen=True)
class Step:
    dt: float
    containers: dict[str, int]
    runtime_ok: bool  # the runtime stopped what it was asked to (False: an error; nothing confirmed)


steps = st.builds(
    Step,
    dt=st.floats(min_value=0, max_value=40, allow_nan=False),
    containers=st.dictionaries(st.sampled_from(CONTAINERS), st.integers(min_value=0, max_value=400), max_size=4),
    runtime_ok=st.booleans(),
)
policies = st.builds(Policy, action=st.sampled_from(["Warn", "StopContainer"]),
                     grace_s=st.sampled_from([0.0, 1.0, 10.0, 30.0, 60.0]))  # fmt: skip


def _run(limit: int, policy: Policy, sequence: list[Step]) -> list[tuple[Sample, decisions.Stop | None, Watch]]:
    """Feed the samples; the 'wiring' confirms a stop's containers when the runtime answered OK."""
    watch, at, out = Watch(), 1000.0, []
    for step in sequence:
        at += step.dt
        sample = Sample(at=at, limit_mib=limit, containers=step.containers)
        before = watch
        watch, stop = decisions.observe(watch, sample, policy)
        out.append((sample, stop, before))
        if stop is not None and step.runtime_ok:
            for container in stop.containers:
                watch = decisions.confirm(watch, container)
    return out


def _over_run_start(samples: list[Sample], i: int) -> float | None:
    """When the run of over samples that ends at i began (None: sample i is not over)."""
    if not samples[i].over:
        return None
    j = i
    while j > 0 and samples[j - 1].over:
        j -= 1
    return samples[j].at


@given(limit=st.integers(min_value=0, max_value=600), policy=policies, sequence=st.lists(steps, max_size=30))
def test_never_stops_before_the_grace_elapsed_continuously_over(limit: int, policy: Policy,
                                                                sequence: list[Step]) -> None:  # fmt: skip
    run = _run(limit, policy, sequence)
    samples = [s for s, _, _ in run]
    for i, (sample, stop, _before) in enumerate(run):
        if stop is None:
            continue
        began = _over_run_start(samples, i)
        assert began is not None, "stopped on a sample under the limit"
        assert sample.at - began >= policy.grace_s, "stopped before the grace elapsed"
        assert stop.over_since == began
        assert policy.action == "StopContainer"


@given(limit=st.integers(min_value=0, max_value=600), grace=st.sampled_from([0.0, 10.0, 60.0]),
       sequence=st.lists(steps, max_size=30))  # fmt: skip
def test_warn_never_stops(limit: int, grace: float, sequence: list[Step]) -> None:
    assert all(stop is None for _, stop, _ in _run(limit, Policy(action="Warn", grace_s=grace), sequence))


@given(limit=st.integers(min_value=0, max_value=600), policy=policies, sequence=st.lists(steps, max_size=30))
def test_always_stops_once_the_grace_elapsed_and_what_is_left_fits(limit: int, policy: Policy,
                                                                   sequence: list[Step]) -> None:  # fmt: skip
    run = _run(limit, policy, sequence)
    samples = [s for s, _, _ in run]
    for i, (sample, stop, before) in enumerate(run):
        live = {c: m for c, m in sample.containers.items() if c not in before.stopped and m > 0}
        began = _over_run_start(samples, i)
        due = (policy.action == "StopContainer" and began is not None and sample.at - began >= policy.grace_s
               and sum(live.values()) > limit)  # fmt: skip
        assert (stop is not None) == due, (sample, before, stop)
        if stop is None:
            continue
        assert set(stop.containers) <= set(live), "a container already stopped, or one using nothing"
        left = sum(m for c, m in live.items() if c not in stop.containers)
        assert left <= limit, "stopping the chosen ones must bring the claim within its reservation"
        # The fewest: without the last one chosen (the smallest of them), it would still be over.
        assert left + live[stop.containers[-1]] > limit
        sizes = [live[c] for c in stop.containers]
        assert sizes == sorted(sizes, reverse=True), "largest first"
        assert all(live[c] <= min(sizes) for c in live if c not in stop.containers), "never a smaller before a larger"


@given(limit=st.integers(min_value=1, max_value=600), policy=policies, sequence=st.lists(steps, max_size=40))
def test_a_confirmed_container_is_never_stopped_again(limit: int, policy: Policy, sequence: list[Step]) -> None:
    confirmed: set[str] = set()
    watch, at = Watch(), 0.0
    for step in sequence:
        at += step.dt
        watch, stop = decisions.observe(watch, Sample(at=at, limit_mib=limit, containers=step.containers), policy)
        if stop is None:
            continue
        assert not confirmed & set(stop.containers)
        if step.runtime_ok:
            for container in stop.containers:
                watch = decisions.confirm(watch, container)
                confirmed.add(container)


def test_one_sample_under_restarts_the_count() -> None:
    policy = Policy(action="StopContainer", grace_s=60)
    watch = Watch()
    over, under = {"c1": 200}, {"c1": 50}
    for at, used in ((0, over), (30, over), (59, over), (59.5, under), (60, over), (119, over)):
        watch, stop = decisions.observe(watch, Sample(at=at, limit_mib=100, containers=used), policy)
        assert stop is None, at
    watch, stop = decisions.observe(watch, Sample(at=120, limit_mib=100, containers=over), policy)
    assert stop == decisions.Stop(containers=("c1",), used_mib=200, limit_mib=100, over_since=60)


def test_a_stopped_containers_last_samples_never_stop_its_neighbour() -> None:
    # c1 was stopped; the driver still lists its memory for a sample or two: c2 alone fits.
    watch = decisions.confirm(Watch(over_since=0), "c1")
    watch, stop = decisions.observe(watch, Sample(at=100, limit_mib=100, containers={"c1": 300, "c2": 80}),
                                    Policy(action="StopContainer", grace_s=10))  # fmt: skip
    assert stop is None and watch.over_since == 0


def test_no_limit_is_never_over() -> None:
    _, stop = decisions.observe(Watch(over_since=0), Sample(at=1e6, limit_mib=0, containers={"c1": 10**6}),
                                Policy(action="StopContainer", grace_s=0))  # fmt: skip
    assert stop is None


def test_the_policy_is_read_from_the_claims_status_and_warn_otherwise() -> None:
    def claim(policing: object) -> dict[str, object]:
        return {"status": {"phase": "Bound", "policing": policing}}

    assert policy_of(claim({"overLimitAction": "StopContainer", "overLimitGraceSeconds": 5})) == Policy(
        action="StopContainer", grace_s=5.0)
    assert policy_of(claim({"overLimitAction": "StopContainer"})) == Policy(action="StopContainer", grace_s=60.0)
    for unknown in (None, {}, {"overLimitAction": "Kill"}, {"overLimitGraceSeconds": "soon"}):
        assert policy_of(claim(unknown)) == decisions.WARN, unknown
    assert policy_of(None) == decisions.WARN  # not read yet
