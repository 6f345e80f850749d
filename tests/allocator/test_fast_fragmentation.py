"""The fast fragmentation path agrees with the reference model, state by state and move by move."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from elasticgpu.allocator.fragmentation import FastFragmentation, FragmentationModel
from elasticgpu.allocator.policies import Fragmentation, moves
from elasticgpu.allocator.shapes import CardSig, NodeSig, Shape
from elasticgpu.allocator.workloads import Workload

MEMORY = 32768

workloads = st.lists(
    st.tuples(
        st.one_of(
            st.builds(lambda c: (0, c), st.integers(1, 99)),
            st.builds(lambda k: (k, 100), st.sampled_from([1, 2, 4, 8])),
        ),
        st.sampled_from([0, 1000, 4000, 16000]),
        st.sampled_from([(), ("G2",), ("T4|G2",), ("V100*",)]),
        st.integers(1, 20),
        st.sampled_from([0, 4096, 49152]),
    ),
    min_size=1,
    max_size=8,
)
frees = st.lists(st.integers(0, 100), min_size=1, max_size=8)


def workload_of(entries: list[tuple[tuple[int, int], int, tuple[str, ...], int, int]]) -> Workload:
    counts: dict[Shape, int] = {}
    for (cards, cores), cpu, models, count, memory in entries:
        shape = Shape(cards, cores, None, cpu, models, memory)
        counts[shape] = counts.get(shape, 0) + count
    total = sum(counts.values())
    return Workload(tuple(counts), tuple(c / total for c in counts.values()))


def node_of(free: list[int], idle_full: int, cpu: int, memory: int) -> NodeSig:
    cards = []
    for i, f in enumerate(free):
        idle = f == 100 and i < idle_full
        # A free card that is not idle holds a zero-core share (still regular memory).
        cards.append(CardSig(f, MEMORY * f // 100, MEMORY, idle, "G2"))
    return NodeSig(cpu, 32000, tuple(sorted(cards)), len(cards), memory)


@settings(max_examples=150, deadline=None)
@given(
    entries=workloads,
    free=frees,
    idle_full=st.integers(0, 8),
    cpu=st.sampled_from([0, 500, 1000, 3000, 4000, 9000, 16000, 20000, 32000]),
    memory=st.sampled_from([0, 4096, 40000, 49152, 100000]),
    request=st.tuples(
        st.sampled_from([(-1, 0), (0, 0), (0, 10), (0, 50), (0, 100), (1, 100), (2, 100), (8, 100)]),
        st.sampled_from([0, 1000, 4000, 16000]),
        st.sampled_from([(), ("G2",), ("T4",)]),
        st.sampled_from([0, 4096, 49152]),
    ),
)
def test_fast_path_scores_every_move_as_the_reference(
    entries: list[tuple[tuple[int, int], int, tuple[str, ...], int, int]],
    free: list[int],
    idle_full: int,
    cpu: int,
    memory: int,
    request: tuple[tuple[int, int], int, tuple[str, ...], int],
) -> None:
    workload = workload_of(entries)
    model = FragmentationModel(workload)
    fast = FastFragmentation(model)
    sig = node_of(free, idle_full, cpu, memory)
    view = fast.view(sig.cards)
    assert view is not None
    bucket = model.bucket(cpu, memory)
    assert abs(fast.value(view, bucket) - model.node(sig.cards, cpu, memory)) < 1e-6
    (cards, cores), cpu_need, models, memory_need = request
    shape = Shape(cards, cores, None, cpu_need, models, memory_need)
    if cpu_need > cpu or memory_need > memory:
        assert not list(moves(sig, shape))
        return
    before = model.node(sig.cards, cpu, memory)
    reference = sorted(
        round(model.node(after, cpu - cpu_need, memory - memory_need) - before, 6) for _, after in moves(sig, shape)
    )
    after_bucket = model.bucket(cpu - cpu_need, memory - memory_need)
    got = sorted(round(growth, 6) for growth, _, _ in fast.deltas(view, bucket, after_bucket, shape))
    # The reference lists equal cards once; the fast path lists equal free cores once and
    # leaves out cards with nothing free (a share of no cores goes the general way).
    if cards or cores:
        assert sorted(set(got)) == sorted(set(reference))
    # And the policy's cached answer is the best of them.
    policy = Fragmentation(workload)
    score, _ = policy.resolve(policy.prepare(sig), sig, shape, {})
    assert score == policy.best(sig, shape)[0]
