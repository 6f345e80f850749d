"""The NVML backend: the only module of elasticgpu that talks to NVML (nvidia-ml-py).

Every NVML call goes through here and every NVMLError becomes a value or an `AgentError`, so a
card that answers badly (an old driver without NVLink queries, a card in MIG mode that has no
per-process utilisation) costs a field, never the agent.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from elasticgpu.agent import errors
from elasticgpu.agent.discovery import models, pci
from elasticgpu.agent.discovery.mig import MigInstanceInfo, MigProfileInfo
from elasticgpu.agent.discovery.nvml_mig import NvmlMig, mig_error

logger = logging.getLogger(__name__)

_SIMULATED_HINT = (
    "To run the agent without NVIDIA GPUs (a test cluster, a laptop), describe cards in a YAML file and run"
    " `elasticgpu agent run --backend simulated --simulation FILE` (see `elasticgpu agent run --help`)."
)
# Device nodes that every CUDA container needs besides its cards; only those present are returned.
_CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")


def _text(value: str | bytes) -> str:
    # nvidia-ml-py returns str on recent versions and bytes on old ones.
    return value.decode() if isinstance(value, bytes) else value


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """NVML's bus id (`00000000:07:00.0`, 8 hex digits of domain, upper case) in sysfs form (`0000:07:00.0`)."""
    domain, _, rest = nvml_bus_id.strip().lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else nvml_bus_id.lower()


def numa_node_of(bus_id: str, sysfs_root: Path = Path("/sys")) -> int | None:
    """NUMA node of a PCI device from `/sys/bus/pci/devices/<bus id>/numa_node`; None when unknown (-1 or absent)."""
    try:
        value = int((sysfs_root / "bus/pci/devices" / bus_id / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def cuda_version_text(version: int) -> str:
    """NVML's CUDA version integer (12040) as text (`12.4`)."""
    return f"{version // 1000}.{(version % 1000) // 10}"


class NvmlBackend:
    """Discovery through NVML. Create with `NvmlBackend.open()`."""

    name = "nvml"

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._lock = threading.Lock()
        self._event_set: Any = None
        self._event_handles: dict[str, Any] = {}
        # Per-card timestamp of the last process-utilisation sample read, so each call asks only for newer samples.
        self._last_sample_us: dict[str, int] = {}
        # Reset evidence per card awaiting a reset: the card stopped answering (re-enumeration pending), or a
        # recovery action / row remap was seen pending (its clearing is the reset).
        self._lost: set[str] = set()
        self._pending: dict[str, set[str]] = {}
        self._mig = NvmlMig(nvml)

    @classmethod
    def open(cls) -> NvmlBackend:
        """Load and initialise NVML; raises `NvmlUnavailable` saying what is missing and how to run without it."""
        try:
            import pynvml  # type: ignore[import-untyped]
        except ImportError as e:  # the dependency is declared; this is a broken installation
            raise errors.NvmlUnavailable(
                f"the Python package nvidia-ml-py is not installed ({e}); reinstall elasticgpu. {_SIMULATED_HINT}"
            ) from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            if getattr(e, "value", None) == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
                what = (
                    "the NVIDIA driver's library libnvidia-ml.so.1 was not found: this node has no NVIDIA driver,"
                    " or the agent's container does not see it (run it with the NVIDIA container runtime, or mount"
                    " the driver's libraries and add them to LD_LIBRARY_PATH)"
                )
            elif getattr(e, "value", None) == pynvml.NVML_ERROR_DRIVER_NOT_LOADED:
                what = (
                    "libnvidia-ml.so.1 was found but the NVIDIA kernel driver is not loaded"
                    " (check `lsmod | grep nvidia`)"
                )
            else:
                what = f"NVML failed to initialise: {e}"
            raise errors.NvmlUnavailable(f"NVML cannot be used: {what}. {_SIMULATED_HINT}") from None
        return cls(pynvml)

    def close(self) -> None:
        """Free the event set and shut NVML down."""
        nvml = self._nvml
        with self._lock:
            if self._event_set is not None:
                self._quiet(nvml.nvmlEventSetFree, self._event_set)
                self._event_set = None
            self._quiet(nvml.nvmlShutdown)

    def _quiet(self, function: Any, *args: Any, default: Any = None) -> Any:
        """Call an NVML function; an NVMLError (not supported, no permission, old driver) gives `default`."""
        try:
            return function(*args)
        except self._nvml.NVMLError as e:
            logger.debug("NVML %s failed: %s", getattr(function, "__name__", function), e)
            return default

    def snapshot(self) -> models.Snapshot:
        """Every card that answers NVML now, with NUMA node, MIG mode and NVLink peers."""
        nvml = self._nvml
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as e:
            raise errors.DiscoveryError(f"NVML could not count the cards: {e}") from None
        raw: list[dict[str, Any]] = []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                bus_id = sysfs_bus_id(_text(nvml.nvmlDeviceGetPciInfo(handle).busId))
                minor = int(nvml.nvmlDeviceGetMinorNumber(handle))
            except nvml.NVMLError as e:
                # A card that does not answer these basic queries is as good as gone (e.g. XID 79): leave it out,
                # so inventory marks it Vanished instead of publishing a half-known card.
                logger.warning("card at NVML index %d does not answer, left out: %s", index, e)
                continue
            mig = self._quiet(nvml.nvmlDeviceGetMigMode, handle, default=(0, 0))
            raw.append(
                {
                    "handle": handle,
                    "index": index,
                    "uuid": uuid,
                    "model": _text(self._quiet(nvml.nvmlDeviceGetName, handle, default="")),
                    "memory_mib": int(memory.total) // (1024 * 1024),
                    "minor": minor,
                    "bus_id": bus_id,
                    "mig": bool(mig and mig[0] == nvml.NVML_DEVICE_MIG_ENABLE),
                }
            )
        by_bus = {entry["bus_id"]: entry["uuid"] for entry in raw}
        nics = pci.rdma_nics_by_root()
        roots = {entry["bus_id"]: pci.pcie_root_of(entry["bus_id"]) for entry in raw}
        cards = tuple(
            models.Card(
                index=entry["index"],
                uuid=entry["uuid"],
                model=entry["model"],
                memory_mib=entry["memory_mib"],
                minor=entry["minor"],
                device_path=f"/dev/nvidia{entry['minor']}",
                numa=numa_node_of(entry["bus_id"]),
                pci_bus_id=entry["bus_id"],
                mig_enabled=entry["mig"],
                links=self._nvlink_peers(entry["handle"], by_bus, own=entry["uuid"]),
                pcie_root=roots[entry["bus_id"]],
                nics=nics.get(roots[entry["bus_id"]], ()) if roots[entry["bus_id"]] else (),
            )
            for entry in raw
        )
        driver = _text(self._quiet(nvml.nvmlSystemGetDriverVersion, default=""))
        cuda = self._quiet(nvml.nvmlSystemGetCudaDriverVersion_v2, default=None)
        if cuda is None:
            cuda = self._quiet(nvml.nvmlSystemGetCudaDriverVersion, default=None)
        return models.Snapshot(
            cards=cards,
            driver=models.DriverInfo(driver_version=driver, cuda_version=cuda_version_text(cuda) if cuda else ""),
        )

    def _nvlink_peers(self, handle: Any, by_bus: dict[str, str], *, own: str) -> tuple[str, ...]:
        nvml = self._nvml
        peers: set[str] = set()
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            state = self._quiet(nvml.nvmlDeviceGetNvLinkState, handle, link)
            if state is None:
                break  # no NVLink on this card (or none beyond this link): stop asking
            if state != nvml.NVML_FEATURE_ENABLED:
                continue
            remote = self._quiet(nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
            if remote is None:
                continue
            peer = by_bus.get(sysfs_bus_id(_text(remote.busId)))
            if peer and peer != own:  # an NVSwitch's bus id is no card of ours
                peers.add(peer)
        return tuple(sorted(peers))

    def process_usage(self) -> list[models.ProcessUsage]:
        """Memory of every compute process per card, and its SM share from NVML's utilisation samples."""
        nvml = self._nvml
        usage: list[models.ProcessUsage] = []
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as e:
            raise errors.DiscoveryError(f"NVML could not count the cards: {e}") from None
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            except nvml.NVMLError:
                continue
            processes = self._quiet(nvml.nvmlDeviceGetComputeRunningProcesses, handle, default=[]) or []
            sm = self._sm_by_pid(handle, uuid)
            for process in processes:
                used = process.usedGpuMemory
                # None/NVML_VALUE_NOT_AVAILABLE when the driver hides it (e.g. under MIG without privileges).
                memory_mib = int(used) // (1024 * 1024) if isinstance(used, int) and used < (1 << 62) else 0
                usage.append(
                    models.ProcessUsage(gpu_uuid=uuid, pid=int(process.pid), memory_mib=memory_mib,
                                        sm_percent=sm.get(int(process.pid)))
                )
        return usage

    def _sm_by_pid(self, handle: Any, uuid: str) -> dict[int, int]:
        nvml = self._nvml
        since = self._last_sample_us.get(uuid, 0)
        samples = self._quiet(nvml.nvmlDeviceGetProcessUtilization, handle, since, default=None)
        if not samples:
            return {}
        result: dict[int, int] = {}
        newest = since
        for sample in samples:
            result[int(sample.pid)] = int(sample.smUtil)
            newest = max(newest, int(sample.timeStamp))
        self._last_sample_us[uuid] = newest
        return result

    def wait_xid_events(self, timeout_s: float) -> list[models.XidEvent]:
        """XID critical errors of every card, waiting up to `timeout_s` for the first, then draining the rest."""
        nvml = self._nvml
        with self._lock:
            if self._event_set is None:
                self._event_set = self._register_xid_events()
        if self._event_set is None:
            time.sleep(timeout_s)  # no card supports events: nothing to wait for, but keep the caller's pace
            return []
        events: list[models.XidEvent] = []
        wait_ms = max(0, int(timeout_s * 1000))
        while True:
            try:
                data = nvml.nvmlEventSetWait_v2(self._event_set, wait_ms)
            except nvml.NVMLError as e:
                if getattr(e, "value", None) != nvml.NVML_ERROR_TIMEOUT:
                    logger.warning("waiting for NVML events failed: %s", e)
                return events
            uuid = _text(self._quiet(nvml.nvmlDeviceGetUUID, data.device, default="")) if data.device else ""
            events.append(models.XidEvent(gpu_uuid=uuid, xid=int(data.eventData), timestamp=time.time()))
            wait_ms = 0  # drain what is queued, then return

    def _register_xid_events(self) -> Any:
        nvml = self._nvml
        event_set = self._quiet(nvml.nvmlEventSetCreate)
        if event_set is None:
            return None
        registered = 0
        for index in range(self._quiet(nvml.nvmlDeviceGetCount, default=0)):
            handle = self._quiet(nvml.nvmlDeviceGetHandleByIndex, index)
            if handle is None:
                continue
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
                registered += 1
            except nvml.NVMLError as e:
                logger.warning("card %d cannot report XID events (%s): its health is not watched", index, e)
        if not registered:
            self._quiet(nvml.nvmlEventSetFree, event_set)
            return None
        return event_set

    def card_resets(self, waiting: Collection[str]) -> list[models.CardReset]:
        """Cards among `waiting` that NVML shows reset: re-enumerated after they stopped answering, or a
        pending recovery action or row remap (set by the XID) cleared."""
        nvml = self._nvml
        for forgotten in (set(self._pending) | self._lost) - set(waiting):
            self._pending.pop(forgotten, None)
            self._lost.discard(forgotten)
        resets: list[models.CardReset] = []
        for uuid in waiting:
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
                nvml.nvmlDeviceGetMemoryInfo(handle)  # a card fallen off the bus keeps its handle but answers no query
            except nvml.NVMLError:
                self._lost.add(uuid)
                continue
            if uuid in self._lost:
                self._lost.discard(uuid)
                self._pending.pop(uuid, None)
                resets.append(models.CardReset(gpu_uuid=uuid, timestamp=time.time(), how="re-enumerated"))
                continue
            pending = self._pending_flags(handle)
            seen = self._pending.setdefault(uuid, set())
            cleared = sorted(seen - pending)
            seen |= pending
            if cleared:
                self._pending.pop(uuid, None)
                resets.append(models.CardReset(gpu_uuid=uuid, timestamp=time.time(),
                                               how=f"{' and '.join(cleared)} cleared"))
        return resets

    def _pending_flags(self, handle: Any) -> set[str]:
        """What NVML says is pending until the next reset, among what this driver can tell."""
        nvml = self._nvml
        flags: set[str] = set()
        values = self._quiet(nvml.nvmlDeviceGetFieldValues, handle, [nvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
        if values:
            value = values[0]
            if value.nvmlReturn == nvml.NVML_SUCCESS and int(value.value.uiVal) != nvml.NVML_GPU_RECOVERY_ACTION_NONE:
                flags.add("recovery action")
        remapped = self._quiet(nvml.nvmlDeviceGetRemappedRows, handle)  # (corrected, uncorrected, pending, failed)
        if remapped and remapped[2]:
            flags.add("row remap")
        return flags

    # MIG (discovery.mig.MigControl; the calls are in nvml_mig.py) ------------------------------------------

    def _card(self, card_uuid: str) -> Any:
        try:
            return self._nvml.nvmlDeviceGetHandleByUUID(card_uuid)
        except self._nvml.NVMLError as e:
            raise mig_error(e, f"card {card_uuid}", self._nvml) from None

    def mig_profiles(self, card_uuid: str) -> list[MigProfileInfo]:
        """The card's MIG profiles and starts; `MigNotEnabled` when not in MIG mode."""
        with self._lock:
            return self._mig.profiles(self._card(card_uuid), card_uuid)

    def mig_instances(self, card_uuid: str) -> list[MigInstanceInfo]:
        """The card's MIG instances."""
        with self._lock:
            handle = self._card(card_uuid)
            return self._mig.instances(handle, card_uuid, int(self._nvml.nvmlDeviceGetMinorNumber(handle)))

    def create_mig_instance(self, card_uuid: str, *, profile: str, start: int) -> MigInstanceInfo:
        """Create a MIG instance (and its compute instance), with NVML's errors as the agent's."""
        with self._lock:
            handle = self._card(card_uuid)
            gpu_instance_id = self._mig.create(handle, card_uuid, profile=profile, start=start)
            minor = int(self._nvml.nvmlDeviceGetMinorNumber(handle))
            for instance in self._mig.instances(handle, card_uuid, minor):
                if instance.gpu_instance_id == gpu_instance_id:
                    return instance
        raise errors.MigNotFound(f"card {card_uuid}: GPU instance {gpu_instance_id} vanished right after its creation")

    def destroy_mig_instance(self, card_uuid: str, gpu_instance_id: int) -> None:
        """Destroy a MIG instance; `MigInUse` while a process runs on it."""
        with self._lock:
            self._mig.destroy(self._card(card_uuid), card_uuid, gpu_instance_id)

    def driver_root(self) -> str | None:
        """None: the driver is where the agent's --driver-root says (NVML does not tell)."""
        return None

    def rdma_device_nodes(self, nic: str) -> list[tuple[str, str]]:
        """The NIC's verbs device and rdma_cm, found through sysfs (the same paths inside the container)."""
        return [(path, path) for path in pci.verbs_devices(nic)]

    def control_device_paths(self) -> list[str]:
        """The driver's control device nodes present on this host."""
        return [path for path in _CONTROL_DEVICES if os.path.exists(path)]
