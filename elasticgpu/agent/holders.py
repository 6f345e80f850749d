"""The claims whose containers run on each card, published in the card's `status.runningClaims`.

The ledger's open rows (`started` or `created`: a container that got the card and is not removed
yet) are the truth of who uses a card on this node. Rows of ResourceClaims (DRA's, issue 48) are
left out: the list names ElasticGPUClaims, which the controller matches against its reservations.
The controller reads them from the GPU objects and never frees a reservation while its claim is
listed: the card would otherwise be bound to another claim while the first one's containers still use it.

    when          the ledger's open rows changed (the store tells at once), the agent started
                  (its first pass after inventory listed the GPU objects), and every
                  `check_interval_s` (someone else changed the field, a GPU object appeared)
    what          per card: one entry per claim with open rows on it, {namespace, name, pods
                  (namespace/name, sorted), since (the first row's start)}; sorted by claim
    how           a merge patch of `status.runningClaims` alone (kube.patch_gpu_holders),
                  only for a card whose published list differs from the wanted one, compared
                  with the objects inventory's watch delivered

DRA (issue 48): the same pass publishes `status.preparedClaims`, per card the ResourceClaims this node
holds on it: every entry of the DRA driver's checkpoint (`prepared`, set by the agent's start-up; kubelet
prepared the claim and has not unprepared it) and every open ledger row of a ResourceClaim whose container
can still run, one entry {namespace, name, uid} per claim, sorted. The controller moves a card from DRA
back to ElasticGPU only once none is listed: a force-deleted pod's claim can be deallocated while kubelet
still stops its container, so the claim's allocation alone does not say the card is free. A checkpoint
that cannot be read fails the pass (retried): not knowing is not "nothing is prepared". The write patches
only the fields that differ (runningClaims, preparedClaims or both).

Only a container that can still run holds a card, the rule the CRI hook's card check applies
(injecting/card_sharing.holds_card): with the runtime's containers (`list_containers`, the CRI proxy's
ListContainers, set by the agent's start-up) an open row whose container exited (a finished Job's
container, kept by kubelet until its pod is deleted) or is gone is not published; the controller
already lets a claim go when its pods Succeeded or Failed, and it would otherwise keep a deleted
claim's reservation for as long as such a pod object stays. Without an answer from the runtime
every open row counts (never too little). A failed write is retried with backoff; the loop never dies.

Resize (docs/resize-node.md): with the claims' limits files (`limits`, set by the agent's start-up)
each pass first makes every claim's file say the size its allocation asks for (cri/limits_file.sync:
the allocation's `limit`, else its cores and memory; recorded in the ledger), then publishes
`applied` {cores, memory} in the claim's entry: the size its limits file says, only when every open
container of the claim on that card was created with the file mounted. A container created without
it (before this feature, or when the file could not be written) keeps the size it started with
until it restarts: the entry then has no `applied`, and the controller keeps the resize pending.
Without limits files the pass still records the size each allocation asks now in the ledger: it is
the size usage, policing and the metrics judge a claim by (`Allocation.size_now`, issue 33.5).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from elasticgpu.agent import errors
from elasticgpu.agent.injecting import card_sharing, limits_file
from elasticgpu.agent.kube import AgentKube
from elasticgpu.agent.ledger.store import Allocation, LedgerStore


class _PreparedDevice(Protocol):
    @property
    def uuid(self) -> str: ...


class PreparedEntry(Protocol):
    """A claim of the DRA driver's checkpoint (dra.checkpoint.ClaimEntry; not imported: the dra package
    compiles its protos at import, and only a node that is a DRA driver loads it)."""

    @property
    def uid(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def devices(self) -> Sequence[_PreparedDevice]: ...

logger = logging.getLogger(__name__)


def running_claims(allocations: Iterable[Allocation]) -> dict[str, list[dict[str, Any]]]:
    """Per card (lowercased uuid), the entries of `status.runningClaims` for these open rows."""
    pods: dict[tuple[str, str, str], set[str]] = {}
    since: dict[tuple[str, str, str], datetime] = {}
    applied: dict[tuple[str, str, str], set[tuple[int, int] | None]] = {}
    for row in allocations:
        if row.is_dra:
            # A ResourceClaim (issue 48) is not an ElasticGPUClaim: the controller frees reservations by the
            # claims listed here, and a DRA card holds none of ours; DRA's own record is the claim's allocation.
            continue
        for uuid in row.gpu_uuids:
            key = (uuid.lower(), row.claim_namespace, row.claim_name)
            pods.setdefault(key, set()).add(f"{row.pod_namespace}/{row.pod_name}")
            since[key] = min(since.get(key, row.started_at), row.started_at)
            applied.setdefault(key, set()).add(row.applied)
    by_card: dict[str, list[dict[str, Any]]] = {}
    for key in sorted(pods):
        uuid, namespace, name = key
        entry: dict[str, Any] = {
            "namespace": namespace, "name": name, "pods": sorted(pods[key]),
            "since": since[key].astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }  # fmt: skip
        sizes = applied[key]
        if len(sizes) == 1 and (size := next(iter(sizes))) is not None:
            # Every container of the claim on the card reads the file, and it says this size.
            entry["applied"] = {"cores": size[0], "memory": size[1]}
        by_card.setdefault(uuid, []).append(entry)
    return by_card


def prepared_claims(allocations: Iterable[Allocation],
                    prepared: Iterable[PreparedEntry]) -> dict[str, list[dict[str, str]]]:  # fmt: skip
    """Per card (lowercased uuid), the entries of `status.preparedClaims`: the checkpoint's claims and the
    ResourceClaims of these open rows."""
    held: dict[str, dict[str, tuple[str, str]]] = {}
    for entry in prepared:
        for device in entry.devices:
            held.setdefault(device.uuid.lower(), {})[entry.uid] = (entry.namespace, entry.name)
    for row in allocations:
        if row.is_dra:
            for uuid in row.gpu_uuids:  # elastic_gpu of a DRA row is its ResourceClaim's uid
                held.setdefault(uuid.lower(), {})[row.elastic_gpu] = (row.claim_namespace, row.claim_name)
    return {uuid: [{"namespace": namespace, "name": name, "uid": uid}
                   for uid, (namespace, name) in sorted(claims.items(), key=lambda item: (item[1], item[0]))]
            for uuid, claims in held.items()}  # fmt: skip


class RunningClaimsPublisher:
    """Keeps `status.runningClaims` of this node's GPU objects true to the ledger. `run` blocks until `stop`."""

    def __init__(
        self,
        *,
        kube: AgentKube,
        ledger: LedgerStore,
        objects: Callable[[], dict[str, dict[str, Any]]],
        remember: Callable[[dict[str, Any]], None],
        check_interval_s: float = 10.0,
    ) -> None:
        """`objects`: this node's GPU objects as inventory's watch last delivered them, by name;
        `remember`: hands inventory the object a write answered (so the next compare sees it)."""
        self._kube = kube
        self._ledger = ledger
        self._objects = objects
        self._remember = remember
        self._check_interval_s = check_interval_s
        self.wake = threading.Event()
        """Set to publish at once (the ledger's open rows changed)."""
        ledger.on_allocations_changed(self.wake.set)
        self.writes = 0
        """runningClaims writes made (for tests and metrics)."""
        self.limits: limits_file.LimitsFiles | None = None
        """The claims' limits files, kept true to the allocations on every pass (None: no CRI hook here)."""
        self.list_containers: Callable[[], Sequence[Any]] | None = None
        """The runtime's containers (CRI `Container`s: id, state), to leave out the rows of containers that
        cannot run any more (None: no CRI hook here, every open row counts)."""
        self.prepared: Callable[[], Iterable[PreparedEntry]] | None = None
        """The DRA driver's checkpoint entries (None: no DRA driver here; the open DRA rows are still
        published in `status.preparedClaims`)."""

    def run(self, stop: threading.Event, *, ready: threading.Event | None = None) -> None:
        """Publish now (once `ready` is set: inventory listed the objects), then on every change of the
        ledger and every `check_interval_s`, until `stop`. Never dies."""
        if ready is not None:
            while not stop.is_set() and not ready.wait(0.5):
                pass
        failures = 0
        while not stop.is_set():
            self.wake.clear()
            try:
                self.publish_once()
                failures = 0
                delay = self._check_interval_s
            except Exception as e:
                failures += 1
                logger.warning("publishing the running claims of node %s failed (%s); retrying", self._kube.node_name,
                               e, exc_info=not isinstance(e, errors.AgentError))  # fmt: skip
                delay = min(self._check_interval_s, 0.2 * 2**failures)
            if failures:
                stop.wait(delay)  # a failing API server: back off even when the ledger keeps changing
            else:
                self.wake.wait(delay)

    def _holding(self, rows: list[Allocation]) -> list[Allocation]:
        """The rows whose containers can still run (`card_sharing.holds_card`); the runtime is asked after
        the rows were read, so a container created since is in its answer or in no row."""
        states = None
        if self.list_containers is not None and any(row.container_id for row in rows):
            try:
                states = {container.id: container.exited for container in self.list_containers()}
            except Exception as e:  # no answer: every open row counts (never too little)
                logger.debug("listing the runtime's containers failed (%s); every open ledger row counts", e)
        return [row for row in rows if card_sharing.holds_card(row.container_id, states)]

    def publish_once(self) -> int:
        """Write every card whose published list differs from the ledger's; returns how many were written."""
        objects = self._objects()
        rows = None
        try:
            # Also without limits files: the ledger records the size each claim's allocation asks now, the size
            # usage and policing judge its containers by (issue 33.5).
            rows = limits_file.sync(self.limits, self._ledger, objects)
        except Exception as e:  # runningClaims keep reservations safe: publish them all the same
            where = self.limits.directory if self.limits is not None else "the ledger"
            logger.warning("keeping the claims' sizes in %s failed (%s); the next pass retries", where, e,
                           exc_info=not isinstance(e, (OSError, errors.AgentError)))
        if rows is None:
            rows = self._ledger.open_allocations()
        holding = self._holding(rows)
        wanted = running_claims(holding)
        # An unreadable checkpoint raises (the pass is retried): never publish "nothing prepared" on a guess.
        dra_held = prepared_claims(holding, self.prepared() if self.prepared is not None else ())
        written = 0
        for name, obj in sorted(objects.items()):
            uuid = str((obj.get("spec") or {}).get("uuid") or "").lower()
            status = obj.get("status") or {}
            changed: dict[str, Any] = {}
            if (status.get("runningClaims") or []) != (entries := wanted.get(uuid, [])):
                changed["runningClaims"] = entries
            if (status.get("preparedClaims") or []) != (claims := dra_held.get(uuid, [])):
                changed["preparedClaims"] = claims
            if not changed:
                continue
            try:
                answer = self._kube.patch_gpu_holders(name, changed)
            except errors.KubeNotFound:
                continue  # deleted meanwhile: inventory publishes it again, the next pass writes it
            self._remember(answer)
            self.writes += 1
            written += 1
            for field, listed in changed.items():
                logger.info("GPU %s: %s %s", name, field,
                            ", ".join(f"{e['namespace']}/{e['name']}" for e in listed) or "none")  # fmt: skip
        return written
