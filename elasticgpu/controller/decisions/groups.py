"""Claim groups (gangs, issue 27): which group a claim belongs to, and what a group waits for.

Pure: reads claims, answers decisions. A claim joins a group with the label
`elasticgpu.io/group: <name>`; `elasticgpu.io/group-min-members: "<n>"` (an annotation, or a
label) says how many members must exist before any is bound (default: 1, bind the members
that exist). Groups are per namespace.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from elasticgpu.api import ElasticGPUClaim, names

REASON_GROUP_DOES_NOT_FIT = "GroupDoesNotFit"
REASON_GROUP_INCOMPLETE = "GroupIncomplete"
REASON_INVALID_GROUP = "InvalidGroup"
MAX_MIN_MEMBERS = 1000
"""More members than this in one group is a typo (the gang is planned in one go)."""


@dataclass(frozen=True)
class Group:
    """A claim's group: its name and the members it needs before any is bound."""

    name: str
    min_members: int


@dataclass(frozen=True)
class InvalidGroup:
    """The group label or its minimum is malformed; the sentence names the field and the fix."""

    message: str


def group_name(claim: ElasticGPUClaim) -> str:
    """The claim's group name, "" when it belongs to none."""
    return (claim.metadata.labels or {}).get(names.LABEL_GROUP, "")


def group_of(claim: ElasticGPUClaim) -> Group | InvalidGroup | None:
    """The claim's group, None when it has none, or why its group fields are wrong."""
    name = group_name(claim)
    if not name:
        return None
    raw = (claim.metadata.annotations or {}).get(names.ANNOTATION_GROUP_MIN_MEMBERS)
    if raw is None:
        raw = (claim.metadata.labels or {}).get(names.ANNOTATION_GROUP_MIN_MEMBERS)
    if raw is None:
        return Group(name, 1)
    try:
        minimum = int(raw.strip())
    except ValueError:
        minimum = 0
    if not 1 <= minimum <= MAX_MIN_MEMBERS:
        return InvalidGroup(f"{names.ANNOTATION_GROUP_MIN_MEMBERS}={raw!r} of claim {claim.metadata.namespace}/"
                            f"{claim.metadata.name} is not a whole number from 1 to {MAX_MIN_MEMBERS}: set it to the"
                            f" number of members group {name} needs")
    return Group(name, minimum)


def incomplete(group: Group, members: Iterable[ElasticGPUClaim]) -> str:
    """Why the group waits for members ("" when enough exist). The minimum is the largest any
    member names, so members disagreeing never bind a smaller gang than one of them asked for."""
    count = 0
    needed = group.min_members
    for member in members:
        count += 1
        theirs = group_of(member)
        if isinstance(theirs, Group):
            needed = max(needed, theirs.min_members)
    if count >= needed:
        return ""
    return f"group {group.name} has {count} of {needed} members; none is bound until all {needed} exist"
