"""Resize decisions: the next step of a Bound claim whose requests differ from what its card
holds for it (issue 17, like PVC expansion). Pure: objects in, one step out.

# The protocol

A claim of a class with `allowClaimResize: true` is marked `status.resizable` when it binds;
the claim CRD's rule then lets `spec.resources.requests` change. The reservation on the claim's
card (`GPU.status.allocations[]`, key: its ElasticGPU) is the truth, as for a bind:

- expand   (some dimension grows): reserve the larger size on the SAME card, with the GPU's
           resourceVersion (the commit point of a bind); a 409 re-reads and decides again, so
           two controllers never oversubscribe. No room: the claim stays Bound at its old size
           with `Resizing=False` reason `NoRoomOnCard`, saying how much the card lacks.
           A change that grows one dimension and shrinks the other expands first (the larger
           of each), then shrinks.
- shrink   (every dimension at or below the reservation): refused while the claim's measured
           use (`status.usage`, the agent's) is above the new size (`ShrinkBlocked`). Else the
           allocation gets `limit` = the new size (reservation unchanged): the node's agent
           applies it to the running containers and reports `applied` in the GPU's
           `status.runningClaims`. Once `applied` is at or below the new size (or the claim
           runs nowhere on the card), the reservation shrinks to the new size and the limit goes.
           Until then the claim says `ResizePending`.
- settle   the reservation equals the request: the ElasticGPU's `status.capacity` and the
           claim's `status.capacity` / `allocatedResources` follow, the Resizing conditions go.

Whole cards: a change in the number of cards of a Bound claim (or between a share and whole
cards) is refused with `WholeCardResize`: a running container cannot take a new card (its device
list is fixed when it is created), so a new claim is the way.

MIG: a claim that holds a MIG instance (`status.partition`, a `partitioning: MIG` class) is
refused with `MIGResize` whenever its request leaves what the instance has: an instance's
profile is fixed when it is created, and another profile is another instance, so a new claim
is the way here too. A request that still maps to the instance's profile settles at its size.

# Crash cases

Each step is one write, and every decision starts from what the GPU holds: a crash after the
GPU write and before the ElasticGPU's or the claim's status is repaired by the next sync
(`Settle`); a crash after the limit is written is picked up from the limit.
"""

from __future__ import annotations

from dataclasses import dataclass

from elasticgpu.allocator.mig import claims as mig_claims
from elasticgpu.api import GPU, ElasticGPUClaim, GPUAllocation, GpuRequest, InvalidRequest, names
from elasticgpu.api.gpu import GPULimit

# Reasons of the Resizing / ResizePending conditions and of Events.
REASON_RESIZED = "Resized"
REASON_NO_ROOM = "NoRoomOnCard"
REASON_SHRINK_BLOCKED = "ShrinkBlocked"
REASON_WHOLE_CARD = "WholeCardResize"
REASON_MIG = "MIGResize"
REASON_INVALID = "InvalidResize"
REASON_WAITING_FOR_NODE = "WaitingForNode"
REASON_NOT_RESIZABLE = "NotResizable"  # what `plan --resize` says of a claim whose class forbids it

CONDITION_RESIZING = "Resizing"
CONDITION_PENDING = "ResizePending"


@dataclass(frozen=True)
class Size:
    """A size on one card: percent of its compute and MiB of its memory."""

    cores: int
    memory: int

    def fits_in(self, other: Size) -> bool:
        """True when neither dimension is above `other`'s."""
        return self.cores <= other.cores and self.memory <= other.memory

    def describe(self) -> str:
        """`30% cores, 10240 MiB`."""
        return f"{self.cores}% cores, {self.memory} MiB"


@dataclass(frozen=True)
class Settle:
    """The reservation is the request: make the statuses show it (writes only what differs)."""

    size: Size


@dataclass(frozen=True)
class Reserve:
    """Write the allocation as `size` with no limit (an expand, a finished shrink, or a shrink
    given up because the request went back up): the GPU write with its resourceVersion."""

    size: Size
    reason: str
    message: str


@dataclass(frozen=True)
class SetLimit:
    """Start a shrink: the allocation keeps its size and gets `limit` for the agent to apply."""

    limit: Size
    message: str


@dataclass(frozen=True)
class Refuse:
    """Stay Bound at the old size: `Resizing=False` with the reason and message."""

    reason: str
    message: str


@dataclass(frozen=True)
class WaitForNode:
    """The limit is written; the node has not applied it yet: `ResizePending`."""

    message: str


ResizeDecision = Settle | Reserve | SetLimit | Refuse | WaitForNode


def size_of(allocation: GPUAllocation) -> Size:
    """What an allocation reserves."""
    return Size(allocation.cores, allocation.memory)


def limit_of(allocation: GPUAllocation) -> Size | None:
    """The limit a shrink in progress put on the allocation, or None."""
    return None if allocation.limit is None else Size(allocation.limit.cores, allocation.limit.memory)


def as_limit(size: Size) -> GPULimit:
    """The `GPULimit` of a size (the allocation's `limit` field)."""
    return GPULimit(cores=size.cores, memory=size.memory)


def free_on(gpu: GPU) -> Size:
    """What the card has not reserved (for anyone)."""
    cores = sum(a.cores for a in gpu.status.allocations)
    memory = sum(a.memory for a in gpu.status.allocations)
    return Size(max(0, names.CORES_PER_CARD - cores), max(0, gpu.spec.memory - memory))


def applied_on(gpu: GPU, claim: ElasticGPUClaim) -> tuple[bool, Size | None]:
    """(runs, applied): whether the agent lists the claim running on the card, and the limit it
    reports in effect there (None when it does not know it yet)."""
    for entry in gpu.status.running_claims:
        same = (entry.uid == claim.metadata.uid) if entry.uid and claim.metadata.uid else (
            entry.namespace == claim.metadata.namespace and entry.name == claim.metadata.name)
        if same:
            applied = entry.applied
            return True, None if applied is None else Size(applied.cores, applied.memory)
    return False, None


def decide_resize(claim: ElasticGPUClaim, *, gpus: list[GPU], allocations: list[GPUAllocation]) -> ResizeDecision:
    """The next resize step of a Bound claim whose ElasticGPU holds `allocations` on `gpus`
    (same order; one each for a share, several for whole cards)."""
    name = f"claim {claim.metadata.namespace}/{claim.metadata.name}"
    try:
        request, _limit = claim.spec.gpu_request()
    except InvalidRequest as err:
        return Refuse(REASON_INVALID, f"{name}: {err}")
    partition = claim.status.partition
    if partition is not None:
        held = Size(partition.cores, partition.memory)
        size = mig_claims.size_on(request, card_model=gpus[0].spec.model, card_memory_mib=gpus[0].spec.memory) \
            if gpus else None
        if isinstance(size, mig_claims.MigSize) and size.profile.name == partition.profile:
            # OBSERVATION: the request still maps to the instance's profile: nothing to change.
            return Settle(Size(sum(a.cores for a in allocations), sum(a.memory for a in allocations)))
        return Refuse(REASON_MIG, f"{name}: holds MIG instance {partition.profile} ({held.describe()}), asks for"
                      f" {request.describe()}: a MIG instance cannot resize in place (its profile is fixed when it"
                      " is created); create a new claim and delete this one")
    whole = any(a.exclusive for a in allocations)
    if whole or request.is_whole or len(allocations) != 1:
        return _decide_whole(name, request, allocations)
    gpu, allocation = gpus[0], allocations[0]
    reserved = size_of(allocation)
    wanted = Size(request.cores, request.memory_on(gpu.spec.memory))
    limit = limit_of(allocation)
    if wanted == reserved:
        if limit is not None:
            # OBSERVATION: a shrink was under way and the request went back: drop the limit.
            return Reserve(reserved, REASON_RESIZED, f"{name}: shrink to {limit.describe()} given up; the request"
                           f" is back at {reserved.describe()}")
        return Settle(reserved)
    grown = Size(max(wanted.cores, reserved.cores), max(wanted.memory, reserved.memory))
    if grown != reserved:
        # OBSERVATION: the request grows (in at least one dimension): expand on the same card.
        free = free_on(gpu)
        lack = Size(max(0, grown.cores - reserved.cores - free.cores),
                    max(0, grown.memory - reserved.memory - free.memory))
        if lack != Size(0, 0):
            if limit is not None:
                return _give_up_shrink(name, limit, reserved)
            return Refuse(REASON_NO_ROOM, f"{name}: cannot expand to {wanted.describe()} on GPU"
                          f" {gpu.metadata.name}: the card lacks {lack.cores}% cores and {lack.memory} MiB"
                          f" (free: {free.describe()}); the claim stays at {reserved.describe()}")
        return Reserve(grown, REASON_RESIZED, f"{name}: expanded from {reserved.describe()} to {grown.describe()}"
                       f" on GPU {gpu.metadata.name}")
    # OBSERVATION: every dimension at or below the reservation: a shrink.
    if limit == wanted:
        runs, applied = applied_on(gpu, claim)
        if not runs or (applied is not None and applied.fits_in(wanted)):
            return Reserve(wanted, REASON_RESIZED, f"{name}: shrunk from {reserved.describe()} to"
                           f" {wanted.describe()} on GPU {gpu.metadata.name}"
                           + (f" (the node applied {applied.describe()})" if applied is not None else ""))
        now = applied.describe() if applied is not None else "not reported yet"
        return WaitForNode(f"{name}: shrink to {wanted.describe()} waits for node {gpu.spec.node_name} to apply"
                           f" the new limit (in effect: {now}); {reserved.describe()} stays reserved until then")
    usage = claim.status.usage
    if usage is not None and (usage.memory_used > wanted.memory or usage.cores_used > wanted.cores):
        if limit is not None:
            return _give_up_shrink(name, limit, reserved)
        return Refuse(REASON_SHRINK_BLOCKED, f"{name}: cannot shrink to {wanted.describe()}: it uses"
                      f" {usage.cores_used}% cores and {usage.memory_used} MiB (status.usage); the claim stays at"
                      f" {reserved.describe()}")
    return SetLimit(wanted, f"{name}: shrinking from {reserved.describe()} to {wanted.describe()}: the new limit"
                    f" goes to node {gpu.spec.node_name} first")


def _give_up_shrink(name: str, limit: Size, reserved: Size) -> Reserve:
    # A limit belongs to the request it was set for: a newer request that is refused must not
    # leave the node enforcing an older, smaller size. Dropped first; the refusal comes next.
    return Reserve(reserved, REASON_RESIZED, f"{name}: shrink to {limit.describe()} given up (the request changed);"
                   f" the limit is back at {reserved.describe()}")


def _decide_whole(name: str, request: GpuRequest, allocations: list[GPUAllocation]) -> ResizeDecision:
    held_cards = len(allocations) if all(a.exclusive for a in allocations) else 0
    if request.is_whole and request.cards == held_cards:
        # OBSERVATION: whole cards, same number: nothing to reserve (a whole card is all of it).
        return Settle(Size(sum(a.cores for a in allocations), sum(a.memory for a in allocations)))
    held = f"{held_cards} whole card(s)" if held_cards else f"a share ({size_of(allocations[0]).describe()})"
    wanted = f"{request.cards} whole card(s)" if request.is_whole else f"a share ({request.cores}% cores)"
    return Refuse(REASON_WHOLE_CARD, f"{name}: holds {held}, asks for {wanted}: the number of whole cards of a"
                  " Bound claim cannot change (a running container cannot take a new card); create a new claim"
                  " and delete this one")
