"""Claim group commit attempts (gangs, issue 27): what a reservation found on the GPUs means.

Pure: reads reservations, answers decisions. A controller reserves a claim group in one attempt
(a token of its own): every member's reservation carries the token, the attempt's anchor (the
member reserved first) and the GPU of the anchor's reservation, whose `state` decides the
attempt (`api.gpu.GPUAllocationGroup`). Committing becomes Complete (every member reserved: they
bind) or Aborted (rolled back) in one resourceVersion-guarded write of the anchor's reservation,
so two controllers can never disagree on an attempt's fate.

What another controller may do with an attempt follows from that (`judge`):

- Complete: keep it; its members bind.
- Aborted: free what is left of it (any controller: nobody binds an Aborted attempt).
- Committing, its owner's own (or one this process gave up on): abort it now.
- Committing, someone else's, younger than the grace: wait (the owner is mid-way; `GroupReserving`).
- Committing past the grace: its owner is dead or stuck; abort it (the anchor write decides
  against a late Complete of the owner, and the owner then frees its own).
- no anchor reservation ("Gone": the anchor's claim was deleted, or the reservation predates the
  attempt records): keep what an ElasticGPU was provisioned for, free the rest past the grace.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field
from typing import Literal

from elasticgpu.api import GPUAllocation

REASON_GROUP_RESERVING = "GroupReserving"

AttemptState = Literal["Committing", "Complete", "Aborted", "Gone"]


@dataclass(frozen=True)
class Entry:
    """One reservation of a group member on one GPU."""

    gpu: str
    key: str
    """The reservation key (the member's ElasticGPU name)."""
    member: str
    allocation: GPUAllocation

    @property
    def token(self) -> str:
        """The attempt's token; "" for a reservation that carries no attempt record."""
        return self.allocation.group.token if self.allocation.group is not None else ""


@dataclass(frozen=True)
class Attempt:
    """The reservations of one attempt found on the GPUs, and what its anchor says."""

    token: str
    state: AttemptState
    age_s: float
    """Seconds since the anchor's reservation was written (Gone: since the youngest entry)."""
    entries: tuple[Entry, ...] = field(default=())
    anchor_gpu: str = ""
    anchor_key: str = ""


Action = Literal["keep", "wait", "abort", "release"]


@dataclass(frozen=True)
class Judgement:
    """What to do with an attempt: `action`, and for "release" the entries to free, for "wait"
    how long (seconds) before looking again."""

    action: Action
    release: tuple[Entry, ...] = ()
    wait_s: float = 0.0


def attempts_of(entries: Iterable[Entry], anchors: Mapping[str, tuple[GPUAllocation, str, str, float]],
                ages: Mapping[tuple[str, str], float]) -> list[Attempt]:
    """Group `entries` by token. `anchors`: token -> (the anchor's reservation, its GPU, its key,
    its age in seconds), for the tokens whose anchor reservation exists; `ages`: (gpu, key) ->
    age of each entry. Sorted by token (deterministic)."""
    by_token: dict[str, list[Entry]] = {}
    for entry in entries:
        by_token.setdefault(entry.token, []).append(entry)
    found: list[Attempt] = []
    for token in sorted(by_token):
        members = tuple(by_token[token])
        anchor = anchors.get(token) if token else None
        if anchor is None or anchor[0].group is None:
            youngest = min((ages.get((e.gpu, e.key), float("inf")) for e in members), default=float("inf"))
            found.append(Attempt(token, "Gone", youngest, members))
            continue
        allocation, gpu, key, age = anchor
        assert allocation.group is not None
        found.append(Attempt(token, allocation.group.state, age, members, gpu, key))
    return found


def judge(attempt: Attempt, *, grace_s: float, ours: Set[str] = frozenset(),
          provisioned: Set[str] = frozenset()) -> Judgement:
    """What to do with `attempt` (see the module docstring). `ours`: tokens this process may
    abort at once (its own, given up on); `provisioned`: reservation keys whose ElasticGPU
    exists (a member that started binding)."""
    if attempt.state == "Complete":
        return Judgement("keep")
    if attempt.state == "Aborted":
        return Judgement("release", release=attempt.entries)
    if attempt.state == "Committing":
        if attempt.token in ours or attempt.age_s >= grace_s:
            return Judgement("abort")
        return Judgement("wait", wait_s=max(0.1, grace_s - attempt.age_s))
    # Gone: nothing decides it any more. What an ElasticGPU was provisioned for is a member
    # that bound (its group was Complete); the rest waits out the grace, then is freed.
    loose = tuple(e for e in attempt.entries if e.key not in provisioned)
    if not loose:
        return Judgement("keep")
    if attempt.age_s < grace_s:
        return Judgement("wait", wait_s=max(0.1, grace_s - attempt.age_s))
    return Judgement("release", release=loose)
