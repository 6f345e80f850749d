"""When to stop a claim's container for using more GPU memory than the claim reserved: pure.

One `Watch` per claim, advanced by `observe` with each usage sample and the claim's policy
(its class's `overLimitAction` and `overLimitGraceSeconds`, copied into the claim's status):

    under (or no limit)          -> the count restarts (over_since = None); nothing to do
    over, Warn                   -> counted; nothing to do (the claim's OverLimit condition and Event
                                    are the usage loop's, whatever the action)
    over, StopContainer,
      over for less than grace   -> counted; nothing to do
      over for grace or longer   -> Stop: the claim's containers that use the most memory, largest
                                    first, until what is left of the claim fits its reservation;
                                    never a container already stopped

"Over for the grace" means every sample from `over_since` to now was over: one sample under the
limit restarts the count, and one sample over never stops anything (unless the grace is 0).

The I/O (the runtime's StopContainer, the Event, the metric) is `enforcing.py`'s: it calls
`confirm` for each container the runtime stopped, so a container is stopped once. A failed
stop is not confirmed: the next sample decides the same Stop again, which is the retry. The
memory of a confirmed container still counts in the claim's figures until the driver lets go of
it, but it is not counted as still to be freed, so its last samples never stop a neighbour.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

Action = Literal["Warn", "StopContainer"]


@dataclass(frozen=True, kw_only=True)
class Policy:
    """What to do with a claim over its memory (the claim's `status.policing`)."""

    action: Action = "Warn"
    grace_s: float = 60.0
    """Seconds the claim must stay over, sample after sample, before StopContainer acts."""


WARN = Policy()
"""The policy of a claim whose status says nothing (bound before policing, or not read yet)."""


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One measurement of one claim."""

    at: float
    """When it was taken (seconds, from one clock for all of a claim's samples)."""
    limit_mib: int
    """The memory the claim reserved; 0: no limit (never over)."""
    containers: Mapping[str, int]
    """MiB of GPU memory each of the claim's containers uses (their processes' sum)."""

    @property
    def used_mib(self) -> int:
        """The claim's memory: all its containers'."""
        return sum(self.containers.values())

    @property
    def over(self) -> bool:
        """True when the claim uses more than it reserved."""
        return self.limit_mib > 0 and self.used_mib > self.limit_mib


@dataclass(frozen=True, kw_only=True)
class Stop:
    """Stop these containers (largest user first): the claim stayed over its memory for the grace."""

    containers: tuple[str, ...]
    used_mib: int
    limit_mib: int
    over_since: float


@dataclass(frozen=True, kw_only=True)
class Watch:
    """One claim's state: since when it is over (None: not over), the containers stopped for it."""

    over_since: float | None = None
    stopped: frozenset[str] = field(default_factory=frozenset)


def observe(watch: Watch, sample: Sample, policy: Policy) -> tuple[Watch, Stop | None]:
    """The claim's next state and what to stop now (None: nothing). See the module docstring."""
    if not sample.over:
        return replace(watch, over_since=None), None
    since = watch.over_since if watch.over_since is not None else sample.at
    watching = replace(watch, over_since=since)
    if policy.action != "StopContainer" or sample.at - since < policy.grace_s:
        return watching, None
    chosen = choose(sample.containers, limit_mib=sample.limit_mib, stopped=watch.stopped)
    if not chosen:
        return watching, None  # what is over belongs to containers already stopped: their memory is going
    return watching, Stop(containers=chosen, used_mib=sample.used_mib, limit_mib=sample.limit_mib, over_since=since)


def confirm(watch: Watch, container_id: str) -> Watch:
    """The runtime stopped `container_id` (or no longer knows it): never stop it again."""
    return replace(watch, stopped=watch.stopped | {container_id})


def choose(containers: Mapping[str, int], *, limit_mib: int, stopped: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """The fewest of the live containers, largest users first, whose stop brings the claim within
    `limit_mib`; () when the live ones already fit. Ties go by container id (stable)."""
    live = sorted(((mib, cid) for cid, mib in containers.items() if cid not in stopped and mib > 0),
                  key=lambda item: (-item[0], item[1]))
    left = sum(mib for mib, _ in live)
    chosen: list[str] = []
    for mib, cid in live:
        if left <= limit_mib:
            break
        chosen.append(cid)
        left -= mib
    return tuple(chosen)
