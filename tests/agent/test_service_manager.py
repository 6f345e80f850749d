"""The agent's side of systemd's notify protocol, over a real unix datagram socket as systemd
listens on: READY=1 only once ready, WATCHDOG=1 only while alive, STOPPING=1 at the end."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from elasticgpu.agent.service_manager import ServiceManager
from tests.agent.notify_listener import Listener, drain


@pytest.fixture(params=["path", "abstract"])
def listener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Listener]:
    address = str(tmp_path / "notify") if request.param == "path" else f"@elasticgpu-test-{uuid.uuid4().hex}"
    made = Listener(address)
    try:
        yield made
    finally:
        made.sock.close()


def test_the_environment_decides_what_is_on() -> None:
    assert not ServiceManager.from_environment({}).enabled
    on = ServiceManager.from_environment({"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "30000000"})
    assert on.enabled and on.watchdog_interval_s == 30.0
    mine = ServiceManager.from_environment({"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "2000000",
                                            "WATCHDOG_PID": str(os.getpid())})
    assert mine.watchdog_interval_s == 2.0
    # systemd set the watchdog for another process (our parent): not ours to ping.
    other = ServiceManager.from_environment({"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "2000000",
                                             "WATCHDOG_PID": str(os.getpid() + 1)})
    assert other.enabled and other.watchdog_interval_s is None
    assert ServiceManager.from_environment({"WATCHDOG_USEC": "2000000"}).watchdog_interval_s is None


def test_ready_once_ready_pings_only_while_alive_and_says_stopping(listener: Listener) -> None:
    manager = ServiceManager(address=listener.address, watchdog_interval_s=0.4)
    state = {"ready": "the CRI proxy is not running", "alive": None}
    stop = threading.Event()
    thread = threading.Thread(target=manager.run, args=(stop,), kwargs={
        "ready": lambda: state["ready"], "alive": lambda: state["alive"], "tick_s": 0.05}, daemon=True)
    thread.start()
    try:
        before = listener.until("WATCHDOG", timeout_s=5)
        assert not any("READY" in f for f in before)  # alive, but not ready: ping, no READY
        time.sleep(0.5)
        assert not any("READY" in f for f in drain(listener))

        state["ready"] = None
        seen = listener.until("READY", timeout_s=5)
        assert seen[-1]["READY"] == "1" and seen[-1]["STATUS"] == "serving"

        state["alive"] = "the agent's usage loop(s) ended"
        said = listener.until("STATUS", timeout_s=5)
        assert said[-1]["STATUS"] == "the agent's usage loop(s) ended"
        # Not alive: no ping for several watchdog periods (systemd would restart us).
        assert not any("WATCHDOG" in f for f in drain(listener, 1.2))

        state["alive"] = None
        listener.until("WATCHDOG", timeout_s=5)
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()
    last = listener.until("STOPPING", timeout_s=5)[-1]
    assert last["STOPPING"] == "1"


def test_a_check_that_raises_is_a_problem_not_a_crash(listener: Listener) -> None:
    manager = ServiceManager(address=listener.address, watchdog_interval_s=0.2)
    stop = threading.Event()

    def broken() -> str | None:
        raise RuntimeError("boom")

    thread = threading.Thread(target=manager.run, args=(stop,), kwargs={
        "ready": lambda: None, "alive": broken, "tick_s": 0.05}, daemon=True)
    thread.start()
    try:
        seen = listener.until("STATUS", timeout_s=5)
        statuses = [f["STATUS"] for f in seen if "STATUS" in f] + [
            f["STATUS"] for f in listener.until("STATUS", timeout_s=5) if "STATUS" in f]
        assert any("check failed" in s and "boom" in s for s in statuses), statuses
        assert thread.is_alive()
    finally:
        stop.set()
        thread.join(timeout=5)


def test_no_listener_is_not_a_failure(tmp_path: Path) -> None:
    manager = ServiceManager(address=str(tmp_path / "nobody"), watchdog_interval_s=None)
    assert manager.notify(READY="1") is False  # logged at debug, never raised
