"""Which namespaces have an ElasticGPUQuota, as the quota watch delivered it.

The quota guard asks this at every bind (`QuotaGuard.limits`): a namespace with no quota is bound
without reading quotas. Only names are kept (namespace -> its quotas' names), with the
resourceVersion each was seen at, so that a list read before a watch event never rolls it back;
the quotas themselves are read live at each charge (the charge is written against their
resourceVersions). `synced` says whether the answer can be trusted: a list worked and the watch
has not failed since; otherwise the guard falls back to listing quotas itself.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from elasticgpu.controller.picture import versions

QuotaKey = tuple[str, str]
"""(namespace, name) of an ElasticGPUQuota."""


class QuotaNamespaces:
    """Quota names by namespace; every method takes the picture's lock (given at construction)."""

    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock
        self._present: dict[str, set[str]] = {}
        """Quota names by namespace (only namespaces that have one)."""
        self._versions: dict[QuotaKey, int] = {}
        """resourceVersion each quota (or its deletion) was last seen at."""
        self.synced = False
        """A list of quotas worked and their watch has not failed since."""
        self._progress = -1
        """The highest resourceVersion the quota list and watch have delivered everything up to."""
        self._latest = -1
        """The highest resourceVersion the controller has seen of any object, by any list or watch."""
        self._checked: dict[str, int] = {}
        """Namespace -> resourceVersion up to which a live list found no quota there."""

    def put(self, key: QuotaKey, present: bool, *, version: int | None) -> None:
        """Take in quota `key` seen at `version` (present False: deleted); an older copy is ignored."""
        with self._lock:
            seen = self._versions.get(key)
            if version is not None and seen is not None and version < seen:
                return
            if version is not None:
                self._versions[key] = version
                self._progress = max(self._progress, version)
            self._set(key, present)

    def merge(self, listed: Mapping[QuotaKey, int | None], list_version: str) -> None:
        """Replace the quotas with a fresh list (resourceVersion by key, read at `list_version`),
        keeping what a watch delivered after the list's snapshot; the answer is then trusted."""
        with self._lock:
            for gone in set(self._versions) - set(listed):
                if not versions.version_after(self._versions[gone], list_version):
                    self._versions.pop(gone, None)
                    self._set(gone, False)
            for key, version in listed.items():
                self.put(key, True, version=version)
            self.synced = True
            if list_version.isdigit():
                self._progress = max(self._progress, int(list_version))

    def _set(self, key: QuotaKey, present: bool) -> None:
        namespace, name = key
        if present:
            self._present.setdefault(namespace, set()).add(name)
        elif namespace in self._present:
            self._present[namespace].discard(name)
            if not self._present[namespace]:
                del self._present[namespace]

    def mark(self, synced: bool) -> None:
        """The quota watch works (True) or failed (False)."""
        with self._lock:
            self.synced = synced

    def advance(self, version: int | None) -> None:
        """The quota watch is caught up to `version` (a bookmark)."""
        if version is not None:
            with self._lock:
                self._progress = max(self._progress, version)

    def saw(self, version: int | None) -> None:
        """The controller has seen an object (or a list) at `version`."""
        if version is not None:
            with self._lock:
                self._latest = max(self._latest, version)

    @property
    def latest(self) -> int:
        """The highest resourceVersion seen of any object (-1: none, or not integers)."""
        with self._lock:
            return self._latest

    def covers(self, namespace: str, version: int | None) -> bool:
        """Whether every quota of `namespace` written before resourceVersion `version` is known:
        the quota watch got that far, or a live list since did. True for an unknown version."""
        with self._lock:
            return version is None or version <= self._progress or version <= self._checked.get(namespace, -1)

    def checked(self, namespace: str, upto: int) -> None:
        """A live list found no quota in `namespace`, covering what was written up to `upto`."""
        with self._lock:
            self._checked[namespace] = max(self._checked.get(namespace, -1), upto)

    def limits(self, namespace: str) -> bool | None:
        """Whether `namespace` has a quota; None when that is not known (not `synced`)."""
        with self._lock:
            if not self.synced:
                return None
            return namespace in self._present
