"""Health: what each XID does to a card (informational, application, transient, reset-required), resets,
the agent end to end against the API server, and a loop that survives its backend's failures."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from elasticgpu.agent import errors, health
from elasticgpu.agent.discovery import APPLICATION_XIDS, CardReset, XidEvent, models, simulated
from elasticgpu.api import names, xids
from tests.agent.conftest import RunningAgent, wait_for
from tests.agent.objects import DESCRIPTION, condition, node_gpus


@pytest.mark.parametrize("xid", sorted(APPLICATION_XIDS))
def test_application_xids_are_recorded_not_fatal(xid: int) -> None:
    tracker = health.HealthTracker(recovery_quiet_s=60, clock=lambda: 1000.0)
    assert tracker.record([XidEvent(gpu_uuid="GPU-a", xid=xid, timestamp=1000.0)]) is False
    state = tracker.health("GPU-a")
    assert state.healthy and state.last_application is not None and state.last_application.xid == xid
    assert tracker.counts() == {("GPU-a", xid): 1}


@pytest.mark.parametrize("xid", sorted(xids.codes(xids.XidKind.INFORMATIONAL)))
def test_informational_xids_never_fail_a_card(xid: int) -> None:
    tracker = health.HealthTracker(recovery_quiet_s=60, clock=lambda: 1000.0)
    assert tracker.record([XidEvent(gpu_uuid="GPU-a", xid=xid, timestamp=1000.0)]) is False
    state = tracker.health("GPU-a")
    assert state.healthy and state.reason == "NoFatalXid"
    assert state.last_informational is not None and state.last_informational.xid == xid
    assert tracker.awaiting_reset() == set()


def test_the_table_follows_nvidia() -> None:
    """The classes the issue names, and the device plugin's default application list, stay as documented."""
    assert {63, 92} <= xids.codes(xids.XidKind.INFORMATIONAL)
    assert xids.codes(xids.XidKind.APPLICATION) == {13, 31, 43, 45, 68, 109} == APPLICATION_XIDS
    assert {48, 64, 74, 79, 95, 119, 120} <= xids.codes(xids.XidKind.RESET)
    assert xids.classify(94).kind is xids.XidKind.TRANSIENT
    unknown = xids.classify(4242)
    assert unknown.kind is xids.XidKind.RESET and unknown.action  # unknown: as fatal as the device plugin makes it


@pytest.mark.parametrize("xid", [48, 62, 64, 74, 79, 95, 119, 120, 4242])
def test_reset_required_xids_stay_unhealthy_until_the_reset(xid: int) -> None:
    now = [1000.0]
    tracker = health.HealthTracker(recovery_quiet_s=60, clock=lambda: now[0], boot_time=lambda: 1.0)
    assert tracker.record([XidEvent(gpu_uuid="GPU-a", xid=xid, timestamp=1000.0, message="note")]) is True
    sick = tracker.health("GPU-a")
    assert not sick.healthy and sick.reason == f"Xid{xid}" and "note" in sick.message and "reset" in sick.message
    assert tracker.health("GPU-b").healthy  # other cards are not touched
    assert tracker.awaiting_reset() == {"GPU-a"}
    now[0] = 1000.0 + 86400  # a day of quiet heals nothing: the card got no work to fail on
    assert not tracker.health("GPU-a").healthy
    # A reset seen before the XID (a stale one) clears nothing; one after it does.
    assert tracker.record_resets([CardReset(gpu_uuid="GPU-a", timestamp=999.0, how="old")]) is False
    assert tracker.record_resets([CardReset(gpu_uuid="GPU-b", timestamp=2000.0, how="other card")]) is False
    assert not tracker.health("GPU-a").healthy
    assert tracker.record_resets([CardReset(gpu_uuid="GPU-a", timestamp=2000.0, how="re-enumerated")]) is True
    healed = tracker.health("GPU-a")
    assert healed.healthy and healed.reason == "Reset" and "re-enumerated" in healed.message
    assert healed.last_fatal is not None and healed.last_fatal.xid == xid
    assert tracker.awaiting_reset() == set()


def test_transient_xids_recover_after_a_quiet_period() -> None:
    now = [1000.0]
    tracker = health.HealthTracker(recovery_quiet_s=60, clock=lambda: now[0])
    assert tracker.record([XidEvent(gpu_uuid="GPU-a", xid=94, timestamp=1000.0)]) is True
    sick = tracker.health("GPU-a")
    assert not sick.healthy and sick.reason == "Xid94" and "60 s" in sick.message
    assert tracker.awaiting_reset() == set()  # no reset needed
    now[0] = 1059.0
    assert not tracker.health("GPU-a").healthy
    tracker.record([XidEvent(gpu_uuid="GPU-a", xid=94, timestamp=1059.0)])  # another restarts the period
    now[0] = 1100.0
    assert not tracker.health("GPU-a").healthy
    now[0] = 1119.0
    healed = tracker.health("GPU-a")
    assert healed.healthy and healed.reason == "Recovered" and healed.last_fatal is not None


def test_restore_after_a_restart() -> None:
    tracker = health.HealthTracker(recovery_quiet_s=60, clock=lambda: 5000.0, boot_time=lambda: 3000.0)
    tracker.restore("GPU-reset", xid=79, timestamp=4000.0)  # after the boot: still needs its reset
    tracker.restore("GPU-rebooted", xid=79, timestamp=2000.0)  # before the boot: the reboot reset it
    tracker.restore("GPU-info", xid=63, timestamp=4000.0)  # an older agent failed the card for a row remap
    tracker.restore("GPU-transient", xid=94, timestamp=4990.0)
    assert [tracker.health(u).healthy for u in ("GPU-reset", "GPU-rebooted", "GPU-info", "GPU-transient")] == [
        False, True, True, False]
    assert tracker.awaiting_reset() == {"GPU-reset"}


def test_host_boot_time_reads_proc_stat(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  1 2 3\nbtime 1700000000\nprocesses 5\n")
    assert health.host_boot_time(stat) == 1700000000.0
    assert health.host_boot_time(tmp_path / "missing") is None


def test_simulated_resets_from_the_timeline_and_from_re_enumeration(tmp_path: Path) -> None:
    now = [0.0]
    description = {"cards": [{"memory": 1024, "count": 2}], "timeline": [
        {"at": 1, "reset": {"card": 0}}, {"at": 2, "vanish": {"card": 1}}, {"at": 3, "appear": {"card": 1}}]}
    backend = simulated.SimulatedBackend(description, node_name="n", device_dir=tmp_path / "dev",
                                         clock=lambda: now[0])
    uuid0, uuid1 = (c.uuid for c in backend.snapshot().cards)
    assert backend.card_resets({uuid0, uuid1}) == []
    now[0] = 1.0
    assert [(r.gpu_uuid, r.how) for r in backend.card_resets({uuid0, uuid1})] == [(uuid0, "simulated reset")]
    now[0] = 3.0
    assert backend.card_resets({uuid0}) == []  # card 1 came back, but it awaits no reset: nothing to report
    with pytest.raises(errors.SimulationInvalid, match="names no card"):
        simulated.SimulatedBackend({"cards": [{"memory": 1}], "timeline": [{"at": 1, "reset": {"card": 7}}]},
                                   node_name="n", device_dir=tmp_path / "dev2")


class FlakyBackend(simulated.SimulatedBackend):
    """A simulated backend whose XID wait fails twice before it works."""

    failures = 2

    def wait_xid_events(self, timeout_s: float) -> list[models.XidEvent]:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("NVML_ERROR_UNKNOWN")
        return super().wait_xid_events(timeout_s)


def test_xid_loop_survives_failures_and_wakes_inventory_for_xids_and_resets(tmp_path: Path) -> None:
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
        woken.clear()
        simulated.inject(tmp_path / "inject", {"reset": {"card": 0}})
        assert woken.wait(20), "the loop never reported the reset"
        assert tracker.health(uuid).reason == "Reset"
    finally:
        stop.set()
        loop.join(timeout=10)
    assert not loop.is_alive()


def test_the_agent_fails_a_card_only_as_its_xid_says(
    api_client: client.ApiClient, node_name: str, start_agent: Callable[..., RunningAgent]
) -> None:
    """The real agent (simulated backend, quiet period 1 s) against the API server: an informational XID
    leaves its card Healthy; a reset-required one keeps its card Unhealthy long past the quiet period
    (while a transient XID on the other card recovers in it) and only the reset brings it back."""
    agent = start_agent(node_name, DESCRIPTION, "--recovery-quiet-s", "1")
    first, second = (names.gpu_object_name(simulated.simulated_uuid(node_name, i)) for i in range(2))

    def gpu(name: str) -> dict[str, Any]:
        assert agent.process.poll() is None, agent.log()
        return node_gpus(api_client, node_name).get(name) or {}

    def health_of(name: str) -> tuple[str, str] | None:
        found = condition(gpu(name), "Healthy")
        return None if found is None else (found["status"], found["reason"])

    wait_for("both cards Healthy", lambda: health_of(first) == health_of(second) == ("True", "NoFatalXid"))

    # Informational (row remap recorded, corrected-ECC rate): counted, the card stays Healthy. The XID 13
    # injected after them is shown, which proves the agent took them in before it.
    simulated.inject(agent.inject_dir, [{"xid": {"card": 0, "code": 63}}, {"xid": {"card": 0, "code": 92}},
                                        {"xid": {"card": 0, "code": 13}}])
    wait_for("the application XID shown", lambda: (c := condition(gpu(first), "ApplicationXid")) and
             c["reason"] == "Xid13", timeout=20)
    assert health_of(first) == ("True", "NoFatalXid") and gpu(first)["status"]["health"] == "Healthy"

    # Reset-required on the first card, transient on the second.
    simulated.inject(agent.inject_dir, [{"xid": {"card": 0, "code": 79, "message": "fell off the bus"}},
                                        {"xid": {"card": 1, "code": 94}}])
    wait_for("first card Unhealthy Xid79", lambda: health_of(first) == ("False", "Xid79"), timeout=20)
    sick = condition(gpu(first), "Healthy")
    assert sick is not None and "fell off the bus" in sick["message"] and "reset" in sick["message"]
    wait_for("second card recovered after its quiet period", lambda: health_of(second) == ("True", "Recovered"),
             timeout=20)
    seen_unhealthy = time.time()
    beat = condition(gpu(first), "Heartbeat")
    assert beat is not None

    def later_heartbeat() -> bool:
        now = condition(gpu(first), "Heartbeat")
        return now is not None and now["lastTransitionTime"] > beat["lastTransitionTime"]

    # Well past the quiet period, with heartbeats written since: still Unhealthy.
    wait_for("a newer heartbeat", later_heartbeat, timeout=20)
    time.sleep(max(0.0, seen_unhealthy + 3 - time.time()))
    wait_for("another heartbeat", later_heartbeat, timeout=20)
    assert health_of(first) == ("False", "Xid79") and gpu(first)["status"]["health"] == "Unhealthy"

    # The reset: Healthy again, reason Reset.
    simulated.inject(agent.inject_dir, {"reset": {"card": 0}})
    wait_for("first card Healthy after the reset", lambda: health_of(first) == ("True", "Reset"), timeout=20)
    assert gpu(first)["status"]["health"] == "Healthy"
    assert "Traceback" not in agent.log()
