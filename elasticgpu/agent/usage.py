"""Measured usage: pid -> cgroup -> container id -> ledger -> claim, written into claim and GPU status.

Every `sample_interval_s` the loop asks discovery for each process's memory and SM use, finds the
container of each pid from `/proc/<pid>/cgroup`, and the claim of each container from the ledger
(the CRI hook recorded it when it injected the cards). It then
- stores the samples in the ledger (pruned after the retention);
- hands each card's totals to inventory, which writes them with the card's heartbeat;
- writes each claim's `status.usage`, at most once per `usage_write_interval_s` in steady state,
  at once on a change of `usage_change_mib` or more or when OverLimit flips, and never more than
  `max_writes_per_pass` claims per pass (the rest wait for the next: no write storm);
- reads a claim back every `usage_verify_s` while its usage is unchanged, and writes it again when
  another writer replaced the status (the agent does not watch claims: that would be every claim);
- sets the claim's condition `OverLimit` (True while its measured memory exceeds the memory it
  reserved) and writes a Warning Event when it becomes True;
- writes a Warning Event `UnattributedGPUProcess` about the card for a process on it that no
  claim's container holds (a host process, a privileged container, another device plugin's
  container), naming the pid and what procfs told of its cgroup and container: once per process
  (pid and start time), at most `unattributed_events_per_minute` for the node (a node full of
  them still writes a few Events, not a storm; the rest are told in later minutes), and counts
  them per card for the metrics; such a process is never stopped (no claim says what it may use);
- hands the pass to over-limit policing (policing/, issue 25) when it is wired: a claim that stays
  over its memory for its class's grace has its container stopped through the runtime.

cgroup path forms (the container id is the 64-hex-digit component, deepest first):
    cgroup v2, systemd driver   0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid>.slice/
                                cri-containerd-<id>.scope   (CRI-O: crio-<id>.scope; docker: docker-<id>.scope)
    cgroup v2, cgroupfs driver  0::/kubepods/besteffort/pod<uid>/<id>
    cgroup v1 (any controller)  4:memory:/kubepods/burstable/pod<uid>/<id>, or the systemd form above
    containerd outside kubelet  0::/k8s.io/<id>
On a hybrid host (v1 controllers with a v2 hierarchy beside them, as here) a process may sit in a
container's cgroup in one hierarchy and in `/` in the other: every line is looked at.
CRI-O's `crio-conmon-<id>.scope` is its monitor process, not the container: never matched.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from elasticgpu.agent import errors
from elasticgpu.agent.discovery import DiscoveryBackend, ProcessUsage
from elasticgpu.agent.inventory import GpuUsage, Inventory, rfc3339
from elasticgpu.agent.kube import AgentKube
from elasticgpu.agent.ledger.store import DRA_CLAIM_PREFIX, Allocation, LedgerStore, UsageSample
from elasticgpu.agent.policing import Enforcer
from elasticgpu.agent.repeated_failures import RepeatedFailure
from elasticgpu.agent.settings import LedgerSettings, UsageSettings
from elasticgpu.api import names

logger = logging.getLogger(__name__)

OVER_LIMIT = "OverLimit"
_CONTAINER_COMPONENT = re.compile(r"^(?:cri-containerd-|crio-|docker-|containerd-)?([0-9a-f]{64})(?:\.scope)?$")


def container_id_from_cgroup(text: str) -> str | None:
    """The container id in the text of `/proc/<pid>/cgroup`, or None (a process of the host)."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1] if line.count(":") >= 2 else ""
        for component in reversed(path.split("/")):
            match = _CONTAINER_COMPONENT.match(component)
            if match:
                return match.group(1)
    return None


class ContainerFinder:
    """pid -> container id through procfs, cached per (pid, start time) so a reused pid is never mistaken."""

    def __init__(self, proc_root: str | Path = "/proc") -> None:
        self._proc = Path(proc_root)
        self._cache: dict[int, tuple[str, str | None]] = {}

    def _start_time(self, pid: int) -> str | None:
        try:
            stat = (self._proc / str(pid) / "stat").read_text()
        except OSError:
            return None
        # Field 22 (starttime) counts after the command, which is in parentheses and may hold spaces.
        fields = stat.rsplit(")", 1)[-1].split()
        return fields[19] if len(fields) > 19 else None

    def container_of(self, pid: int) -> str | None:
        """The container id of a live process; None for a host process or a process that is gone."""
        started = self._start_time(pid)
        if started is None:
            self._cache.pop(pid, None)
            return None
        cached = self._cache.get(pid)
        if cached is not None and cached[0] == started:
            return cached[1]
        try:
            container = container_id_from_cgroup((self._proc / str(pid) / "cgroup").read_text())
        except OSError:
            return None
        self._cache[pid] = (started, container)
        return container

    def process_key(self, pid: int) -> tuple[int, str] | None:
        """(pid, start time): names one process for its whole life (a reused pid gets another); None when gone."""
        started = self._start_time(pid)
        return None if started is None else (pid, started)

    def cgroup_of(self, pid: int) -> str | None:
        """The deepest cgroup path of a process (the longest of its hierarchies), or None when it is gone."""
        try:
            text = (self._proc / str(pid) / "cgroup").read_text()
        except OSError:
            return None
        paths = [line.split(":", 2)[-1] for line in text.splitlines() if line.count(":") >= 2]
        return max(paths, key=len, default="")

    def forget_except(self, pids: Iterable[int]) -> None:
        """Drop cached pids that are no longer reported (keeps the cache as small as the process list)."""
        keep = set(pids)
        for pid in [p for p in self._cache if p not in keep]:
            del self._cache[pid]


@dataclass
class ClaimUsage:
    """One claim's measured usage in one pass."""

    namespace: str
    name: str
    reserved_mib: int
    reserved_cores: int = 0
    memory_mib: int = 0
    sm_percent: int = 0
    gpus: set[str] = field(default_factory=set)

    @property
    def over_limit(self) -> bool:
        """True when the claim uses more memory than it reserved (a reservation of 0 has no limit)."""
        return self.reserved_mib > 0 and self.memory_mib > self.reserved_mib


MIB = 1024 * 1024
USED_RETENTION_S = 3600.0
"""Seconds a claim's used totals stay exported after its last pass (many scrapes see the final value)."""


@dataclass
class UsedTotals:
    """What one claim used since the agent started: card-core seconds (100 = a whole card busy
    for a second) and memory byte-seconds; `seen` is its last pass (seconds since the epoch)."""

    core_seconds: float = 0.0
    memory_byte_seconds: float = 0.0
    seen: float = 0.0


def integrate_used(used: dict[tuple[str, str], UsedTotals], claims: Mapping[tuple[str, str], ClaimUsage], *,
                   last: float | None, now: float, longest_s: float) -> None:
    """Add each claim's measurement x the seconds since the `last` pass (at most `longest_s`;
    none on the first pass) to `used`, and drop the totals of claims gone `USED_RETENTION_S`."""
    elapsed = 0.0 if last is None else min(max(0.0, now - last), longest_s)
    for key, usage in claims.items():
        totals = used.setdefault(key, UsedTotals())
        totals.core_seconds += usage.sm_percent * elapsed
        totals.memory_byte_seconds += usage.memory_mib * MIB * elapsed
        totals.seen = now
    for key in [k for k, t in used.items() if now - t.seen > USED_RETENTION_S]:
        del used[key]


@dataclass
class _Written:
    memory_mib: int
    sm_percent: int
    over_limit: bool
    at: float
    verified: float = 0.0  # when the claim was last read back to see that our status is still there


def attribute(
    processes: Iterable[ProcessUsage], allocations: Iterable[Allocation], container_of: Callable[[int], str | None]
) -> tuple[dict[tuple[str, str], ClaimUsage], list[tuple[ProcessUsage, Allocation | None, str | None]]]:
    """Per-claim totals and, per process, its allocation and container (None where unknown)."""
    by_container = {a.container_id: a for a in allocations if a.container_id}
    claims: dict[tuple[str, str], ClaimUsage] = {}
    for allocation in by_container.values():
        key = allocation.claim_key  # a ResourceClaim's is `resourceclaim/<name>` (issue 48)
        # The size the claim holds now (a resize in place changes it), not the size at the container's creation:
        # usage, policing and the metrics all judge by it (issue 33.5).
        cores, memory_mib = allocation.size_now
        entry = claims.setdefault(key, ClaimUsage(key[0], key[1], memory_mib))
        entry.reserved_mib = max(entry.reserved_mib, memory_mib)
        entry.reserved_cores = max(entry.reserved_cores, cores)
    rows: list[tuple[ProcessUsage, Allocation | None, str | None]] = []
    for process in processes:
        container = container_of(process.pid)
        owner = by_container.get(container) if container else None
        rows.append((process, owner, container))
        if owner is None:
            continue
        entry = claims[owner.claim_key]
        entry.memory_mib += process.memory_mib
        entry.sm_percent += process.sm_percent or 0
        entry.gpus.add(process.gpu_uuid)
    return claims, rows


class UsageLoop:
    """Samples usage and writes it, rate-limited. `run` blocks until `stop` is set."""

    def __init__(
        self,
        *,
        backend: DiscoveryBackend,
        ledger: LedgerStore,
        kube: AgentKube,
        inventory: Inventory | None,
        settings: UsageSettings,
        ledger_settings: LedgerSettings,
        max_writes_per_pass: int = 20,
        unattributed_events_per_minute: int = 10,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`unattributed_events_per_minute`: Warning Events about processes no claim holds, for the node."""
        self._backend = backend
        self._ledger = ledger
        self._kube = kube
        self._inventory = inventory
        self._settings = settings
        self._ledger_settings = ledger_settings
        self._max_writes = max_writes_per_pass
        self._clock = clock
        self._finder = ContainerFinder(settings.proc_root)
        self._written: dict[tuple[str, str], _Written] = {}
        self._claims_seen: dict[tuple[str, str], dict[str, Any]] = {}  # last answer per claim (resourceVersion)
        self._gpu_urgent_base: dict[str, int] = {}
        self._last_prune = 0.0
        self._unattributed_budget = unattributed_events_per_minute
        self._warned: set[tuple[int, str]] = set()  # processes already told of: (pid, start time)
        self._warnings: list[float] = []  # when the recent ones were written (the rate limit's window)
        self.unattributed: dict[int, str] = {}
        """pid -> what was found of it, for the processes no claim held in the last pass (tests, logs)."""
        self.unattributed_by_gpu: dict[str, tuple[int, int]] = {}
        """Card uuid -> (processes, MiB) of the last pass's processes no claim held (for the metrics)."""
        self.policing: Enforcer | None = None
        """Over-limit policing, handed every pass (issue 25); None: the agent only warns."""
        self.claims: dict[tuple[str, str], ClaimUsage] = {}
        """Per-claim usage of the last pass (for the metrics)."""
        self.gpus: dict[str, GpuUsage] = {}
        """Per-card usage of the last pass (for the metrics)."""
        self.claim_writes = 0
        """Claim status writes made."""
        self.used: dict[tuple[str, str], UsedTotals] = {}
        """Per claim: what it used since this agent started (issue 38's used accounting), kept
        an hour after the claim's last pass so the final value is scraped before it goes."""
        self._last_pass: float | None = None

    def run(self, stop: threading.Event) -> None:
        """A pass every `sample_interval_s` until `stop`. Never dies."""
        said = RepeatedFailure("the usage pass", logger)
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.sample_once()
                said.worked()
                delay = max(0.05, self._settings.sample_interval_s - (time.monotonic() - started))
            except Exception as e:
                delay = min(30.0, 0.5 * 2 ** (said.failures + 1))
                said.failed(e, retry_in_s=delay, trace=not isinstance(e, errors.AgentError))
            stop.wait(delay)

    def sample_once(self) -> None:
        """One pass: measure, attribute, store, hand over, write what is due."""
        now = self._clock()
        processes = self._backend.process_usage()
        claims, rows = attribute(processes, self._ledger.open_allocations(), self._finder.container_of)
        self._finder.forget_except(p.pid for p in processes)
        taken = datetime.fromtimestamp(now, UTC)
        self._ledger.record_usage([
            UsageSample(taken_at=taken, gpu_uuid=p.gpu_uuid, pid=p.pid, memory_mib=p.memory_mib,
                        sm_percent=p.sm_percent, container_id=container,
                        claim_namespace=a.claim_key[0] if a else None, claim_name=a.claim_key[1] if a else None)
            for p, a, container in rows
        ])
        if now - self._last_prune >= 60:
            self._ledger.prune_usage(before=taken - timedelta(seconds=self._ledger_settings.usage_retention_s))
            self._ledger.prune_released(before=taken - timedelta(seconds=self._ledger_settings.released_retention_s))
            self._last_prune = now
        self._hand_gpus_over(processes, now)
        self._tell_unattributed(rows, now)
        self.claims = claims
        self._integrate(claims, now)
        self._write_claims(claims, now)
        if self.policing is not None:
            try:
                self.policing.police({k: c.reserved_mib for k, c in claims.items()}, rows, self.claim_seen)
            except Exception:
                # Policing's own failures are retried by it; this guards the usage writes from a bug of it.
                logger.exception("over-limit policing failed in this pass; the next pass tries again")

    def _integrate(self, claims: dict[tuple[str, str], ClaimUsage], now: float) -> None:
        """Add this pass's measurements x the time since the last pass to each claim's totals.

        A counter of this process, not of an object: a restart starts it again at zero, which
        Prometheus reads as a counter reset (rate and increase stay right; nothing is counted
        twice). The time between passes is capped at three intervals: after a stall, one
        sample must not stand for minutes nobody measured."""
        last, self._last_pass = self._last_pass, now
        integrate_used(self.used, claims, last=last, now=now, longest_s=3 * self._settings.sample_interval_s)

    def claim_seen(self, key: tuple[str, str]) -> dict[str, Any] | None:
        """The claim as the loop last read or wrote it (None: not yet), refreshed every `usage_verify_s`."""
        return self._claims_seen.get(key)

    def _tell_unattributed(self, rows: list[tuple[ProcessUsage, Allocation | None, str | None]], now: float) -> None:
        """A Warning Event per process that uses a card but belongs to no claim's container (see the docstring)."""
        unattributed: dict[int, str] = {}
        by_gpu: dict[str, tuple[int, int]] = {}
        alive: set[tuple[int, str]] = set()
        for process, owner, container in rows:
            key = self._finder.process_key(process.pid)
            if key is not None:
                alive.add(key)
            if owner is not None or key is None:
                continue  # attributed, or gone since NVML listed it (nothing left to tell)
            count, mib = by_gpu.get(process.gpu_uuid, (0, 0))
            by_gpu[process.gpu_uuid] = (count + 1, mib + process.memory_mib)
            cgroup = self._finder.cgroup_of(process.pid) or "/"
            found = (
                f"container {container} (cgroup {cgroup}), which got no card through a claim: a privileged container,"
                " or one another device plugin or runtime hook gave GPUs to"
                if container else f"cgroup {cgroup}, no container's: a process of the host"
            )
            unattributed[process.pid] = found
            self._warnings = [at for at in self._warnings if now - at < 60]
            if key in self._warned or len(self._warnings) >= self._unattributed_budget:
                continue
            self._warned.add(key)
            self._warnings.append(now)
            self._warn_unattributed(process, found, now)
        self._warned &= alive  # forget processes that ended: the set stays as small as the process list
        self.unattributed = unattributed
        self.unattributed_by_gpu = by_gpu

    def _warn_unattributed(self, process: ProcessUsage, found: str, now: float) -> None:
        name = names.gpu_object_name(process.gpu_uuid)
        cards = self._inventory.snapshot.cards if self._inventory is not None else ()
        card = next((c for c in cards if c.uuid == process.gpu_uuid), None)
        where = f"card {process.gpu_uuid}" + (f" (index {card.index})" if card is not None else "")
        obj = self._inventory.objects().get(name) if self._inventory is not None else None
        message = (
            f"process {process.pid} uses {process.memory_mib} MiB of GPU memory on {where} of node"
            f" {self._kube.node_name}, but no claim's container holds that card: it runs in {found}. It takes"
            " memory and compute the card's claims were promised; find it (`nsenter -t <pid>` or the container's"
            " pod) and give its pod an ElasticGPUClaim, or stop it"
        )
        logger.warning("%s", message)
        try:
            self._kube.create_event(
                namespace=self._inventory.events_namespace if self._inventory is not None else "default",
                involved={"apiVersion": names.API_VERSION, "kind": names.KIND_GPU, "name": name,
                          "uid": ((obj or {}).get("metadata") or {}).get("uid")},
                type_="Warning", reason="UnattributedGPUProcess", message=message, now=rfc3339(now),
            )  # fmt: skip
        except errors.KubeError as e:
            logger.warning("UnattributedGPUProcess Event about GPU %s not written: %s", name, e)

    def _hand_gpus_over(self, processes: list[ProcessUsage], now: float) -> None:
        totals: dict[str, list[int]] = {}
        for card in (self._inventory.snapshot.cards if self._inventory else ()):
            totals[card.uuid] = [0, 0]
        for process in processes:
            entry = totals.setdefault(process.gpu_uuid, [0, 0])
            entry[0] += process.memory_mib
            entry[1] += process.sm_percent or 0
        gpus: dict[str, GpuUsage] = {}
        for uuid, (memory, sm) in totals.items():
            usage = GpuUsage(memory_mib=memory, sm_percent=min(sm, 100), measured_at=now)
            gpus[uuid] = usage
            base = self._gpu_urgent_base.get(uuid)
            urgent = base is None or abs(memory - base) >= self._settings.usage_change_mib
            if urgent:
                self._gpu_urgent_base[uuid] = memory
            if self._inventory is not None:
                self._inventory.set_gpu_usage(uuid, usage, urgent=urgent and base is not None)
        self.gpus = gpus

    def _due(self, key: tuple[str, str], usage: ClaimUsage, now: float) -> tuple[bool, bool]:
        """(due, urgent) for a claim's write."""
        last = self._written.get(key)
        if last is None:
            return True, True
        jump = abs(last.memory_mib - usage.memory_mib) >= self._settings.usage_change_mib
        if jump or last.over_limit != usage.over_limit:
            return True, True
        same = (last.memory_mib, last.sm_percent) == (usage.memory_mib, usage.sm_percent)
        return (not same and now - last.at >= self._settings.usage_write_interval_s), False

    def _erased(self, key: tuple[str, str], last: _Written) -> bool:
        """Read the claim back: True when what we wrote is no longer there (another writer replaced the status)."""
        claim = self._kube.read_claim(*key)
        self._claims_seen[key] = claim
        status = claim.get("status") or {}
        shown = status.get("usage") or {}
        over = next((c for c in status.get("conditions") or [] if c.get("type") == OVER_LIMIT), None)
        return (shown.get("memoryUsed"), shown.get("coresUsed")) != (last.memory_mib, last.sm_percent) or (
            last.over_limit and (over is None or over.get("status") != "True"))

    def _write_claims(self, claims: dict[tuple[str, str], ClaimUsage], now: float) -> None:
        due = []
        verifications = 0
        for key, usage in claims.items():
            if key[1].startswith(DRA_CLAIM_PREFIX):
                continue  # a ResourceClaim (issue 48): no ElasticGPUClaim status to write; the metrics show it
            is_due, urgent = self._due(key, usage, now)
            last = self._written.get(key)
            if not is_due and last is not None and now - last.verified >= self._settings.usage_verify_s \
                    and verifications < self._max_writes:
                # Unchanged usage is not written again; once in a while check that it is still there.
                verifications += 1
                last.verified = now
                try:
                    is_due = urgent = self._erased(key, last)
                except errors.KubeError as e:
                    logger.debug("claim %s/%s not read back: %s", key[0], key[1], e)
            if is_due:
                due.append((not urgent, self._written.get(key, _Written(0, 0, False, 0)).at, key, usage))
        due.sort(key=lambda item: (item[0], item[1]))  # urgent first, then the longest unwritten
        for _, _, key, usage in due[: self._max_writes]:
            try:
                self._write_claim(key, usage, now)
            except errors.KubeNotFound:
                logger.debug("claim %s/%s is gone; its usage is not written", *key)
                self._written[key] = _Written(usage.memory_mib, usage.sm_percent, usage.over_limit, now)
            except errors.KubeError as e:
                logger.warning("usage of claim %s/%s not written (%s); next pass retries", key[0], key[1], e)
        for key in [k for k in self._written if k not in claims]:
            del self._written[key]  # the claim has no open allocation any more
            self._claims_seen.pop(key, None)

    def _write_claim(self, key: tuple[str, str], usage: ClaimUsage, now: float) -> None:
        namespace, name = key
        claim = self._claims_seen.get(key) or self._kube.read_claim(namespace, name)
        for _attempt in range(3):
            status = claim.get("status") or {}
            conditions = [c for c in status.get("conditions") or [] if c.get("type") != OVER_LIMIT]
            previous = next((c for c in status.get("conditions") or [] if c.get("type") == OVER_LIMIT), None)
            became_over = usage.over_limit and (previous is None or previous.get("status") != "True")
            if usage.over_limit or previous is not None:
                state = "True" if usage.over_limit else "False"
                message = (
                    f"uses {usage.memory_mib} MiB of GPU memory but reserved {usage.reserved_mib} MiB (measured"
                    f" {rfc3339(now)} on {', '.join(sorted(usage.gpus))}): it takes memory other claims on the"
                    " card were promised; request more elasticgpu.io/gpu-memory or use less"
                    if usage.over_limit else
                    f"uses {usage.memory_mib} MiB of GPU memory, within the {usage.reserved_mib} MiB it reserved"
                )
                transition = (previous or {}).get("lastTransitionTime") if (previous or {}).get("status") == state \
                    else None
                conditions.append({
                    "type": OVER_LIMIT, "status": state,
                    "reason": "MemoryOverLimit" if usage.over_limit else "WithinLimit", "message": message,
                    "lastTransitionTime": transition or rfc3339(now),
                })
            patch = {
                "usage": {"memoryUsed": usage.memory_mib, "coresUsed": usage.sm_percent, "updateTime": rfc3339(now)},
                "conditions": conditions,
            }
            try:
                answer = self._kube.patch_claim_status(
                    namespace, name, resource_version=str(claim["metadata"]["resourceVersion"]), status=patch
                )
            except errors.KubeConflict:
                claim = self._kube.read_claim(namespace, name)  # the controller wrote it meanwhile
                continue
            self.claim_writes += 1
            self._claims_seen[key] = answer
            self._written[key] = _Written(usage.memory_mib, usage.sm_percent, usage.over_limit, now, verified=now)
            if became_over:
                self._warn(answer, usage, now)
            return
        logger.info("claim %s/%s: usage write kept conflicting; next pass retries", namespace, name)

    def _warn(self, claim: dict[str, Any], usage: ClaimUsage, now: float) -> None:
        metadata = claim.get("metadata") or {}
        try:
            self._kube.create_event(
                namespace=str(metadata.get("namespace")),
                involved={"apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM, "name": metadata.get("name"),
                          "namespace": metadata.get("namespace"), "uid": metadata.get("uid"),
                          "resourceVersion": metadata.get("resourceVersion")},
                type_="Warning", reason=OVER_LIMIT, now=rfc3339(now),
                message=f"claim uses {usage.memory_mib} MiB of GPU memory, more than the {usage.reserved_mib} MiB"
                f" it reserved, on node {self._kube.node_name}",
            )
        except errors.KubeError as e:
            logger.warning("OverLimit Event for claim %s/%s not written: %s", metadata.get("namespace"),
                           metadata.get("name"), e)
