"""The NVML backend's translation, against nvidia-ml-py's real names, errors and constants.

No GPU here: the functions of the driver are played by a small stand-in that answers like NVML
does (its real NVMLError classes, its real constants), so every path of `nvml.py` runs: NVLink
peers through an NVSwitch, a card that stops answering, a process whose memory NVML hides, XID
events. On a machine with NVIDIA cards, `elasticgpu agent run --backend nvml` is the real check.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml  # type: ignore[import-untyped]

from elasticgpu.agent.discovery import nvml

SOURCE = (Path(nvml.__file__)).read_text()


def test_every_nvml_name_the_backend_uses_exists_in_nvidia_ml_py() -> None:
    used = sorted(set(re.findall(r"nvml\.(\w+)", SOURCE)))
    assert len(used) > 20
    assert [name for name in used if not hasattr(pynvml, name)] == []


class Driver:
    """NVML as a node with two A100s linked to each other and an NVSwitch, and a third card that fell off."""

    def __init__(self) -> None:
        for name in dir(pynvml):  # the real constants and error classes
            if name.startswith(("NVML_", "NVMLError", "nvmlEventType")):
                setattr(self, name, getattr(pynvml, name))
        self.NVMLError = pynvml.NVMLError
        self.events = [SimpleNamespace(device="h0", eventData=79)]
        self.buses = {"h0": "00000000:07:00.0", "h1": "00000000:0A:00.0", "h2": "00000000:0B:00.0"}

    def _fail(self, code: int) -> None:
        raise pynvml.NVMLError(code)

    def nvmlDeviceGetCount(self) -> int:
        return 3

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"h{index}"

    def nvmlDeviceGetUUID(self, handle: str) -> str:
        if handle == "h2":
            self._fail(pynvml.NVML_ERROR_GPU_IS_LOST)
        return f"GPU-{handle}"

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> Any:
        return SimpleNamespace(total=80 * 1024**3)

    def nvmlDeviceGetPciInfo(self, handle: str) -> Any:
        return SimpleNamespace(busId=self.buses[handle].encode())  # old versions answer bytes

    def nvmlDeviceGetMinorNumber(self, handle: str) -> int:
        return int(handle[1:]) + 4

    def nvmlDeviceGetMigMode(self, handle: str) -> tuple[int, int]:
        if handle == "h1":
            self._fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return (pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE)

    def nvmlDeviceGetName(self, handle: str) -> str:
        return "NVIDIA A100-SXM4-80GB"

    def nvmlDeviceGetNvLinkState(self, handle: str, link: int) -> int:
        if link >= 3:
            self._fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_DISABLED if link == 2 else pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: str, link: int) -> Any:
        other = "h1" if handle == "h0" else "h0"
        bus = self.buses[other] if link == 0 else "00000000:99:00.0"  # link 1: the NVSwitch
        return SimpleNamespace(busId=bus)

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return 12040

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[Any]:
        if handle != "h0":
            return []
        return [SimpleNamespace(pid=100, usedGpuMemory=2 * 1024**3), SimpleNamespace(pid=101, usedGpuMemory=None)]

    def nvmlDeviceGetProcessUtilization(self, handle: str, since: int) -> list[Any]:
        if since >= 5:
            self._fail(pynvml.NVML_ERROR_NOT_FOUND)  # no newer samples
        return [SimpleNamespace(pid=100, smUtil=40, timeStamp=5)]

    def nvmlEventSetCreate(self) -> str:
        return "set"

    def nvmlDeviceRegisterEvents(self, handle: str, types: int, event_set: str) -> None:
        if handle == "h1":
            self._fail(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> Any:
        if self.events:
            return self.events.pop(0)
        self._fail(pynvml.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, event_set: str) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass


def test_snapshot_translates_cards_links_and_versions() -> None:
    backend = nvml.NvmlBackend(Driver())
    snapshot = backend.snapshot()
    assert [c.uuid for c in snapshot.cards] == ["GPU-h0", "GPU-h1"]  # the lost card is left out
    first, second = snapshot.cards
    assert (first.minor, first.device_path, first.memory_mib, first.pci_bus_id) == (4, "/dev/nvidia4", 81920,
                                                                                    "0000:07:00.0")
    assert first.mig_enabled and not second.mig_enabled  # MIG unsupported reads as off
    assert first.links == ("GPU-h1",) and second.links == ("GPU-h0",)  # the NVSwitch is no card
    assert (snapshot.driver.driver_version, snapshot.driver.cuda_version) == ("550.54.15", "12.4")


def test_process_usage_and_xid_events() -> None:
    backend = nvml.NvmlBackend(Driver())
    usage = backend.process_usage()
    assert [(u.gpu_uuid, u.pid, u.memory_mib, u.sm_percent) for u in usage] == [
        ("GPU-h0", 100, 2048, 40), ("GPU-h0", 101, 0, None)]
    assert [u.sm_percent for u in backend.process_usage()] == [None, None]  # no newer samples
    (event,) = backend.wait_xid_events(0.01)
    assert (event.gpu_uuid, event.xid, event.fatal) == ("GPU-h0", 79, True)
    assert backend.wait_xid_events(0.01) == []
    backend.close()


class ResettingDriver(Driver):
    """The stand-in with what reset evidence reads: handles by uuid, the recovery-action field, remapped rows."""

    def __init__(self) -> None:
        super().__init__()
        self.lost: set[str] = set()
        self.action = {"h0": pynvml.NVML_GPU_RECOVERY_ACTION_NONE, "h1": pynvml.NVML_GPU_RECOVERY_ACTION_NONE}
        self.remap_pending = {"h0": 0, "h1": 0}

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        handle = uuid.removeprefix("GPU-")
        if handle in self.lost:
            self._fail(pynvml.NVML_ERROR_GPU_IS_LOST)
        return handle

    def nvmlDeviceGetFieldValues(self, handle: str, fields: list[int]) -> list[Any]:
        assert fields == [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]
        return [SimpleNamespace(nvmlReturn=pynvml.NVML_SUCCESS, value=SimpleNamespace(uiVal=self.action[handle]))]

    def nvmlDeviceGetRemappedRows(self, handle: str) -> tuple[int, int, int, int]:
        return (0, 1, self.remap_pending[handle], 0)


def test_card_resets_need_evidence_from_nvml() -> None:
    driver = ResettingDriver()
    backend = nvml.NvmlBackend(driver)
    waiting = {"GPU-h0", "GPU-h1"}
    # Nothing pending, nothing lost: no evidence of a reset, however often asked.
    assert backend.card_resets(waiting) == backend.card_resets(waiting) == []
    # h0 falls off the bus (stops answering), h1's driver asks for a reset and a row remap is pending.
    driver.lost.add("h0")
    driver.action["h1"] = pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    driver.remap_pending["h1"] = 1
    assert backend.card_resets(waiting) == []
    # h0 answers again (re-enumerated after a reset or reboot); h1's pending action and remap clear.
    driver.lost.clear()
    driver.action["h1"] = pynvml.NVML_GPU_RECOVERY_ACTION_NONE
    driver.remap_pending["h1"] = 0
    resets = {r.gpu_uuid: r.how for r in backend.card_resets(waiting)}
    assert resets == {"GPU-h0": "re-enumerated", "GPU-h1": "recovery action and row remap cleared"}
    assert backend.card_resets(waiting) == []  # evidence acts once
    # A card no longer waiting is forgotten: its old evidence never counts for a later XID.
    driver.action["h1"] = pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT
    assert backend.card_resets({"GPU-h1"}) == []
    assert backend.card_resets(set()) == []
    driver.action["h1"] = pynvml.NVML_GPU_RECOVERY_ACTION_NONE
    assert backend.card_resets({"GPU-h1"}) == []
