"""The simulated backend: cards described in YAML, for clusters and tests without GPUs.

The file::

    driver: {version: "550.54.15", cuda: "12.4"}
    cards:
      - model: NVIDIA A100-SXM4-80GB
        memory: 80Gi            # MiB as a number, or a quantity
        numa: 0
        links: [1]              # other cards of this node, by index or uuid
        # pcieRoot: "0000:00:01.0"   # optional: the PCIe root port above the card
        # nics: [mlx5_0]        # optional: RDMA NICs under that root (their stand-in uverbs nodes are made)
        count: 2                # optional: this many identical cards (links then name indices)
        # uuid: GPU-...         # optional; default derived from node name and index (stable, unique per node)
        # minor: 0              # optional; default: the index
        # mig: false            # true: MIG mode enabled (the admin's choice); see simulated_mig.py
        # migInstances: [{profile: 3g.40gb, start: 4}]   # optional: instances carved at start
    timeline:                   # optional; `at` is seconds after the backend started
      - {at: 5, process: {card: 0, pid: 4242, memory: 2Gi, sm: 30}}   # `instance: 1`: on MIG instance 1
      - {at: 9, xid: {card: 0, code: 79, message: fell off the bus}}
      - {at: 20, process: {card: 0, pid: 4242, gone: true}}
      - {at: 30, vanish: {card: 1}}
      - {at: 60, appear: {card: 1}}
      - {at: 70, reset: {card: 0}}   # the card was reset (nvidia-smi -r): clears an XID that needed one

A card that appears after it vanished was re-enumerated, which counts as a reset too (as with NVML).

While the agent runs, a test (or a person) injects the same entries, without `at`, by dropping
JSON or YAML files (one entry, or a list of entries) into the inject directory (`inject()` below
does it atomically: write a hidden temporary file, then rename). The backend takes them in name
order on its next call and deletes them, so an injected entry acts once, exactly like a timeline
entry that is due.

Stand-in device nodes: for each card the backend makes `<device_dir>/nvidia<minor>` (and the
control devices `nvidiactl`, `nvidia-uvm`), character devices with /dev/null's numbers, so a CDI
spec that names them is valid for a real container runtime and a container that opens them
opens /dev/null. Without the right to mknod (not root) they are symlinks to /dev/null.

Stand-in driver root: `<device_dir>/driver-root/` holds what the CDI spec mounts from a real
driver installation, for the driver version of the file (`driver.version`): fake libraries
(`usr/lib/x86_64-linux-gnu/libcuda.so.<version>`, libnvidia-ml, libnvidia-ptxjitcompiler,
libcudadebugger: text, not ELF), `usr/bin/nvidia-smi` (a shell script that prints the driver
version, and with `-L` the cards of $NVIDIA_VISIBLE_DEVICES as the real one lists them) and
the firmware folder `lib/firmware/nvidia/<version>/`. `driver_root()` names it.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
import time
import uuid as uuidlib
from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from elasticgpu.agent import errors
from elasticgpu.agent.discovery import models
from elasticgpu.agent.discovery.mig import MigInstanceInfo, MigProfileInfo
from elasticgpu.agent.discovery.simulated_mig import SimulatedMig
from elasticgpu.api import quantities
from elasticgpu.api.errors import InvalidQuantity

logger = logging.getLogger(__name__)

_UUID_NAMESPACE = uuidlib.UUID("6f1d6c1e-3b7a-4c55-9a43-2f7f0f1f7e21")  # fixed: simulated uuids stay stable
_CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm")
_STAND_IN_LIBRARIES = ("libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler", "libcudadebugger")
_NVIDIA_SMI = """#!/bin/sh
# Stand-in nvidia-smi of elasticgpu's simulated backend (driver {version}).
if [ "$1" = "-L" ]; then
  i=0
  for uuid in $(echo "$NVIDIA_VISIBLE_DEVICES" | tr ',' ' '); do
    case "$uuid" in void|none|"") continue ;; esac
    echo "GPU $i: Simulated GPU (UUID: $uuid)"
    i=$((i + 1))
  done
  [ "$i" -gt 0 ] || {{ echo "No devices found." >&2; exit 6; }}
  exit 0
fi
echo "NVIDIA-SMI {version}    Driver Version: {version}    CUDA Version: {cuda}"
"""
_POLL_S = 0.05  # how often wait_xid_events looks at the clock and the inject directory
_ENTRY_KINDS = ("process", "xid", "vanish", "appear", "reset")


def simulated_uuid(node_name: str, index: int) -> str:
    """The default uuid of simulated card `index` of `node_name`: stable across restarts, unique per node."""
    return "GPU-" + str(uuidlib.uuid5(_UUID_NAMESPACE, f"{node_name}/{index}"))


@dataclass
class _CardState:
    card: models.Card
    present: bool = True


def _fail(source: str, where: str, problem: str) -> errors.SimulationInvalid:
    return errors.SimulationInvalid(f"{source}: {where}: {problem}")


def _int(value: object, *, source: str, where: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(source, where, f"must be an integer >= {minimum}, got {value!r}")
    return value


def _nics(value: object, *, source: str, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _fail(source, where, f"must be a list of RDMA device names (e.g. [mlx5_0]), got {value!r}")
    return tuple(sorted(set(value)))


def make_stand_in_device(path: Path) -> None:
    """A character device at `path` with /dev/null's major/minor (a symlink to /dev/null without CAP_MKNOD)."""
    if path.exists() or path.is_symlink():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    null = os.stat("/dev/null").st_rdev
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, null)
    except PermissionError:
        os.symlink("/dev/null", path)


def make_stand_in_driver_root(root: Path, driver: models.DriverInfo) -> None:
    """The fake driver installation of `driver`'s version under `root` (see the module docstring)."""
    version = driver.driver_version
    libraries = root / "usr/lib/x86_64-linux-gnu"
    libraries.mkdir(parents=True, exist_ok=True)
    for name in _STAND_IN_LIBRARIES:
        (libraries / f"{name}.so.{version}").write_text(f"stand-in for {name} of NVIDIA driver {version}\n")
    binaries = root / "usr/bin"
    binaries.mkdir(parents=True, exist_ok=True)
    smi = binaries / "nvidia-smi"
    smi.write_text(_NVIDIA_SMI.format(version=version, cuda=driver.cuda_version or "?"))
    smi.chmod(0o755)
    firmware = root / "lib/firmware/nvidia" / version
    firmware.mkdir(parents=True, exist_ok=True)
    (firmware / "gsp_ga10x.bin").write_text(f"stand-in GSP firmware of driver {version}\n")


def inject(inject_dir: str | Path, entry: dict[str, Any] | list[dict[str, Any]]) -> Path:
    """Drop timeline entries (without `at`) for a running simulated backend to act on, in order; returns the file.

    Atomic: written under a hidden name and renamed, so the backend never reads half a file.
    Names sort by time of injection, so entries act in the order they were injected.
    """
    directory = Path(inject_dir)
    directory.mkdir(parents=True, exist_ok=True)
    name = f"{time.time_ns():020d}-{os.getpid()}-{threading.get_ident()}.json"
    temporary = directory / f".{name}.tmp"
    temporary.write_text(json.dumps(entry))
    final = directory / name
    os.rename(temporary, final)
    return final


class SimulatedBackend:
    """Cards, processes and XID events from a YAML description and injected entries."""

    name = "simulated"

    def __init__(
        self,
        description: dict[str, Any],
        *,
        node_name: str,
        device_dir: str | Path,
        inject_dir: str | Path | None = None,
        source: str = "simulation",
        clock: Any = time.monotonic,
    ) -> None:
        self._source = source
        self._node = node_name
        self._device_dir = Path(device_dir)
        self._inject_dir = Path(inject_dir) if inject_dir is not None else None
        self._clock = clock
        self._started = clock()
        self._lock = threading.Lock()
        self._driver, cards = self._parse_description(description)
        self._cards: dict[int, _CardState] = {card.index: _CardState(card) for card in cards}
        self._timeline = self._parse_timeline(description.get("timeline") or [])
        self._processes: dict[tuple[str, int], models.ProcessUsage] = {}
        self._process_instances: dict[tuple[str, int], int] = {}  # (card, pid) -> MIG GPU instance id
        self._xids: list[models.XidEvent] = []
        self._resets: list[models.CardReset] = []
        for card in cards:
            make_stand_in_device(Path(card.device_path))
        for control in _CONTROL_DEVICES:
            make_stand_in_device(self._device_dir / control)
        # RDMA NICs of the file: stand-in uverbs devices, numbered in name order, and one rdma_cm.
        nics = sorted({nic for card in cards for nic in card.nics})
        self._nic_nodes = {
            nic: [(f"/dev/infiniband/uverbs{k}", str(self._device_dir / "infiniband" / f"uverbs{k}")),
                  ("/dev/infiniband/rdma_cm", str(self._device_dir / "infiniband" / "rdma_cm"))]
            for k, nic in enumerate(nics)
        }
        for nodes in self._nic_nodes.values():
            for _, host in nodes:
                make_stand_in_device(Path(host))
        self._driver_root = self._device_dir / "driver-root"
        make_stand_in_driver_root(self._driver_root, self._driver)
        self._mig = SimulatedMig(device_dir=self._device_dir, in_use=self._runs_on_instance,
                                 make_device=make_stand_in_device)
        for card, carved in zip(cards, self._carved, strict=True):
            self._mig.add_card(card, carved, where=f"{source}: cards[{card.index}]")

    @classmethod
    def from_file(
        cls, path: str | Path, *, node_name: str, device_dir: str | Path, inject_dir: str | Path | None = None
    ) -> SimulatedBackend:
        """Read the YAML description at `path`; raises `SimulationInvalid` naming the file and field."""
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise errors.SimulationInvalid(
                f"simulation file {path}: cannot be read ({e.strerror}); give an existing YAML file with --simulation"
            ) from None
        try:
            # libyaml's loader when present: a long timeline loads several times faster and in less memory.
            description = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
        except yaml.YAMLError as e:
            raise errors.SimulationInvalid(f"simulation file {path}: not valid YAML: {e}") from None
        if not isinstance(description, dict):
            raise errors.SimulationInvalid(f"simulation file {path}: must be a mapping with a `cards` list")
        return cls(description, node_name=node_name, device_dir=device_dir, inject_dir=inject_dir, source=str(path))

    # Parsing -------------------------------------------------------------------------------------------

    def _parse_description(self, description: dict[str, Any]) -> tuple[models.DriverInfo, list[models.Card]]:
        source = self._source
        driver_raw = description.get("driver") or {}
        if not isinstance(driver_raw, dict):
            raise _fail(source, "driver", "must be a mapping with `version` and `cuda`")
        driver = models.DriverInfo(
            driver_version=str(driver_raw.get("version", "simulated")), cuda_version=str(driver_raw.get("cuda", ""))
        )
        entries = description.get("cards")
        if not isinstance(entries, list) or not entries:
            raise _fail(source, "cards", "must be a non-empty list of cards (model, memory, numa, links)")
        raw_cards: list[tuple[dict[str, Any], str]] = []
        for position, entry in enumerate(entries):
            where = f"cards[{position}]"
            if not isinstance(entry, dict):
                raise _fail(source, where, "must be a mapping with at least `memory`")
            count = _int(entry.get("count", 1), source=source, where=f"{where}.count", minimum=1)
            raw_cards.extend((entry, where) for _ in range(count))
        cards: list[models.Card] = []
        self._carved: list[list[tuple[str, int]]] = []
        for index, (entry, where) in enumerate(raw_cards):
            if "memory" not in entry:
                raise _fail(source, f"{where}.memory", "is required (MiB, or a quantity such as 80Gi)")
            try:
                memory = quantities.parse_memory_mib(entry["memory"], field=f"{where}.memory")
            except InvalidQuantity as e:
                raise _fail(source, f"{where}.memory", str(e)) from None
            if memory < 1:
                raise _fail(source, f"{where}.memory", "must be at least 1 MiB")
            minor = _int(entry.get("minor", index), source=source, where=f"{where}.minor")
            numa = entry.get("numa")
            carved = entry.get("migInstances") or []
            if not isinstance(carved, list) or not all(
                    isinstance(c, dict) and isinstance(c.get("profile"), str) for c in carved):
                raise _fail(source, f"{where}.migInstances", "must be a list of {profile: 3g.40gb, start: 4}")
            self._carved.append([(c["profile"], _int(c.get("start", 0), source=source,
                                                     where=f"{where}.migInstances.start")) for c in carved])
            if entry.get("uuid") and entry.get("count", 1) != 1:
                raise _fail(source, f"{where}.uuid", "cannot be given with count > 1 (each card needs its own uuid)")
            cards.append(
                models.Card(
                    index=index,
                    uuid=str(entry.get("uuid") or simulated_uuid(self._node, index)),
                    model=str(entry.get("model", "Simulated GPU")),
                    memory_mib=memory,
                    minor=minor,
                    device_path=str(self._device_dir / f"nvidia{minor}"),
                    numa=None if numa is None else _int(numa, source=source, where=f"{where}.numa"),
                    pci_bus_id=str(entry.get("pciBusId", "")),
                    mig_enabled=bool(entry.get("mig", False)),
                    pcie_root=str(entry.get("pcieRoot") or ""),
                    nics=_nics(entry.get("nics"), source=source, where=f"{where}.nics"),
                )
            )
        # Links name other cards by index or uuid; resolve them now that every uuid is known.
        by_index = {card.index: card.uuid for card in cards}
        known = set(by_index.values())
        resolved: list[models.Card] = []
        for card, (entry, where) in zip(cards, raw_cards, strict=True):
            peers: set[str] = set()
            for link in entry.get("links") or []:
                peer = by_index.get(link) if isinstance(link, int) else (link if link in known else None)
                if peer is None:
                    raise _fail(source, f"{where}.links", f"{link!r} names no card of this file (use an index or uuid)")
                if peer != card.uuid:
                    peers.add(peer)
            resolved.append(replace(card, links=tuple(sorted(peers))))
        if len({card.minor for card in resolved}) != len(resolved):
            raise _fail(source, "cards[].minor", "two cards have the same minor number; give each its own")
        return driver, resolved

    def _parse_timeline(self, timeline: Any) -> list[tuple[float, dict[str, Any]]]:
        if not isinstance(timeline, list):
            raise _fail(self._source, "timeline", "must be a list of entries with `at` (seconds)")
        parsed: list[tuple[float, dict[str, Any]]] = []
        for position, entry in enumerate(timeline):
            where = f"timeline[{position}]"
            if not isinstance(entry, dict) or not isinstance(entry.get("at"), int | float):
                raise _fail(self._source, f"{where}.at", "each entry needs `at`, seconds after start")
            body = {k: v for k, v in entry.items() if k != "at"}
            self._check_entry(body, where)
            parsed.append((float(entry["at"]), body))
        parsed.sort(key=lambda item: item[0])
        return parsed

    def _check_entry(self, entry: dict[str, Any], where: str) -> None:
        kinds = [k for k in _ENTRY_KINDS if k in entry]
        if len(kinds) != 1 or not isinstance(entry[kinds[0]], dict):
            raise _fail(self._source, where, f"needs exactly one of {', '.join(_ENTRY_KINDS)} (a mapping)")
        self._card_of(entry[kinds[0]], f"{where}.{kinds[0]}.card")

    def _card_of(self, body: dict[str, Any], where: str) -> models.Card:
        ref = body.get("card")
        for state in self._cards.values():
            if ref in (state.card.index, state.card.uuid):
                return state.card
        raise _fail(self._source, where, f"{ref!r} names no card (use its index or uuid)")

    # Acting on entries -----------------------------------------------------------------------------------

    def _apply(self, entry: dict[str, Any], where: str) -> None:
        self._check_entry(entry, where)
        if "process" in entry:
            body = entry["process"]
            card = self._card_of(body, where)
            pid = _int(body.get("pid"), source=self._source, where=f"{where}.process.pid", minimum=1)
            if body.get("gone"):
                self._processes.pop((card.uuid, pid), None)
                self._process_instances.pop((card.uuid, pid), None)
                return
            if "instance" in body:
                self._process_instances[(card.uuid, pid)] = _int(
                    body["instance"], source=self._source, where=f"{where}.process.instance")
            try:
                memory = quantities.parse_memory_mib(body.get("memory", 0), field=f"{where}.process.memory")
            except InvalidQuantity as e:
                raise _fail(self._source, f"{where}.process.memory", str(e)) from None
            sm = body.get("sm")
            self._processes[(card.uuid, pid)] = models.ProcessUsage(
                gpu_uuid=card.uuid, pid=pid, memory_mib=memory,
                sm_percent=None if sm is None else _int(sm, source=self._source, where=f"{where}.process.sm"),
            )
        elif "xid" in entry:
            body = entry["xid"]
            card = self._card_of(body, where)
            code = _int(body.get("code"), source=self._source, where=f"{where}.xid.code", minimum=1)
            note = str(body.get("message", ""))
            self._xids.append(models.XidEvent(gpu_uuid=card.uuid, xid=code, timestamp=time.time(), message=note))
        elif "reset" in entry:
            card = self._card_of(entry["reset"], where)
            self._resets.append(models.CardReset(gpu_uuid=card.uuid, timestamp=time.time(), how="simulated reset"))
        else:
            present = "appear" in entry
            card = self._card_of(entry["appear" if present else "vanish"], where)
            if present and not self._cards[card.index].present:
                # Back after it vanished: re-enumerated by the driver, which only a reset or reboot does.
                self._resets.append(models.CardReset(gpu_uuid=card.uuid, timestamp=time.time(), how="re-enumerated"))
            self._cards[card.index].present = present

    def _advance(self) -> None:
        """Act on every timeline entry that is due and every injected file, in order. Caller holds the lock."""
        elapsed = self._clock() - self._started
        while self._timeline and self._timeline[0][0] <= elapsed:
            at, entry = self._timeline.pop(0)
            self._apply(entry, f"{self._source}: timeline entry at {at:g}s")
        if self._inject_dir is None or not self._inject_dir.is_dir():
            return
        for path in sorted(self._inject_dir.iterdir()):
            if path.name.startswith(".") or path.suffix not in (".json", ".yaml", ".yml"):
                continue
            try:
                text = path.read_text()
                loaded = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
                entries = loaded if isinstance(loaded, list) else [loaded]
                for position, entry in enumerate(entries):
                    if not isinstance(entry, dict):
                        raise _fail(str(path), f"entry {position}", f"must be a mapping ({', '.join(_ENTRY_KINDS)})")
                    self._apply(entry, f"{path} entry {position}")
            except (errors.SimulationInvalid, yaml.YAMLError, ValueError) as e:
                # A bad injected entry is the injector's mistake: say so and go on, never stop the agent.
                logger.error("ignored injected entry %s: %s", path, e)
            finally:
                path.unlink(missing_ok=True)

    # The backend interface ---------------------------------------------------------------------------------

    def snapshot(self) -> models.Snapshot:
        """The cards present now (a vanished card is left out until it appears again)."""
        with self._lock:
            self._advance()
            cards = tuple(state.card for state in sorted(self._cards.values(), key=lambda s: s.card.index)
                          if state.present)
        return models.Snapshot(cards=cards, driver=self._driver)

    def process_usage(self) -> list[models.ProcessUsage]:
        """The scripted and injected processes of the present cards."""
        with self._lock:
            self._advance()
            present = {state.card.uuid for state in self._cards.values() if state.present}
            return [usage for (gpu, _), usage in sorted(self._processes.items()) if gpu in present]

    def wait_xid_events(self, timeout_s: float) -> list[models.XidEvent]:
        """Due and injected XID events, polling every 50 ms for at most `timeout_s` seconds."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                self._advance()
                events, self._xids = self._xids, []
            if events or time.monotonic() >= deadline:
                return events
            time.sleep(min(_POLL_S, max(0.0, deadline - time.monotonic())))

    def card_resets(self, waiting: Collection[str]) -> list[models.CardReset]:
        """Resets of cards in `waiting` from due and injected `reset` entries (and cards re-enumerated).

        A reset of a card that awaits none is dropped, as NVML would have nothing to report for it.
        """
        with self._lock:
            self._advance()
            resets, self._resets = self._resets, []
        return [reset for reset in resets if reset.gpu_uuid in waiting]

    def rdma_device_nodes(self, nic: str) -> list[tuple[str, str]]:
        """Stand-ins of the NIC's uverbs device and rdma_cm (character devices of /dev/null)."""
        return list(self._nic_nodes.get(nic, []))

    def control_device_paths(self) -> list[str]:
        """Stand-ins of the driver's control devices."""
        return [str(self._device_dir / name) for name in _CONTROL_DEVICES]

    def driver_root(self) -> str | None:
        """The stand-in driver root made for the file's driver version."""
        return str(self._driver_root)

    # MIG (discovery.mig.MigControl) ----------------------------------------------------------------------

    def _runs_on_instance(self, card_uuid: str, gpu_instance_id: int) -> bool:
        return any(card == card_uuid and gi == gpu_instance_id
                   for (card, _pid), gi in self._process_instances.items())

    def mig_profiles(self, card_uuid: str) -> list[MigProfileInfo]:
        """The card's MIG profiles and starts; `MigNotEnabled` when not in MIG mode."""
        with self._lock:
            return self._mig.profiles(card_uuid)

    def mig_instances(self, card_uuid: str) -> list[MigInstanceInfo]:
        """The card's MIG instances."""
        with self._lock:
            self._advance()
            return self._mig.instances(card_uuid)

    def create_mig_instance(self, card_uuid: str, *, profile: str, start: int) -> MigInstanceInfo:
        """Create a MIG instance, with NVML's errors (`simulated_mig`)."""
        with self._lock:
            self._advance()
            return self._mig.create(card_uuid, profile=profile, start=start)

    def destroy_mig_instance(self, card_uuid: str, gpu_instance_id: int) -> None:
        """Destroy a MIG instance; `MigInUse` while a scripted process runs on it."""
        with self._lock:
            self._advance()
            self._mig.destroy(card_uuid, gpu_instance_id)

    def close(self) -> None:
        """Nothing to release; the stand-in devices stay for the CDI spec that may still name them."""
