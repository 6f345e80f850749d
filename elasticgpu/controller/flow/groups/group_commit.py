"""The writes of a claim group commit attempt (gangs, issue 27; decisions in
`decisions/group_attempts.py`).

Each member's reservation is written as a single bind's is (one PUT of the GPU's status with
the resourceVersion the picture holds), with the attempt's record (`GPUAllocationGroup`). A
write never replaces a reservation of the same member that another attempt made on that card:
that is a lost race (`ForeignReservation`), not ours to overwrite. The attempt's fate is one
guarded write of the anchor's reservation (`decide`), and freeing is by attempt: only the
reservations that carry the token are removed (`release`), never another attempt's reservation
of the same member, which is what the reverted first version did (it freed by key).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import UTC, datetime

from elasticgpu.allocator import CardShare, Placement
from elasticgpu.api import GPUAllocation, ObjectReference, timestamps
from elasticgpu.api.gpu import GPUAllocationGroup, GroupAttemptState
from elasticgpu.controller import errors
from elasticgpu.controller.decisions.group_attempts import Entry
from elasticgpu.controller.flow.binding.commit import Commit
from elasticgpu.controller.picture.reservations import allocation_for

logger = logging.getLogger(__name__)


class ForeignReservation(errors.Conflict):
    """The card already holds this member's reservation from another attempt."""


class GroupCommit:
    """Reserves, decides and frees the reservations of claim group attempts."""

    def __init__(self, commit: Commit) -> None:
        self.commit = commit
        self.picture = commit.picture

    # -- reading -----------------------------------------------------------------------------------

    def entries(self, key: str, member: str) -> list[Entry]:
        """The reservations of member `member` (reservation key `key`) on the GPUs (call under
        the picture's lock)."""
        ledger = self.picture.ledger
        found = []
        for gpu_name in ledger.gpus_holding(key):
            allocation = ledger.allocation(gpu_name, key)
            if allocation is not None:
                found.append(Entry(gpu_name, key, member, allocation))
        return found

    def anchor(self, token: str, anchor_gpu: str, anchor: str) -> tuple[GPUAllocation, str, str, float] | None:
        """The anchor's reservation of attempt `token`: (it, its GPU, its key, its age in
        seconds), or None when the GPU holds none (call under the picture's lock)."""
        gpu = self.picture.ledger.gpu(anchor_gpu)
        if gpu is None:
            return None
        for allocation in gpu.status.allocations:
            group = allocation.group
            if group is not None and group.token == token and allocation.claim_ref is not None \
                    and allocation.claim_ref.name == anchor:
                return allocation, anchor_gpu, allocation.elastic_gpu, age_s(allocation)
        return None

    @staticmethod
    def placement_of(entries: Iterable[Entry], node_of: dict[str, tuple[str, str]]) -> Placement:
        """The placement the entries of one member make; `node_of`: GPU name -> (node, uuid)."""
        shares = []
        node = ""
        for entry in entries:
            node, uuid = node_of[entry.gpu]
            a = entry.allocation
            shares.append(CardShare(uuid=uuid, cores=a.cores, memory_mib=a.memory, whole=a.exclusive))
        return Placement(node=node, cards=tuple(shares))

    # -- writing -----------------------------------------------------------------------------------

    def reserve(self, key: str, placement: Placement, claim_ref: ObjectReference | None,
                record: GPUAllocationGroup) -> list[Entry]:
        """Write one member's reservation with the attempt's `record`: one guarded PUT per card,
        charged to quotas first (as `Commit.commit`). Returns what was written; on a failure the
        cards this call wrote are freed again and the error is raised (`ForeignReservation`,
        Conflict, Rejected, `QuotaExceeded`)."""
        commit = self.commit
        ledger = self.picture.ledger
        if commit.quota is not None and claim_ref is not None and claim_ref.uid:
            commit.quota.charge(claim_ref, placement)
        written: list[Entry] = []
        member = (claim_ref.name or "") if claim_ref is not None else ""
        for share in placement.cards:
            gpu_name = ledger.name_of_uuid(share.uuid)
            allocation = allocation_for(key, share, claim_ref).model_copy(update={"group": record})
            try:
                with self.picture.lock:
                    there = ledger.allocation(gpu_name, key)
                    if there is not None and (there.group is None or there.group.token != record.token):
                        raise ForeignReservation(f"GPU {gpu_name} holds {key} from another attempt")
                    body = ledger.with_allocation(gpu_name, allocation)  # CardOverfilled: the card changed
                answer = commit.kube.replace_gpu_status(body)
            except (ForeignReservation, errors.CardOverfilled):
                self.release(written)  # nothing sent: the picture is already as new as it gets
                raise
            except (errors.Conflict, errors.Rejected):
                commit.refresh_gpu(gpu_name)
                self.release(written)
                raise
            self.picture.gpu_written(answer)
            written.append(Entry(gpu_name, key, member, allocation))
        return written

    def decide(self, anchor_gpu: str, anchor_key: str, token: str, state: GroupAttemptState) -> str:
        """Turn attempt `token` from Committing to `state` by one guarded write of the anchor's
        reservation, re-reading on conflicts. Returns the state in force afterwards: `state`,
        the other end when someone decided first, or "Gone" when the anchor holds nothing of it."""
        commit = self.commit
        ledger = self.picture.ledger
        for _attempt in range(commit.settings.binding.conflict_retries):
            with self.picture.lock:
                allocation = ledger.allocation(anchor_gpu, anchor_key) if ledger.gpu(anchor_gpu) else None
                group = allocation.group if allocation is not None else None
                if allocation is None or group is None or group.token != token:
                    return "Gone"
                if group.state != "Committing":
                    return group.state
                changed = allocation.model_copy(update={"group": group.model_copy(update={"state": state})})
                body = ledger.with_allocation(anchor_gpu, changed)
            try:
                answer = commit.kube.replace_gpu_status(body)
            except (errors.Conflict, errors.NotFound):
                commit.refresh_gpu(anchor_gpu)
                continue
            self.picture.gpu_written(answer)
            logger.debug("claim group attempt %s: %s (anchor %s on %s)", token, state, anchor_key, anchor_gpu)
            return state
        raise errors.BindingError(f"GPU {anchor_gpu}: could not mark claim group attempt {token} {state};"
                                  " retrying later")

    def release(self, entries: Iterable[Entry]) -> None:
        """Free `entries`, each only while its card still holds it for the same attempt (by
        token: another attempt's reservation of the same member stays)."""
        commit = self.commit
        ledger = self.picture.ledger
        for entry in entries:
            for _attempt in range(commit.settings.binding.conflict_retries):
                with self.picture.lock:
                    there = ledger.allocation(entry.gpu, entry.key) if ledger.gpu(entry.gpu) else None
                    if there is None or (there.group.token if there.group else "") != entry.token:
                        break
                    body = ledger.without_allocation(entry.gpu, entry.key)
                if body is None:
                    break
                try:
                    answer = commit.kube.replace_gpu_status(body)
                except (errors.Conflict, errors.NotFound):
                    commit.refresh_gpu(entry.gpu)
                    continue
                commit.queue.add_all(self.picture.gpu_written(answer, freed=True))
                break
            else:
                raise errors.BindingError(f"GPU {entry.gpu}: could not free {entry.key} of claim group attempt"
                                          f" {entry.token or '(no record)'}; retrying later")


def age_s(allocation: GPUAllocation) -> float:
    """Seconds since `allocation` was written (infinite when it does not say)."""
    when = timestamps.parse(allocation.reserved_at)
    return (datetime.now(UTC) - when).total_seconds() if when is not None else float("inf")
