"""resourceVersions: which copy of an object is newer, and tombstones of deletions.

resourceVersions are opaque to clients, but every server we know writes integers; where one is
not, nothing is assumed: a copy counts as newer and no tombstone is kept. The picture
(`reconciling.Controller`) and the GPU ledger (`reservations.Ledger`) both decide with these.
"""

from __future__ import annotations

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
    mine, listed = version_of(body), _as_number(list_version)
    return mine is not None and listed is not None and mine > listed


class Tombstones(Generic[K]):
    """The resourceVersion of each deletion a watch delivered, by object key: a list read before
    the deletion, or a write answer that arrives after it, must not bring the object back."""

    def __init__(self) -> None:
        self._deleted_at: dict[K, int] = {}

    def bury(self, key: K, body: Body) -> None:
        """Remember the deletion of `key` (`body`: the DELETED event's object)."""
        version = version_of(body)
        if version is not None:
            self._deleted_at[key] = max(version, self._deleted_at.get(key, 0))

    def holds(self, key: K, body: Body) -> bool:
        """True when `body` is a version from before the deletion of `key`."""
        deleted_at = self._deleted_at.get(key)
        version = version_of(body)
        return deleted_at is not None and version is not None and version <= deleted_at

    def prune(self, list_version: str) -> None:
        """Forget the deletions a list taken at `list_version` has seen (it no longer holds them)."""
        listed = _as_number(list_version)
        if listed is not None:
            self._deleted_at = {k: v for k, v in self._deleted_at.items() if v > listed}
