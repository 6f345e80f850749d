"""Failed syncs are retried with per-key exponential backoff (reset by a success) under a global
token bucket, logged once per key and reason, and quiet for the races of normal operation."""

from __future__ import annotations

import logging
import socket
import threading
import time
import types
from pathlib import Path

import pytest
import yaml

from elasticgpu.controller import errors
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.machinery import liveness as liveness_module
from elasticgpu.controller.flow.machinery import workqueue
from elasticgpu.controller.flow.machinery.failures import Failures
from elasticgpu.controller.flow.machinery.liveness import Liveness
from elasticgpu.controller.flow.machinery.workqueue import WorkQueue
from elasticgpu.controller.process.reconciling import Controller
from elasticgpu.controller.settings import BindingSettings, ControllerSettings, ResyncSettings, RetrySettings

KEY = ("claim", "ns", "c")


def test_backoff_doubles_per_failure_up_to_the_cap_and_resets_on_success() -> None:
    queue = WorkQueue(RetrySettings(base_delay_s=0.005, max_delay_s=0.04, jitter=0.0, rate_per_s=1e6, burst=1000))
    delays = [queue.add_after_failure(KEY) for _ in range(6)]
    assert delays == pytest.approx([0.005, 0.01, 0.02, 0.04, 0.04, 0.04])
    assert queue.failures(KEY) == 6
    assert queue.add_after_failure(("claim", "ns", "other")) == pytest.approx(0.005)  # per key

    queue.forget(KEY)
    assert queue.failures(KEY) == 0
    assert queue.add_after_failure(KEY) == pytest.approx(0.005)
    assert queue.get(timeout_s=1.0) in (KEY, ("claim", "ns", "other"))  # the retries do come back


def test_the_default_cap_is_a_minute() -> None:
    queue = WorkQueue(RetrySettings(jitter=0.0))
    assert queue.backoff_s(1) == pytest.approx(0.005)
    assert queue.backoff_s(14) == pytest.approx(40.96)
    assert queue.backoff_s(15) == queue.backoff_s(500) == 60.0


def test_the_token_bucket_limits_retries_of_all_keys_together(monkeypatch: pytest.MonkeyPatch) -> None:
    # The queue's clock stands still: the bucket refills by the time between two takers, and a
    # thread descheduled 20 ms among them (a loaded box) shifted the delays past the tolerance
    # (121 of 20,000 runs at load 6).
    monkeypatch.setattr(workqueue, "time", types.SimpleNamespace(monotonic=lambda: 1000.0))
    queue = WorkQueue(RetrySettings(base_delay_s=0.0, jitter=0.0, rate_per_s=10.0, burst=3))
    delays = [queue.add_after_failure(("claim", "ns", f"c{i}")) for i in range(6)]
    assert delays[:3] == [0.0, 0.0, 0.0]  # the burst
    # then one token every 100 ms, each taker behind the previous one
    assert delays[3:] == pytest.approx([0.1, 0.2, 0.3], abs=0.02)


def test_races_are_quiet_and_other_failures_are_said_once(caplog: pytest.LogCaptureFixture) -> None:
    failures = Failures(WorkQueue(RetrySettings(jitter=0.0)))
    caplog.set_level(logging.DEBUG, logger="elasticgpu.controller.flow.machinery.failures")
    failures.failed(KEY, errors.NotFound(kind="ElasticGPUClaim", name="c", fix="it was deleted"))
    failures.failed(KEY, errors.Conflict("ElasticGPUClaim c changed since it was read", status=409))
    failures.failed(KEY, errors.ApiUnavailable("GET /x: connection refused", status=0))
    assert [r.levelno for r in caplog.records] == [logging.DEBUG] * 3

    caplog.clear()
    rejected = errors.Rejected("ElasticGPU egpu-1: the API server refused POST: metadata.labels: Invalid value",
                               status=422)
    for _ in range(3):
        failures.failed(KEY, rejected)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "claim ns/c" in warnings[0].getMessage() and "metadata.labels" in warnings[0].getMessage()

    caplog.clear()
    failures.failed(KEY, KeyError("a bug"))  # another reason: said again, with its traceback
    [error] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert error.levelno == logging.ERROR and error.exc_info is not None

    caplog.clear()
    failures.succeeded(KEY)
    failures.failed(KEY, rejected)  # after a success the same failure is news again
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1


def test_liveness_fails_when_a_thread_dies_or_a_loop_stops_stepping(monkeypatch: pytest.MonkeyPatch) -> None:
    # A clock the test moves: with the real one, a thread descheduled 0.2 s between a step and the
    # check (a loaded box) found the loop stuck where it had just stepped.
    now = [1000.0]
    monkeypatch.setattr(liveness_module, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    liveness = Liveness(stuck_after_s=0.2)
    assert liveness.alive() and liveness.reason() == ""
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="binder", daemon=True)
    thread.start()
    liveness.track(thread)
    liveness.expect("watch-claim")
    assert liveness.alive()
    stop.set()
    thread.join(5)
    assert not liveness.alive()
    assert "binder" in liveness.reason() and "died" in liveness.reason()

    liveness = Liveness(stuck_after_s=0.2)
    liveness.expect("watch-claim")
    now[0] += 0.19
    assert liveness.alive()
    now[0] += 0.11
    assert not liveness.alive() and "watch-claim made no progress" in liveness.reason()
    liveness.step("watch-claim")
    assert liveness.alive()


def test_a_resync_against_an_unreachable_server_says_so_once(tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there: every connection is refused
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "gone",
        "clusters": [{"name": "gone", "cluster": {"server": f"https://127.0.0.1:{port}",
                                                  "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "u"}}]}))
    kube = KubeApi.from_kubeconfig(str(kubeconfig))
    settings = ControllerSettings(resync=ResyncSettings(interval_s=0.02, relist_interval_s=0.0),
                                  binding=BindingSettings(workers=0))
    controller = Controller(kube, settings)
    stop = threading.Event()
    caplog.set_level(logging.DEBUG, logger="elasticgpu")
    thread = threading.Thread(target=controller.repair.run, args=(stop,), daemon=True)
    thread.start()
    try:
        time.sleep(0.5)  # many resyncs, each relisting
        assert thread.is_alive()
    finally:
        stop.set()
        thread.join(5)
        kube.close()
    attempts = [r for r in caplog.records if r.name == "elasticgpu.controller.flow.repair"]
    assert len(attempts) > 3
    loud = [(r.name, r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(loud) == 1 and loud[0][0] == "elasticgpu.controller.edge.reachability", loud
