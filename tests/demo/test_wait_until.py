"""The demo's waits: a failure is told as soon as it is certain, and a server that cannot answer yet
(429 while its storage starts, 503) is no certainty either way."""

from __future__ import annotations

import pytest

from elasticgpu.testbed import processes
from elasticgpu.testbed.processes import DemoError


def test_an_error_while_judging_hopelessness_is_not_yet_a_failure() -> None:
    answers = iter([RuntimeError("HTTP 429: storage is (re)initializing"), "", ""])
    checks = iter([None, "bound"])

    def hopeless() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert processes.wait_until(lambda: next(checks), "claim Bound", timeout_s=5, interval_s=0.01,
                                hopeless=hopeless) == "bound"


def test_a_certain_failure_is_told_at_once() -> None:
    with pytest.raises(DemoError, match="gave up waiting for claim Bound: no agent"):
        processes.wait_until(lambda: None, "claim Bound", timeout_s=30, interval_s=0.01, hopeless=lambda: "no agent")
