"""A runtime that is down is said once (issue 36 item 7): the agent logged a raw gRPC error at WARNING
on every retry of its start-up reconciliation (every 10 s at the longest backoff), because the error's
text carries a timestamp and no two attempts read the same."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import grpc
import pytest

from elasticgpu.agent import repeated_failures
from elasticgpu.agent.cri import api
from elasticgpu.agent.cri.proxy import CriProxy, ProxySettings

pb = api.pb


def _rpc_error(socket: Path) -> grpc.RpcError:
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        try:
            api.services.RuntimeServiceStub(channel).Version(pb.VersionRequest(), timeout=2)
        except grpc.RpcError as e:
            return e
    raise AssertionError(f"Version through {socket} answered: nothing should listen there")


def test_the_same_grpc_failure_is_described_the_same(tmp_path: Path) -> None:
    first, second = _rpc_error(tmp_path / "none.sock"), _rpc_error(tmp_path / "none.sock")
    assert repeated_failures.describe(first) == repeated_failures.describe(second)
    assert repeated_failures.describe(first).startswith("UNAVAILABLE: ")
    assert repeated_failures.describe(ValueError("bad")) == "ValueError: bad"


def test_a_runtime_that_stays_down_is_one_warning_and_its_return_one_info(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="elasticgpu.agent.cri.proxy")
    settings = ProxySettings(listen=tmp_path / "proxy.sock", upstream=str(tmp_path / "runtime.sock"),
                             reconcile_backoff_s=(0.02, 0.05))
    with CriProxy(settings) as proxy:
        deadline = time.monotonic() + 10
        while sum("reconcil" in r.getMessage() and "failed" in r.getMessage() for r in caplog.records) < 6:
            assert time.monotonic() < deadline, "the start-up reconciliation did not retry"
            time.sleep(0.02)
        assert not proxy.reconciled.is_set()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "reconciling with the runtime at" in warnings[0] and "UNAVAILABLE" in warnings[0]
