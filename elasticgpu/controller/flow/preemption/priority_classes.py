"""PriorityClasses (scheduling.k8s.io/v1) as the classes' `priorityClassName` names them.

Only a claim that cannot fit asks (preemption is rare), so there is no watch: each name is read with
a GET when first needed and kept for `TTL_S`; a missing PriorityClass is remembered as missing for
as long, and a failed read is not remembered at all (the next ask reads again).
"""

from __future__ import annotations

import threading
import time

from elasticgpu.controller import errors
from elasticgpu.controller.decisions.preemption import PriorityClassValue
from elasticgpu.controller.edge.kube import KubeApi

TTL_S = 30.0
"""Seconds a PriorityClass read (or found missing) is believed: a changed value applies within this."""


class PriorityClasses:
    """Reads PriorityClasses by name, with a short cache (see the module docstring)."""

    def __init__(self, kube: KubeApi, *, ttl_s: float = TTL_S) -> None:
        self.kube = kube
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, PriorityClassValue | None]] = {}

    def get(self, name: str) -> PriorityClassValue | None:
        """The PriorityClass `name` (value, preemptionPolicy), or None when it does not exist.
        Raises ApiError when it cannot be read now."""
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(name)
            if cached is not None and now - cached[0] <= self.ttl_s:
                return cached[1]
        try:
            body = self.kube.get_priority_class(name)
        except errors.NotFound:
            found: PriorityClassValue | None = None
        else:
            policy = str(body.get("preemptionPolicy") or "PreemptLowerPriority")
            found = PriorityClassValue(value=int(body.get("value") or 0), preempts=policy == "PreemptLowerPriority")
        with self._lock:
            self._cache[name] = (now, found)
        return found
