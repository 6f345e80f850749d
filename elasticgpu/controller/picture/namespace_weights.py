"""The FairShare weight of each namespace, as the Namespace watch delivered it.

Only what the bind order needs is kept: namespace -> weight (a float, already parsed by
`bind_order.parse_weight`; a namespace with no entry has weight 1) and the resourceVersion each
namespace was seen at, so that a list read before a watch event never rolls the weight back.
Namespace bodies are not kept: a cluster can have thousands and the picture needs one number.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from elasticgpu.controller.picture import versions


class NamespaceWeights:
    """Weights by namespace; every method takes the picture's lock (given at construction)."""

    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock
        self._weights: dict[str, float] = {}
        """Only the namespaces whose weight is not 1: the map the bind order reads."""
        self._versions: dict[str, int] = {}
        """resourceVersion each namespace (or its deletion) was last seen at."""

    def put(self, namespace: str, weight: float | None, *, version: int | None) -> bool:
        """Take in the weight of `namespace` seen at `version` (None weight: the namespace was
        deleted). A copy older than the one taken is ignored. Whether the weight changed."""
        with self._lock:
            seen = self._versions.get(namespace)
            if version is not None and seen is not None and version < seen:
                return False
            if version is not None:
                self._versions[namespace] = version
            before = self._weights.get(namespace, 1.0)
            if weight is None or weight == 1.0:
                self._weights.pop(namespace, None)
            else:
                self._weights[namespace] = weight
            return self._weights.get(namespace, 1.0) != before

    def merge(self, listed: Mapping[str, tuple[float, int | None]], list_version: str) -> None:
        """Replace the weights with a fresh list ((weight, resourceVersion) by namespace, read at
        `list_version`), keeping what a watch delivered after the list's snapshot."""
        with self._lock:
            for gone in set(self._versions) - set(listed):
                if not versions.version_after(self._versions[gone], list_version):
                    self._versions.pop(gone, None)
                    self._weights.pop(gone, None)
            for namespace, (weight, version) in listed.items():
                self.put(namespace, weight, version=version)

    def live(self) -> Mapping[str, float]:
        """The weights that are not 1, by namespace (the live map: read it under the lock)."""
        return self._weights

    def weight(self, namespace: str) -> float:
        """The weight of `namespace` (1 when none was set, or its value was bad)."""
        with self._lock:
            return self._weights.get(namespace, 1.0)
