"""A stopping controller (its Lease lost, a signal) takes no new binds onto its closed pool: a
sync that reaches the hand-off then returns quietly, instead of failing "a bug" and being retried
every few milliseconds, once per queued key, until the process exits (issue 49's fleet run)."""

from __future__ import annotations

from elasticgpu.controller.flow.machinery.failures import Failures
from elasticgpu.controller.flow.machinery.handoff import HandOff
from elasticgpu.controller.flow.machinery.workqueue import WorkQueue
from elasticgpu.controller.settings import BindingSettings


def test_a_bind_handed_off_after_close_is_left_for_the_next_leader() -> None:
    queue = WorkQueue()
    hand_off = HandOff(queue=queue, failures=Failures(queue), settings=BindingSettings(workers=2))
    ran: list[str] = []
    hand_off.submit((("claim", "ns", "a"),), lambda: ran.append("a"))
    hand_off.close()
    assert ran == ["a"]
    hand_off.submit((("claim", "ns", "b"),), lambda: ran.append("b"))  # raised RuntimeError before
    assert ran == ["a"] and not hand_off.busy()
