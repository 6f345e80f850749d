"""resourceVersions: which copy of an object is newer, and tombstones of deletions.

resourceVersions are opaque to clients, but every server we know writes integers; where one is
not, nothing is assumed: a copy counts as newer and no tombstone is kept. The picture
(`reconciling.Controller`) and the GPU ledger (`reservations.Ledger`) both decide with these.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import Any, Generic, TypeVar

Body = dict[str, Any]
K = TypeVar("K", bound=Hashable)


def version_of(body: Body | None) -> int | None:
    """The resourceVersion as a number, or None (absent, or not an integer)."""
    value = str(((body or {}).get("metadata") or {}).get("resourceVersion", ""))
    return int(value) if value.isdigit() else None


def _as_number(list_version: str) -> int | None:
    return int(list_version) if list_version.isdigit() else None


def is_older(new: Body, old: Body) -> bool:
    """True when `new` is known to be an older version than `old`."""
    a, b = version_of(new), version_of(old)
    return a is not None and b is not None and a < b


def is_newer(new: Body, old: Body | None) -> bool:
    """False when `new` is known to be the same version as `old` or older. The answer of our own
    write and the watch event of it carry the same resourceVersion: the second is not parsed again."""
    if old is None:
        return True
    a, b = version_of(new), version_of(old)
    return not (a is not None and b is not None and a <= b)


def same_version(new: Body, old: Body | None) -> bool:
    """True when both carry the same (non-empty) resourceVersion."""
    version = new.get("metadata", {}).get("resourceVersion")
    return old is not None and bool(version) and version == old.get("metadata", {}).get("resourceVersion")


def changed_after(body: Body | None, list_version: str) -> bool:
    """True when `body` (from the picture) is newer than a list taken at `list_version`: it was
    created or changed after the list's snapshot, so its absence from the list proves nothing."""
    return version_after(version_of(body), list_version)


def deleted_at(body: Body, list_version: str) -> Body:
    """The picture's last copy of an object a fresh list no longer has, as a DELETED event carries
    it: at the resourceVersion of its deletion, which the list's bounds from above (a pod's copy at
    the version the picture already holds would be refused as not newer, its claims kept in use)."""
    if not list_version.isdigit():
        return body
    return {**body, "metadata": {**(body.get("metadata") or {}), "resourceVersion": list_version}}


def version_after(version: int | None, list_version: str) -> bool:
    """`changed_after` for a resourceVersion already parsed."""
    listed = _as_number(list_version)
    return version is not None and listed is not None and version > listed


TOMBSTONE_MAX_AGE_S = 900.0
"""Seconds a tombstone is kept at most. The copies it guards against are a list read before the
deletion (a list takes at most its 60 s timeout) and a write answer (10 s); a relist prunes them
sooner. The age bound keeps the map flat when no relist succeeds for a long time."""


class Tombstones(Generic[K]):
    """The resourceVersion of each deletion a watch delivered, by object key: a list read before
    the deletion, or a write answer that arrives after it, must not bring the object back.
    Forgotten when a newer list has seen the deletion, or after `max_age_s`."""

    def __init__(self, *, max_age_s: float = TOMBSTONE_MAX_AGE_S) -> None:
        self._max_age_s = max_age_s
        self._deleted_at: dict[K, tuple[int, float]] = {}
        """Deletion resourceVersion and burial time, oldest burial first (re-burial moves to the end)."""

    def bury(self, key: K, body: Body) -> None:
        """Remember the deletion of `key` (`body`: the DELETED event's object)."""
        version = version_of(body)
        if version is None:
            return
        now = time.monotonic()
        old = self._deleted_at.pop(key, None)
        self._deleted_at[key] = (max(version, old[0] if old else 0), now)
        self._expire(now)

    def _expire(self, now: float) -> None:
        # Oldest first: stop at the first one young enough (amortized O(1) per burial).
        while self._deleted_at:
            key, (_version, at) = next(iter(self._deleted_at.items()))
            if now - at <= self._max_age_s:
                return
            del self._deleted_at[key]

    def holds(self, key: K, body: Body) -> bool:
        """True when `body` is a version from before the deletion of `key`."""
        entry = self._deleted_at.get(key)
        version = version_of(body)
        return entry is not None and version is not None and version <= entry[0]

    def refuses(self, key: K, body: Body, *, held: Body | None) -> bool:
        """True when `body` must not be taken in: known older than the copy `held`, or a
        version from before the deletion of `key` (`holds`)."""
        return (held is not None and is_older(body, held)) or self.holds(key, body)

    def prune(self, list_version: str) -> None:
        """Forget the deletions a list taken at `list_version` has seen (it no longer holds them),
        and those older than `max_age_s`."""
        listed = _as_number(list_version)
        if listed is not None:
            self._deleted_at = {k: v for k, v in self._deleted_at.items() if v[0] > listed}
        self._expire(time.monotonic())

    def __len__(self) -> int:
        return len(self._deleted_at)
