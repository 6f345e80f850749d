"""Discovery: the simulated backend's file, timeline, injection and stand-in devices; NVML's absence."""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path

import pytest
import yaml

from elasticgpu.agent import discovery, errors
from elasticgpu.agent.discovery import nvml, simulated

NODE = "node-a"


def write(tmp_path: Path, description: dict[str, object]) -> Path:
    path = tmp_path / "sim.yaml"
    path.write_text(yaml.safe_dump(description))
    return path


def open_sim(tmp_path: Path, description: dict[str, object]) -> simulated.SimulatedBackend:
    backend = discovery.open_backend(
        "simulated", node_name=NODE, simulation_file=write(tmp_path, description),
        device_dir=tmp_path / "dev", inject_dir=tmp_path / "inject",
    )
    assert isinstance(backend, simulated.SimulatedBackend)
    return backend


TWO_CARDS = {
    "driver": {"version": "550.54.15", "cuda": "12.4"},
    "cards": [
        {"model": "NVIDIA A100-SXM4-80GB", "memory": "80Gi", "numa": 0, "links": [1], "count": 2},
        {"model": "NVIDIA T4", "memory": 15360, "numa": 1, "uuid": "GPU-T4-0001", "minor": 7},
    ],
}


def test_cards_from_yaml(tmp_path: Path) -> None:
    backend = open_sim(tmp_path, TWO_CARDS)
    snap = backend.snapshot()
    assert [c.index for c in snap.cards] == [0, 1, 2]
    a0, a1, t4 = snap.cards
    assert a0.memory_mib == 81920 and t4.memory_mib == 15360
    assert a0.uuid == simulated.simulated_uuid(NODE, 0) != simulated.simulated_uuid("node-b", 0)
    assert a0.links == (a1.uuid,) and a1.links == ()  # links as written: card 1 names none
    assert t4.uuid == "GPU-T4-0001" and t4.minor == 7 and t4.numa == 1
    assert snap.driver.driver_version == "550.54.15" and snap.driver.cuda_version == "12.4"


def test_stand_in_devices_are_char_devices_of_dev_null(tmp_path: Path) -> None:
    backend = open_sim(tmp_path, TWO_CARDS)
    null = os.stat("/dev/null").st_rdev
    for card in backend.snapshot().cards:
        assert card.device_path == str(tmp_path / "dev" / f"nvidia{card.minor}")
        info = os.stat(card.device_path)
        assert stat.S_ISCHR(info.st_mode) and info.st_rdev == null
    assert all(os.path.exists(p) for p in backend.control_device_paths())
    # Opening the stand-in behaves like /dev/null.
    with open(backend.snapshot().cards[0].device_path, "rb") as device:
        assert device.read() == b""


@pytest.mark.parametrize(
    ("description", "needle"),
    [
        ({"cards": []}, "cards: must be a non-empty list"),
        ({"cards": [{"model": "x"}]}, "cards[0].memory: is required"),
        ({"cards": [{"memory": "lots"}]}, "cards[0].memory"),
        ({"cards": [{"memory": 1, "links": [5]}]}, "cards[0].links: 5 names no card"),
        ({"cards": [{"memory": 1, "minor": 0}, {"memory": 1, "minor": 0}]}, "same minor number"),
        ({"cards": [{"memory": 1}], "timeline": [{"at": 1, "xid": {"card": 3, "code": 79}}]}, "names no card"),
        ({"cards": [{"memory": 1}], "timeline": [{"xid": {"card": 0, "code": 79}}]}, "timeline[0].at"),
    ],
)
def test_invalid_files_name_the_field(tmp_path: Path, description: dict[str, object], needle: str) -> None:
    with pytest.raises(errors.SimulationInvalid) as caught:
        open_sim(tmp_path, description)
    assert needle in str(caught.value) and str(tmp_path / "sim.yaml") in str(caught.value)


def test_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(errors.SimulationInvalid, match="cannot be read"):
        discovery.open_backend("simulated", node_name=NODE, simulation_file=tmp_path / "nope.yaml",
                               device_dir=tmp_path / "dev")


def test_timeline_plays_in_order(tmp_path: Path) -> None:
    now = [0.0]
    description = dict(TWO_CARDS, timeline=[
        {"at": 1, "process": {"card": 0, "pid": 4242, "memory": "2Gi", "sm": 30}},
        {"at": 2, "xid": {"card": 1, "code": 79, "message": "fell off the bus"}},
        {"at": 3, "process": {"card": 0, "pid": 4242, "gone": True}},
        {"at": 4, "vanish": {"card": 2}},
        {"at": 5, "appear": {"card": "GPU-T4-0001"}},
    ])
    backend = simulated.SimulatedBackend(description, node_name=NODE, device_dir=tmp_path / "dev",
                                         clock=lambda: now[0])
    uuids = [c.uuid for c in backend.snapshot().cards]
    assert backend.process_usage() == []
    now[0] = 1.0
    (usage,) = backend.process_usage()
    assert (usage.gpu_uuid, usage.pid, usage.memory_mib, usage.sm_percent) == (uuids[0], 4242, 2048, 30)
    now[0] = 2.0
    (event,) = backend.wait_xid_events(0)
    assert (event.gpu_uuid, event.xid, event.fatal, event.message) == (uuids[1], 79, True, "fell off the bus")
    assert backend.wait_xid_events(0) == []
    now[0] = 3.0
    assert backend.process_usage() == []
    now[0] = 4.0
    assert [c.uuid for c in backend.snapshot().cards] == uuids[:2]
    now[0] = 5.0
    assert [c.uuid for c in backend.snapshot().cards] == uuids


def test_injected_entries_act_once_while_waiting(tmp_path: Path) -> None:
    backend = open_sim(tmp_path, TWO_CARDS)
    uuid0 = backend.snapshot().cards[0].uuid
    simulated.inject(tmp_path / "inject", {"process": {"card": 0, "pid": os.getpid(), "memory": 512}})
    assert [(u.pid, u.memory_mib) for u in backend.process_usage()] == [(os.getpid(), 512)]
    assert list((tmp_path / "inject").iterdir()) == []
    # An XID injected by another thread wakes a waiting caller well before its timeout.
    timer = threading.Timer(0.2, simulated.inject, (tmp_path / "inject", {"xid": {"card": uuid0, "code": 13}}))
    timer.start()
    started = time.monotonic()
    events = backend.wait_xid_events(10)
    assert time.monotonic() - started < 5
    assert [(e.gpu_uuid, e.xid, e.fatal) for e in events] == [(uuid0, 13, False)]
    # A bad entry is logged and dropped; the backend goes on.
    simulated.inject(tmp_path / "inject", {"xid": {"card": 99, "code": 79}})
    assert backend.wait_xid_events(0) == []
    assert list((tmp_path / "inject").iterdir()) == []


def test_missing_nvml_says_what_and_how_to_simulate() -> None:
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(errors.NvmlUnavailable) as caught:
        discovery.open_backend("nvml", node_name=NODE)
    text = str(caught.value)
    assert "libnvidia-ml.so.1" in text and "elasticgpu agent run --backend simulated" in text


def test_nvml_helpers() -> None:
    assert nvml.sysfs_bus_id("00000000:07:00.0") == "0000:07:00.0"
    assert nvml.sysfs_bus_id("00000001:AB:00.0") == "0001:ab:00.0"
    assert nvml.cuda_version_text(12040) == "12.4" and nvml.cuda_version_text(11080) == "11.8"


def test_numa_node_from_sysfs(tmp_path: Path) -> None:
    device = tmp_path / "bus/pci/devices/0000:07:00.0"
    device.mkdir(parents=True)
    (device / "numa_node").write_text("1\n")
    assert nvml.numa_node_of("0000:07:00.0", tmp_path) == 1
    (device / "numa_node").write_text("-1\n")
    assert nvml.numa_node_of("0000:07:00.0", tmp_path) is None
    assert nvml.numa_node_of("0000:99:00.0", tmp_path) is None


def test_agent_without_nvml_says_so_once_and_keeps_running(tmp_path: Path) -> None:
    """Without NVML the agent does not exit (issue 15: kubelet needs its CRI socket for every pod): it
    says what is missing once, in one line with no stack trace, retries in the background, and stops
    cleanly on SIGTERM."""
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA driver")
    import subprocess
    import sys
    import time

    log = tmp_path / "agent.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "elasticgpu", "agent", "run", "--backend", "nvml", "--node-name", NODE,
             "--ledger-url", f"sqlite:///{tmp_path / 'ledger.db'}", "--metrics-port", "0",
             "--cri-listen", str(tmp_path / "cri.sock"), "--cri-upstream", str(tmp_path / "no-runtime.sock"),
             "--kubeconfig", str(tmp_path / "no-kubeconfig")],
            stdout=out, stderr=subprocess.STDOUT, text=True, cwd=Path(__file__).resolve().parents[2],
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while "libnvidia-ml.so.1" not in log.read_text() and time.monotonic() < deadline:
            assert process.poll() is None, log.read_text()
            time.sleep(0.1)
        time.sleep(2)  # several retries
        assert process.poll() is None, log.read_text()
        assert (tmp_path / "cri.sock").is_socket()
    finally:
        process.terminate()
        assert process.wait(30) == 0
    text = log.read_text()
    assert "Traceback" not in text
    lines = [line for line in text.splitlines() if "libnvidia-ml.so.1" in line]
    assert len(lines) == 1 and "level=WARNING" in lines[0] and "--backend simulated" in lines[0], text


def test_one_injected_file_may_carry_several_entries(tmp_path: Path) -> None:
    backend = open_sim(tmp_path, TWO_CARDS)
    simulated.inject(tmp_path / "inject", [
        {"process": {"card": 0, "pid": 10, "memory": 100}},
        {"process": {"card": 1, "pid": 11, "memory": 200}},
        {"process": {"card": 0, "pid": 10, "memory": 150}},  # later entries win, in order
    ])
    assert sorted((u.pid, u.memory_mib) for u in backend.process_usage()) == [(10, 150), (11, 200)]
