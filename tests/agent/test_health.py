"""Health: which XIDs are fatal, recovery after a quiet period, a loop that survives its backend's failures."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from elasticgpu.agent import health
from elasticgpu.agent.discovery import APPLICATION_XIDS, XidEvent, models, simulated


@pytest.mark.parametrize("xid", sorted(APPLICATION_XIDS))
def test_application_xids_are_recorded_not_fatal(xid: int) -> None:
    tracker = health.HealthTracker(recovery_quiet_s=60, clock=lambda: 1000.0)
    assert tracker.record([XidEvent(gpu_uuid="GPU-a", xid=xid, timestamp=1000.0)]) is False
    state = tracker.health("GPU-a")
    assert state.healthy and state.last_application is not None and state.last_application.xid == xid
    assert tracker.counts() == {("GPU-a", xid): 1}


@pytest.mark.parametrize("xid", [48, 62, 63, 64, 74, 79, 92, 94, 95, 119])
def test_other_xids_are_fatal_until_a_quiet_period_passed(xid: int) -> None:
    now = [1000.0]
    tracker = health.HealthTracker(recovery_quiet_s=60, clock=lambda: now[0])
    assert tracker.record([XidEvent(gpu_uuid="GPU-a", xid=xid, timestamp=1000.0, message="note")]) is True
    sick = tracker.health("GPU-a")
    assert not sick.healthy and sick.reason == f"Xid{xid}" and "note" in sick.message and "60 s" in sick.message
    assert tracker.health("GPU-b").healthy  # other cards are not touched
    now[0] = 1059.0
    assert not tracker.health("GPU-a").healthy
    # A second fatal XID restarts the quiet period.
    tracker.record([XidEvent(gpu_uuid="GPU-a", xid=xid, timestamp=1059.0)])
    now[0] = 1100.0
    assert not tracker.health("GPU-a").healthy
    now[0] = 1119.0
    healed = tracker.health("GPU-a")
    assert healed.healthy and healed.reason == "Recovered" and healed.last_fatal is not None


class FlakyBackend(simulated.SimulatedBackend):
    """A simulated backend whose XID wait fails twice before it works."""

    failures = 2

    def wait_xid_events(self, timeout_s: float) -> list[models.XidEvent]:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("NVML_ERROR_UNKNOWN")
        return super().wait_xid_events(timeout_s)


def test_xid_loop_survives_failures_and_wakes_inventory(tmp_path: Path) -> None:
    backend = FlakyBackend({"cards": [{"memory": 1024}]}, node_name="n", device_dir=tmp_path / "dev",
                           inject_dir=tmp_path / "inject")
    tracker = health.HealthTracker(recovery_quiet_s=60)
    stop = threading.Event()
    woken = threading.Event()
    loop = threading.Thread(target=health.watch_xids, args=(backend, tracker),
                            kwargs={"stop": stop, "on_fatal": woken.set, "wait_s": 0.1})
    loop.start()
    try:
        uuid = backend.snapshot().cards[0].uuid
        simulated.inject(tmp_path / "inject", {"xid": {"card": 0, "code": 13}})
        simulated.inject(tmp_path / "inject", {"xid": {"card": 0, "code": 79}})
        assert woken.wait(20), "the loop never reported the fatal XID"
        assert tracker.counts() == {(uuid, 13): 1, (uuid, 79): 1}
        assert not tracker.health(uuid).healthy
    finally:
        stop.set()
        loop.join(timeout=10)
    assert not loop.is_alive()
