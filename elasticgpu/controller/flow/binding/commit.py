"""The reservation commit: writing and freeing capacity in the GPUs' `status.allocations`.

A PUT of a GPU's status with the resourceVersion the picture holds is the commit point of a
reservation (`binder`'s step 1): a 409 means someone else changed that card, and nothing of
ours was saved. Every answer goes back into the picture at once, so the next decision sees it.
Claims that provision a slice of one card are planned in a batch (`plan_slice`) and committed
with one PUT per card (`commit_batch`).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from elasticgpu.allocator import Placement, PlacementRequest
from elasticgpu.api import ElasticGPU, ElasticGPUClaim, ObjectReference
from elasticgpu.api.gpu import GPUPartition
from elasticgpu.controller import errors
from elasticgpu.controller.decisions import binder, groups, provisioned_names
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.binding.provisioner import claim_ref_of
from elasticgpu.controller.flow.machinery.workqueue import Key, WorkQueue
from elasticgpu.controller.flow.quota_guard import QuotaGuard
from elasticgpu.controller.picture.picture import Body, Picture
from elasticgpu.controller.picture.reservations import allocation_for
from elasticgpu.controller.settings import ControllerSettings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Planned:
    """A claim of a batch, planned on one card and tentatively reserved in the picture."""

    claim: ElasticGPUClaim
    decision: binder.Provision
    egpu_name: str
    placement: Placement


class Commit:
    """Writes reservations into GPUs and frees them (see the module docstring)."""

    def __init__(self, *, kube: KubeApi, picture: Picture, queue: WorkQueue, settings: ControllerSettings,
                 pool: ThreadPoolExecutor | None) -> None:
        """`pool`: threads for the batch's GPU writes (None: no batches)."""
        self.kube = kube
        self.picture = picture
        self.queue = queue
        self.settings = settings
        self._pool = pool
        self.quota: QuotaGuard | None = None
        """Charges each claim's reservation to its namespace's quotas first, when set."""
        self.kept_nodes: Callable[[], Mapping[str, str]] | None = None
        """Nodes kept for waiting claim groups (flow/groups/group_binding.py), when set: while any
        are, slices are planned by the ordinary sync, which avoids them."""

    def commit(self, key: str, placement: Placement, claim_ref: ObjectReference | None,
               partitions: Mapping[str, GPUPartition] | None = None) -> None:
        """Write the reservation into each card's allocations (PUT with its resourceVersion).
        On a conflict the cards already written are freed again and the conflict is raised.
        With a quota guard, the claim is charged first (raises `QuotaExceeded`, nothing reserved).
        A failed reservation keeps its charge: the other controller may be reserving for this
        claim on the strength of it (docs/quota.md); the resync drops it if nothing is reserved."""
        ledger = self.picture.ledger
        if self.quota is not None and claim_ref is not None and claim_ref.uid:
            self.quota.charge(claim_ref, placement)
        written: list[str] = []
        for share in placement.cards:
            gpu_name = ledger.name_of_uuid(share.uuid)
            try:
                with self.picture.lock:
                    partition = (partitions or {}).get(share.uuid)
                    body = ledger.with_allocation(gpu_name, allocation_for(key, share, claim_ref, partition))
                answer = self.kube.replace_gpu_status(body)
            except errors.CardOverfilled:
                for done in written:  # the picture is already newer than the plan: nothing to re-read
                    self.free_on(done, key)
                raise
            except (errors.Conflict, errors.Rejected):
                self.refresh_gpu(gpu_name)
                for done in written:
                    self.free_on(done, key)
                raise
            self.picture.gpu_written(answer)
            written.append(gpu_name)

    def refresh_gpu(self, gpu_name: str) -> None:
        """Read one GPU again (after a conflict) into the picture."""
        try:
            fresh = self.kube.get_gpu(gpu_name)
        except errors.NotFound:
            self.picture.forget_gpu(gpu_name)
            return
        self.picture.gpu_written(fresh)

    def free_on(self, gpu_name: str, key: str) -> None:
        """Remove `key`'s allocation from one GPU (re-reading on conflicts)."""
        ledger = self.picture.ledger
        for _attempt in range(self.settings.binding.conflict_retries):
            with self.picture.lock:
                if ledger.gpu(gpu_name) is None:
                    return
                body = ledger.without_allocation(gpu_name, key)
            if body is None:
                return
            try:
                answer = self.kube.replace_gpu_status(body)
            except errors.Conflict:
                self.refresh_gpu(gpu_name)
                continue
            except errors.NotFound:
                # A write's 404 is not proof (a proxy or a restarting server can answer it):
                # only a read that also finds nothing makes the card gone.
                self.refresh_gpu(gpu_name)
                continue
            self.queue.add_all(self.picture.gpu_written(answer, freed=True))
            return
        raise errors.BindingError(f"GPU {gpu_name}: could not free the reservation of {key}; retrying later")

    def free_reservation(self, key: str) -> None:
        """Free every allocation of `key`."""
        with self.picture.lock:
            holding = self.picture.ledger.gpus_holding(key)
        for gpu_name in holding:
            self.free_on(gpu_name, key)

    def holds_outside_spec(self, egpu: ElasticGPU) -> bool:
        """True when the GPUs hold `egpu` on a card its spec does not name."""
        cards = set(binder.cards_of(egpu))
        with self.picture.lock:
            held = self.picture.ledger.gpus_holding(egpu.metadata.name or "")
        return bool(cards) and any(g not in cards for g in held)

    def free_extra_cards(self, egpu: ElasticGPU) -> None:
        """Free the reservations of `egpu` on cards its spec does not name: they are what a
        controller that lost the race to create it had reserved."""
        name = egpu.metadata.name or ""
        cards = set(binder.cards_of(egpu))
        with self.picture.lock:
            extra = [g for g in self.picture.ledger.gpus_holding(name) if g not in cards]
        for gpu_name in extra:
            self.free_on(gpu_name, name)

    def stamp_claim_ref(self, egpu: ElasticGPU) -> None:
        """Make the allocations of a bound ElasticGPU name its claim (with uid), as a dynamic
        reservation does from the start. A static ElasticGPU was reserved while Available, with
        no claim; this write records who holds the capacity. A conflict leaves it to the next sync."""
        name = egpu.metadata.name or ""
        ref = egpu.spec.claim_ref
        if ref is None or not ref.uid:
            return
        ledger = self.picture.ledger
        with self.picture.lock:
            stale = [g for g in ledger.gpus_holding(name)
                     if (a := ledger.allocation(g, name)) is not None
                     and (a.claim_ref is None or a.claim_ref.uid != ref.uid)]
        for gpu_name in stale:
            with self.picture.lock:
                allocation = ledger.allocation(gpu_name, name)
                if allocation is None:
                    continue
                body = ledger.with_allocation(gpu_name, allocation.model_copy(update={"claim_ref": ref}))
            try:
                answer = self.kube.replace_gpu_status(body)
            except (errors.Conflict, errors.Rejected):
                self.refresh_gpu(gpu_name)
                self.queue.add(("egpu", name), delay_s=self.settings.binding.requeue_delay_s)
                continue
            self.picture.gpu_written(answer)

    def backoff(self, attempt: int) -> None:
        """A short, jittered pause before re-planning after a conflict (the other writer of the
        card is usually mid-bind: giving it a few ms lets the re-plan see its result)."""
        base = self.settings.binding.conflict_backoff_s
        if base > 0:
            time.sleep(random.uniform(0, base * (2 ** min(attempt, 4))))

    # -- batches -------------------------------------------------------------------------------

    def plan_slice(self, key: Key) -> Planned | None:
        """For a claim that provisions a slice of one card and holds nothing yet: its placement,
        tentatively reserved in the picture so the next claim of the batch sees it. None (and
        nothing changed) for anything else: the caller syncs it the ordinary way."""
        picture = self.picture
        if self.quota is not None and self.quota.limits(key[1], key[2]):
            return None  # a quota applies: charged one claim at a time by the ordinary sync
        if self.kept_nodes is not None and self.kept_nodes():
            return None  # room is kept for a claim group: the ordinary sync avoids it
        with picture.lock:
            claim = picture.claim(key[1], key[2])
            if claim is None or groups.group_name(claim):
                return None  # a group member is reserved with its group (flow/groups/group_binding.py)
            view = picture.view()
            decision = binder.decide_claim(claim, view)
            if not isinstance(decision, binder.Provision) or decision.request.cards > 1:
                return None
            klass = view.classes.get(decision.class_name)
            if klass is not None and klass.is_mig:
                return None  # a MIG instance is planned by the ordinary sync (flow/mig_binding.py)
            egpu_name = provisioned_names.provisioned_name(claim)
            if picture.ledger.held(egpu_name) is not None or egpu_name in picture.ledger.inventory.reservations:
                return None  # held, or its last tentative reservation is still being undone
            request = PlacementRequest(gpu=decision.request, models=decision.parameters.gpu_model,
                                       node_selector=decision.parameters.node_selector,
                                       isolation=decision.required_isolation)
            result = picture.ledger.place(request, policy=decision.parameters.policy)
            if not isinstance(result, Placement) or len(result.cards) != 1:
                return None
            picture.ledger.reserve_tentative(egpu_name, result)
        return Planned(claim, decision, egpu_name, result)

    def card_of(self, planned: Planned) -> str:
        """The GPU object name of a planned slice's card."""
        return self.picture.ledger.name_of_uuid(planned.placement.cards[0].uuid)

    def commit_batch(self, batch: dict[str, list[Planned]]) -> list[Planned]:
        """One GPU status write per card with all of its new reservations (the commit point of
        each), the cards in parallel; returns the claims committed. A card that conflicts commits
        none of its claims: their tentative reservations are dropped, the card re-read, and the
        claims requeued."""
        assert self._pool is not None
        ledger = self.picture.ledger

        def put(gpu_name: str) -> tuple[str, Body | Exception]:
            try:
                with self.picture.lock:
                    allocations = [allocation_for(p.egpu_name, p.placement.cards[0], claim_ref_of(p.claim))
                                   for p in batch[gpu_name]]
                    body = ledger.with_allocations(gpu_name, allocations)
                return gpu_name, self.kube.replace_gpu_status(body)
            except Exception as err:  # NotFound, a bug: nothing committed, the claims re-plan below
                return gpu_name, err

        committed: list[Planned] = []
        for gpu_name, answer in self._pool.map(put, list(batch)):
            planned = batch[gpu_name]
            if isinstance(answer, Exception):
                logger.debug("batched reservation on %s not committed, re-planning: %s", gpu_name, answer)
                with self.picture.lock:
                    for entry in planned:
                        ledger.drop_tentative(entry.egpu_name)
                if isinstance(answer, errors.Conflict | errors.Rejected):
                    self.refresh_gpu(gpu_name)
                for entry in planned:
                    self.queue.add(("claim", entry.claim.metadata.namespace or "", entry.claim.metadata.name or ""),
                                   delay_s=self.settings.binding.conflict_backoff_s * random.random())
                continue
            self.picture.gpu_written(answer)
            committed += planned
        return committed
