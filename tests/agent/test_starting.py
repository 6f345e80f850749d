"""The agent's parts opened in the background: capped, jittered backoff; one log line per change of state."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from elasticgpu.agent import starting
from elasticgpu.agent.ledger.store import LedgerStore


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _failing(errors: list[Exception], value: object) -> starting.Part[object]:
    def opener() -> object:
        if errors:
            raise errors.pop(0)
        return value

    return starting.Part("the thing", opener)


def test_backoff_doubles_up_to_its_cap_with_jitter_and_logs_each_failure_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    same = [OSError("NVML library not found") for _ in range(8)]
    parts = starting.Parts(
        backend=_failing([*same, ValueError("driver too old")], "backend"),
        ledger=starting.Part("the ledger", lambda: ("ledger", None)),
        kube=starting.Part("the API client", lambda: "kube"),
        backoff=starting.BackoffSettings(first_s=1.0, longest_s=8.0), clock=clock, jitter=lambda: 0.5,
    )  # fmt: skip
    waits = []
    with caplog.at_level(logging.DEBUG, logger="elasticgpu.agent.starting"):
        for _ in range(10):
            wait = parts.open_due()
            if wait is None:
                break
            assert parts.ledger == "ledger" and parts.backend is None
            assert "the thing: OSError: NVML library not found" in str(parts.not_ready()) or "ValueError" in str(
                parts.not_ready())
            waits.append(wait)
            clock.now += wait
    assert waits == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0]  # (1, 2, 4, 8, 8, ...) x jitter 0.5
    assert parts.backend == "backend" and parts.ready.is_set() and parts.not_ready() is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings  # the NVML failure once, the new failure once
    assert "NVML library not found" in warnings[0] and "driver too old" in warnings[1]
    assert any("the thing is open after 9 failed attempt(s)" in r.getMessage() for r in caplog.records)


def test_a_corrupt_ledger_file_is_moved_aside_and_a_new_one_opened(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ledger.db"
    path.write_bytes(b"not a database" * 100)
    url = f"sqlite:///{path}"
    parts = starting.Parts(
        backend=starting.Part("backend", lambda: "backend"),
        ledger=starting.Part("the ledger", lambda: LedgerStore.open_or_set_aside(url)),
        kube=starting.Part("kube", lambda: "kube"),
    )
    with caplog.at_level(logging.INFO):
        assert parts.open_due() is None
    try:
        assert parts.set_aside is not None and parts.set_aside.read_bytes() == b"not a database" * 100
        assert parts.set_aside.name.startswith("ledger.db.corrupt-")
        assert parts.ledger.open_allocations() == []
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and str(parts.set_aside) in warnings[0].getMessage()
    finally:
        parts.close()
