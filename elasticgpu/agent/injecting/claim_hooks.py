"""The proxy's hooks for claims: injection decisions, recorded in the ledger in two phases.

    prepare_create   claim of the container (injection.claim_of)
                     none  -> injection.decide (strip ours, NVIDIA_VISIBLE_DEVICES=void); no ledger
                     claim -> not reconciled yet: refused, retryable
                              under one lock: holders from the ledger (checked against the
                              runtime when another pod holds it), injection.decide, then the
                              card's other claims (card_sharing.check: a whole card serves one
                              claim, slices sum within the card), then
                              ledger.record_started  -> the row is `started` BEFORE the runtime call
                              (a front that knows the container's id before the runtime
                              creates it, NRI, records the row `created` at once: one write)
    created          ledger.mark_created(row, container id)    } after the runtime answered, off the
    removed          ledger.mark_released(container id)        } call's path, in order (see below)
    create_failed    ledger.roll_back(row); but when the call ended without the runtime's
                     answer (DEADLINE_EXCEEDED, CANCELLED, UNAVAILABLE) the container may exist:
                     the row stays `started` (it holds the claim) and a later reconcile settles it
    reconcile        under the lock, with a list of the containers taken under it (the caller's
                     list, made before the lock, may miss a container created since: its row
                     would be released while it runs); then
                     every `created` row whose container is gone -> released;
                     at start, also every `started` row (a crash between the ledger write and
                     the runtime's answer), later only the rows left open by an unanswered call
                     (once `settle_after_s` old): the runtime has the container (same pod uid,
                     container name and claim annotation, not in another row) -> created with
                     its id, else rolled back. Nothing lost, nothing stale.

The lock makes "nobody else holds the claim (or the card)" and "now we hold it" one step, so two
pods racing for one claim or one card cannot both pass. A ledger that cannot be written refuses the claim as retryable:
a device is never given without its record.

Only `started` must be durable before the runtime is called. `created` and `released` are
written by one background thread, in the order the runtime answered, so kubelet does not wait
for their disk flushes (a SQLite commit with synchronous=FULL waits for the journal, and so
for containerd's own writes: 2-4 ms each here). Losing them in a crash loses nothing: the
start-up reconciliation completes `started` rows and releases rows of gone containers. A
pending `created` leaves the row `started`, which counts as a holder, as it should.

The holders check reads the hooks' own picture of the open rows (kept with every write, rebuilt
from the ledger by each reconcile), not the database: one query fewer per CreateContainer.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass, replace
from typing import Any

import grpc

from elasticgpu.agent import isolation, rdma
from elasticgpu.agent.injecting import card_sharing, dra_containers, hooks, injection, limits_file
from elasticgpu.agent.ledger import models, store

log = logging.getLogger(__name__)

ISOLATION_WARNING_REASON = "IsolationWarning"
"""The Warning Event of a container its isolation mode serves less well than the pod expects (MPS: other uids)."""
# Codes with which a call can end before the runtime's answer: the container may exist.
_UNANSWERED = frozenset({grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE})


def with_limits(edit: injection.ContainerEdit, host_path: str, container_path: str) -> injection.ContainerEdit:
    """The edit with the claim's limits folder mounted read-only at `container_path` and its file named in
    the env; a mount or env of the spec at the same place is replaced (only the agent says what a claim's
    limits are)."""
    envs = tuple((k, v) for k, v in edit.envs if k != limits_file.ENV_LIMITS_FILE)
    return replace(
        edit,
        envs=(*envs, (limits_file.ENV_LIMITS_FILE, limits_file.CONTAINER_FILE)),
        mounts=(*(m for m in edit.mounts if m.container_path.rstrip("/") != container_path),
                isolation.Mount(container_path=container_path, host_path=host_path, readonly=True)),
    )


class ClaimHooks:
    """hooks.ContainerHooks for claims (see the module docstring)."""

    def __init__(
        self,
        *,
        view: injection.AgentView,
        ledger: store.LedgerStore,
        settings: injection.InjectionSettings | None = None,
        settle_after_s: float = 30.0,
        limits: limits_file.LimitsFiles | None = None,
        rooms: isolation.IsolationRooms | None = None,
        nics: rdma.RdmaRoom = rdma.NO_RDMA,
        dra_claims: Callable[[str], Sequence[dra_containers.DraClaim]] = lambda pod_uid: (),
    ) -> None:
        """`settle_after_s`: how long a row left open by an unanswered CreateContainer waits
        before a reconcile decides it (the runtime may still be creating the container);
        `limits`: the claims' limits files, mounted into every claim container (None: none, a
        running container then keeps the size it was created with); `rooms`: the node's isolation
        modes (None: only mode None, advisory); `nics`: the node's RDMA NICs (agent/rdma; default none);
        `dra_claims`: the ResourceClaims the DRA driver prepared for a pod, by its uid (its containers keep
        kubelet's devices, get their class's isolation and a ledger row: dra_containers.py)."""
        self._dra_claims = dra_claims
        self._nics = nics
        self._limits = limits
        self.rooms = rooms or isolation.IsolationRooms()
        self._view = view
        self._ledger = ledger
        self._settings = settings or injection.InjectionSettings()
        self._claim_lock = threading.Lock()
        self._list_containers: Callable[[], Sequence[hooks.RuntimeContainer]] | None = None
        # One thread: the writes after the runtime's answer keep their order (created before released).
        self._after = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger-after")
        # The open rows as the hooks know them (the ledger's, plus writes still queued): the
        # holders check reads this instead of querying the ledger on every CreateContainer.
        # Filled by the start-up reconcile, before which claims are refused. Lock order:
        # _claim_lock, then _memory_lock; queued writes are submitted under _memory_lock.
        self._open: dict[int, _OpenRow] = {}
        self._memory_lock = threading.Lock()
        self._settle_after_s = settle_after_s
        self._unsettled: dict[int, float] = {}  # row id -> monotonic time the call ended unanswered
        self.reconciled = threading.Event()
        """Set after the start-up reconciliation; claims are refused (retryable) before."""

    # --- hooks.ContainerHooks ---

    def attach_runtime(self, list_containers: Callable[[], Sequence[hooks.RuntimeContainer]]) -> None:
        """Keep the front's ListContainers for checking the holders of a claim."""
        self._list_containers = list_containers

    def prepare_create(self, request: injection.ContainerRequest) -> hooks.PreparedCreate:
        """Decide; for a claim, record `started` before the runtime is called. One pass: the request in,
        the container's one edit out (the front writes it in its own wire format)."""
        plain = request
        key = injection.claim_of(plain)
        if key is None:
            claims = self._dra_claims(plain.pod.uid)
            edit = injection.decide(plain, self._view, settings=self._settings,
                                    dra_devices=dra_containers.devices(claims))  # fmt: skip
            if mine := dra_containers.claims_of(plain, claims):
                return self._prepare_dra(plain, edit, mine)
            return hooks.PreparedCreate(edit=edit)
        if not self.reconciled.is_set():
            raise hooks.Refused(
                f"pod {plain.pod}, container {plain.container!r}: the elasticgpu agent on node "
                f"{self._view.node_name} is still matching its ledger with the runtime after a start; "
                "kubelet retries this container by itself",
                code=grpc.StatusCode.UNAVAILABLE,
            )
        with self._claim_lock:
            states: dict[str, bool] | None = None
            rows, states = self._live([row for row in self._open_rows() if row.claim == key and not row.dra], states)
            edit = injection.decide(plain, self._view, holders=[row.pod for row in rows], settings=self._settings,
                                    rooms=self.rooms, nics=self._nics)
            claim = edit.claim
            assert claim is not None  # decide gives a claim container its claim or refuses
            self._check_cards(plain, claim, states)
            self._prepare_isolation(plain, claim)
            files_lock = self._limits.lock if self._limits is not None else contextlib.nullcontext()
            with files_lock:  # the publisher must not remove the folder before the row names the claim
                limits = self._prepare_limits(plain, claim)
                row_id = self._record_started(plain, claim, limits)
            with self._memory_lock:
                self._open[row_id] = _OpenRow(
                    claim=key, pod=plain.pod, container_id=plain.container_id, gpus=claim.gpus, cores=claim.cores,
                    memory_mib=claim.memory_mib,
                )
        if limits is not None and self._limits is not None:
            edit = with_limits(edit, *self._limits.mount(claim.namespace, claim.name))
        return hooks.PreparedCreate(
            edit=edit,
            token=row_id,
            details={"claim": f"{claim.namespace}/{claim.name}", "devices": ",".join(edit.devices)},
        )

    def _prepare_isolation(self, plain: injection.ContainerRequest, claim: injection.ClaimInfo) -> None:
        """The node-side work of the claim's isolation mode (MPS: its card's daemon runs), before the row
        is recorded: a mode that cannot serve refuses the container with nothing to undo."""
        if (slice_ := injection.slice_of(claim, plain.pod, plain.container, user=plain.run_as_user)) is None:
            return
        try:
            warning = self.rooms.room(claim.isolation).prepare(slice_)
        except isolation.Unavailable as e:
            raise injection.unavailable(plain, claim, e) from e
        if warning is not None:  # the container starts; its pod says why it may wait (e.g. MPS of two uids)
            log.warning("pod %s: %s", plain.pod, warning)
            self._view.warn(plain.pod, ISOLATION_WARNING_REASON, f"pod {plain.pod}: {warning}")

    def _sync_isolation(self, containers: Sequence[hooks.RuntimeContainer] | None = None) -> None:
        """Tell the isolation modes which containers the runtime has (they undo what none needs)."""
        if containers is None:
            if self._list_containers is None:
                return
            try:
                containers = self._list_containers()
            except Exception:  # the runtime did not answer: the next removal or reconcile syncs
                log.info("could not list containers for the isolation modes; the next reconcile syncs them")
                return
        self.rooms.sync([isolation.RunningContainer(
            id=c.id, pod_uid=c.labels.get(injection.LABEL_POD_UID, ""), name=c.name,
            annotations=dict(c.annotations)) for c in containers])

    def _prepare_limits(self, plain: injection.ContainerRequest, claim: injection.ClaimInfo) -> tuple[int, int] | None:
        """The size the claim's limits file says, written if it has none (None: no file for this container)."""
        if self._limits is None:
            return None
        try:
            size = self._limits.prepare(claim.namespace, claim.name,
                                        limits_file.Size(claim.cores, claim.memory_mib), cards=len(claim.gpus))
        except OSError as e:
            # The container still gets its limits as environment; a resize waits for its restart.
            log.warning("pod %s, container %r: cannot write the limits file of claim %s/%s under %s (%s); the "
                        "container starts without it", plain.pod, plain.container, claim.namespace, claim.name,
                        self._limits.directory, e)  # fmt: skip
            return None
        return size.as_tuple()

    def _prepare_dra(self, plain: injection.ContainerRequest, passed: injection.ContainerEdit,
                     claims: Sequence[dra_containers.DraClaim]) -> hooks.PreparedCreate:
        """A container of ResourceClaims our DRA driver prepared (dra_containers.py): its class's isolation, and a
        ledger row `started` before the runtime is called, as for a claim of ours. A container of several such
        claims gets the row (and the room) of the first; every card of them is in the row."""
        if not self.reconciled.is_set():
            raise hooks.Refused(
                f"pod {plain.pod}, container {plain.container!r} ({claims[0]}): the elasticgpu agent on node "
                f"{self._view.node_name} is still matching its ledger with the runtime after a start; kubelet "
                "retries this container by itself", code=grpc.StatusCode.UNAVAILABLE)
        claim = claims[0]
        gpus = tuple(dict.fromkeys(uuid for c in claims for uuid in c.gpus))
        with self._claim_lock:
            contribution = None
            if (slice_ := dra_containers.slice_of(claim, plain)) is not None:
                subject = f"pod {plain.pod}, container {plain.container!r}: {claim}"
                try:
                    room = self.rooms.room(claim.isolation)
                    warning = room.prepare(slice_)
                    contribution = room.contribute(slice_)
                except isolation.Unavailable as e:
                    raise hooks.Refused(
                        f"{subject} is isolated by {claim.isolation} (its DeviceClass's config), which this node"
                        f" cannot provide now: {e.message}"
                        + ("; kubelet retries this container by itself" if e.retryable else
                           ". Ask the node's admin to install it, or give DRA cards here only to a DeviceClass"
                           " of a mode the node has"), code=grpc.StatusCode.UNAVAILABLE if e.retryable else
                        grpc.StatusCode.FAILED_PRECONDITION) from e  # fmt: skip
                if warning is not None:
                    log.warning("pod %s: %s", plain.pod, warning)
                    self._view.warn(plain.pod, ISOLATION_WARNING_REASON, f"pod {plain.pod}: {warning}")
            edit = dra_containers.edit(plain, passed, claim, contribution, gpus=gpus)
            row_id = self._record(plain, claim_namespace=claim.namespace, claim_name=claim.name,
                                  elastic_gpu=claim.uid, gpu_uuids=list(gpus), cores=claim.cores,
                                  memory_mib=claim.memory_mib, limits=None, claim_kind=models.KIND_DRA)  # fmt: skip
            with self._memory_lock:
                self._open[row_id] = _OpenRow(claim=(claim.namespace, claim.name), pod=plain.pod,
                                              container_id=plain.container_id, gpus=gpus, cores=claim.cores,
                                              memory_mib=claim.memory_mib, dra=True)  # fmt: skip
        return hooks.PreparedCreate(edit=edit, token=row_id, details={
            "resourceclaim": f"{claim.namespace}/{claim.name}", "isolation": claim.isolation})

    def _record_started(self, plain: injection.ContainerRequest, claim: injection.ClaimInfo,
                        limits: tuple[int, int] | None) -> int:
        return self._record(plain, claim_namespace=claim.namespace, claim_name=claim.name,
                            elastic_gpu=claim.elastic_gpu, gpu_uuids=list(claim.gpus), cores=claim.cores,
                            memory_mib=claim.memory_mib, limits=limits)  # fmt: skip

    def _record(self, plain: injection.ContainerRequest, **row: Any) -> int:
        """The container's ledger row, `started` (or `created` when the front knows its id); a ledger that
        cannot be written refuses the container as retryable."""
        try:
            return self._ledger.record_started(pod_uid=plain.pod.uid, pod_namespace=plain.pod.namespace,
                                               pod_name=plain.pod.name, container_name=plain.container,
                                               container_id=plain.container_id, **row)  # fmt: skip
        except Exception as e:
            log.exception("ledger write for %s/%s failed", plain.pod, plain.container)
            raise hooks.Refused(
                f"pod {plain.pod}, container {plain.container!r}: the elasticgpu agent cannot write its "
                f"ledger ({type(e).__name__}); no GPU is given without a record, kubelet retries",
                code=grpc.StatusCode.UNAVAILABLE,
            ) from e

    def created(self, prepared: hooks.PreparedCreate, container_id: str) -> None:
        """Complete the row, `created` with the container id (queued, see the module docstring)."""
        if prepared.token is not None:
            with self._memory_lock:
                if (row := self._open.get(prepared.token)) is not None:
                    if row.container_id == container_id:
                        return  # recorded `created` at once (the front named the id before the runtime's answer)
                    row.container_id = container_id
                self._after.submit(self._write, self._ledger.mark_created, prepared.token, container_id)

    def create_failed(self, prepared: hooks.PreparedCreate, code: grpc.StatusCode) -> None:
        """The runtime made no container: forget the `started` row (unless that is unknown)."""
        if prepared.token is None:
            return
        if code in _UNANSWERED:
            log.warning("CreateContainer for ledger row %s ended with %s: settled later", prepared.token, code.name)
            with self._claim_lock:
                self._unsettled[prepared.token] = time.monotonic()
            return
        with self._memory_lock:
            row = self._open.pop(prepared.token, None)
        if row is not None and row.container_id is not None:
            self._ledger.mark_released(row.container_id)  # recorded `created` at once: no longer `started`
        else:
            self._ledger.roll_back(prepared.token)

    def removed(self, container_id: str) -> None:
        """Release the container's row, queued after its `created` (a container without one is fine)."""
        with self._memory_lock:
            self._forget_container(container_id)
            self._after.submit(self._write, self._ledger.mark_released, container_id)
            self._after.submit(self._sync_isolation)  # e.g. the card's last MPS container: its daemon stops

    def flush(self) -> None:
        """Wait until every queued ledger write is done."""
        self._after.submit(lambda: None).result()

    def close(self) -> None:
        """Finish the queued writes and stop their thread (the agent is stopping)."""
        self._after.shutdown(wait=True)

    @staticmethod
    def _write(step: Callable[..., object], *args: object) -> None:
        try:
            step(*args)
        except Exception:
            log.exception("ledger write %s%s failed; the next reconciliation repairs it", step.__name__, args)

    def reconcile(self, containers: Sequence[hooks.RuntimeContainer], *, starting: bool) -> None:
        """Settle the ledger against the runtime's containers (see the module docstring)."""
        with self._claim_lock, self._memory_lock:
            self.flush()  # the queued created/released rows first, or they would look half-done
            if self._list_containers is not None:
                # The caller listed before it had the lock: a claim container created since (its
                # row `created`) would look gone and lose its row while it runs. Under both locks
                # no row is recorded and no `created` is queued, so every `created` row now in the
                # ledger has its container in this list unless the container is really gone.
                containers = self._list_containers()
            by_id = {container.id: container for container in containers}
            rows = self._ledger.open_allocations()
            taken = {row.container_id for row in rows if row.container_id}
            for row in rows:
                if row.state == "created":
                    if row.container_id not in by_id:
                        # OBSERVATION: the container is gone (its sandbox removed, or removed while we were down).
                        log.info("ledger row %s: container %s is gone; released", row.id, row.container_id)
                        self._ledger.mark_released(str(row.container_id))
                elif starting or self._ripe(row.id):
                    self._unsettled.pop(row.id, None)
                    match = self._container_of(row, containers, taken)
                    if match is None:
                        # OBSERVATION: crashed after the ledger write, before the runtime created anything.
                        log.info("ledger row %s (%s/%s %s): no container; rolled back",
                                 row.id, row.pod_namespace, row.pod_name, row.container_name)  # fmt: skip
                        self._ledger.roll_back(row.id)
                    else:
                        # OBSERVATION: crashed after the runtime created it, before we recorded its id.
                        log.info("ledger row %s: completed with container %s", row.id, match.id)
                        self._ledger.mark_created(row.id, match.id)
                        taken.add(match.id)
            self._open = {
                row.id: _OpenRow(
                    claim=(row.claim_namespace, row.claim_name),
                    pod=injection.PodRef(row.pod_namespace, row.pod_name, row.pod_uid),
                    container_id=row.container_id,
                    gpus=row.gpu_uuids,
                    cores=row.cores,
                    memory_mib=row.memory_mib,
                    dra=row.is_dra,
                )
                for row in self._ledger.open_allocations()
            }
            containers_now = containers
        self._sync_isolation(containers_now)
        if starting:
            self.reconciled.set()

    # --- helpers ---

    def _ripe(self, row_id: int) -> bool:
        """True for a row left open by an unanswered call long enough ago to be decided."""
        since = self._unsettled.get(row_id)
        return since is not None and time.monotonic() - since >= self._settle_after_s

    @staticmethod
    def _container_of(row: store.Allocation, containers: Sequence[hooks.RuntimeContainer],
                      taken: set[str]) -> hooks.RuntimeContainer | None:
        claim = f"{row.claim_namespace}/{row.claim_name}"
        # Only the agent writes either annotation (a pod's own is removed): a container of another kind of claim
        # of the same name is not this row's.
        marker = injection.RESOURCE_CLAIM_ANNOTATION if row.is_dra else injection.CLAIM_ANNOTATION
        candidates = [
            c
            for c in containers
            if c.id not in taken
            and c.labels.get(injection.LABEL_POD_UID) == row.pod_uid
            and c.name == row.container_name
            and c.annotations.get(marker) == claim
        ]
        return max(candidates, key=lambda c: c.created_at, default=None)

    def _forget_container(self, container_id: str) -> None:
        for row_id in [row_id for row_id, row in self._open.items() if row.container_id == container_id]:
            del self._open[row_id]

    def _open_rows(self) -> list[_OpenRow]:
        """Copies of the open rows (the caller holds the claim lock, not the memory lock)."""
        with self._memory_lock:
            return [replace(row) for row in self._open.values()]

    def _live(
        self, rows: list[_OpenRow], states: dict[str, bool] | None
    ) -> tuple[list[_OpenRow], dict[str, bool] | None]:
        """The rows that still hold their cards (less containers that exited or are gone), and the
        container states read for it (one ListContainers, passed back in to be used again)."""
        if states is None and self._list_containers is not None and any(row.container_id for row in rows):
            try:
                states = {c.id: c.exited for c in self._list_containers()}
            except Exception:  # the runtime did not answer: count every row (refusing is safe)
                log.warning("could not list containers to check the holders of claims and cards")
        live = []
        for row in rows:
            if card_sharing.holds_card(row.container_id, states):
                live.append(row)
            elif states is not None and row.container_id is not None and row.container_id not in states:
                self.removed(row.container_id)  # gone: its sandbox took it (an exited one waits for kubelet)
        return live, states

    def _check_cards(self, plain: injection.ContainerRequest, claim: injection.ClaimInfo,
                     states: dict[str, bool] | None) -> None:
        """Refuse when a card of `claim` is held by other claims beyond its capacity (card_sharing)."""
        wanted = {uuid.lower() for uuid in claim.gpus}
        key = (claim.namespace, claim.name)
        # A ResourceClaim's rows are on DRA's cards, which hold none of ours (docs/dra.md, one owner per card).
        rows = [row for row in self._open_rows()
                if not row.dra and row.claim != key and wanted & {uuid.lower() for uuid in row.gpus}]  # fmt: skip
        if not rows:
            return
        rows, _ = self._live(rows, states)
        merged: dict[tuple[str, str], card_sharing.Holder] = {}
        resized = self._limits.requested if self._limits is not None else {}
        for row in rows:
            if (size := resized.get(row.claim)) is not None:
                # Resized since its containers were created: the card holds what its allocation asks now
                # (after a shrink the controller may have given the freed part to this claim).
                row = replace(row, cores=size.cores, memory_mib=0 if size.cores >= 100 else size.memory_mib)
            known = merged.get(row.claim)
            pods = tuple(sorted({*(known.pods if known else ()), row.pod}, key=str))
            merged[row.claim] = card_sharing.Holder(
                namespace=row.claim[0], name=row.claim[1], pods=pods,
                gpus=tuple(dict.fromkeys((*(known.gpus if known else ()), *row.gpus))),
                cores=max(row.cores, known.cores if known else 0),
                memory_mib=max(row.memory_mib, known.memory_mib if known else 0),
            )  # fmt: skip
        cards = {uuid.lower(): card for uuid in claim.gpus if (card := self._view.card(uuid)) is not None}
        card_sharing.check(pod=plain.pod, container=plain.container, claim=claim, holders=list(merged.values()),
                           cards=cards)  # fmt: skip


@dataclass
class _OpenRow:
    """An open ledger row, as the holders check needs it."""

    claim: tuple[str, str]
    pod: injection.PodRef
    container_id: str | None
    gpus: tuple[str, ...] = ()  # uuids of the cards the row holds
    cores: int = 0  # percent of each card (100: whole)
    memory_mib: int = 0  # MiB of each card (0 for whole cards)
    dra: bool = False  # a ResourceClaim's (DRA's): never a holder of our claims or cards
