"""The controller's work queue: no duplicates, FIFO, and the background lane of the resync
served only when nothing else waits (checked against a two-list model with hypothesis)."""

from __future__ import annotations

import time

from hypothesis import given
from hypothesis import strategies as st

from elasticgpu.controller.flow.machinery.workqueue import WorkQueue

KEYS = st.sampled_from([("claim", "ns", f"c{i}") for i in range(6)] + [("egpu", f"e{i}") for i in range(3)])
OPERATIONS = st.lists(
    st.one_of(st.tuples(st.just("add"), KEYS, st.booleans()), st.tuples(st.just("get"), st.none(), st.none())),
    max_size=80,
)


@given(OPERATIONS)
def test_queue_behaves_like_two_fifo_lanes(operations: list[tuple[str, object, object]]) -> None:
    queue = WorkQueue()
    front: list[object] = []
    back: list[object] = []
    for op, key, background in operations:
        if op == "add":
            queue.add(key, background=bool(background))  # type: ignore[arg-type]
            if key not in front and key not in back:
                (back if background else front).append(key)
            elif not background and key in back:
                back.remove(key)
                front.append(key)
        else:
            expected = front.pop(0) if front else (back.pop(0) if back else None)
            assert queue.get(timeout_s=0.0) == expected
        assert len(queue) == len(front) + len(back)
    drained = []
    while (key := queue.get(timeout_s=0.0)) is not None:
        drained.append(key)
    assert drained == front + back


def test_delayed_key_comes_back_in_the_front_lane() -> None:
    queue = WorkQueue()
    # Due in 0.5 s, not 10 ms: a loaded box that descheduled this thread for 10 ms between the add
    # and the first get made "late" due already, and it came first.
    queue.add(("claim", "ns", "late"), delay_s=0.5)
    queue.add(("claim", "ns", "resync"), background=True)
    assert queue.get(timeout_s=1.0) == ("claim", "ns", "resync")  # due later: the background key goes first
    queue.add(("claim", "ns", "resync-2"), background=True)
    time.sleep(0.6)  # past the delay: "late" is due whatever the load
    assert queue.get(timeout_s=1.0) == ("claim", "ns", "late")  # due now: ahead of the background lane
    assert queue.get(timeout_s=0.0) == ("claim", "ns", "resync-2")
    assert queue.waiting() == 0


def test_a_batch_that_starts_in_the_background_lane_stays_short() -> None:
    queue = WorkQueue()
    for index in range(40):
        queue.add(("claim", "ns", f"resync-{index}"), background=True)
    first = queue.take(limit=256, background_limit=16, timeout_s=0.0)
    assert first == [("claim", "ns", f"resync-{index}") for index in range(16)]

    queue.add(("claim", "ns", "new"))
    batch = queue.take(limit=256, background_limit=16, timeout_s=0.0)
    # A front key goes first and takes only front keys: the new claim does not wait for 24 resyncs.
    assert batch == [("claim", "ns", "new")]
    rest = queue.take(limit=256, background_limit=16, timeout_s=0.0)
    assert len(rest) == 16 and queue.waiting() == 8
