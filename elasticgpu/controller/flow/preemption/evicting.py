"""Evicting: the pods of a preemption's victims, through the Eviction API, all of a plan or none.

A PodDisruptionBudget that allows no disruption answers an eviction 429. A tenant may create one (the
built-in `edit` role may), so a plan whose victims belong to several tenants must not evict some and be
stuck on another: the others would lose their cards and the preemptor still could not bind (issue 44
item 4). So every pod of a plan is first asked with a dry run (`dryRun: All`: the API server checks the
budgets and changes nothing); only when none is refused are the pods evicted, and a victim is failed only
when none of the plan's pods was refused. A budget that changes between the dry run and the eviction is
caught by the eviction itself (429): the victims are then not failed, and the next pass asks again.

Victims a budget protects are remembered for a while (`PROTECTED_S`) so that the next plan prefers
victims no budget protects (as kube-scheduler prefers victims whose eviction violates no budget); the
budget is honoured, never bypassed (issue 27).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable

from elasticgpu.api import ElasticGPUClaim
from elasticgpu.controller import errors
from elasticgpu.controller.decisions import release
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.picture.picture import Picture

PROTECTED_S = 60.0
"""Seconds a victim whose pods a budget protected is left out of new plans (then asked again)."""


class Evictions:
    """Evicts the pods that use victim claims, and remembers which victims a budget protects."""

    def __init__(self, *, kube: KubeApi, picture: Picture) -> None:
        self.kube = kube
        self.picture = picture
        self._lock = threading.Lock()
        self._protected: dict[str, float] = {}
        """ElasticGPU names of victims whose pods a budget protected -> until when (monotonic)."""

    def refused(self, victim: ElasticGPUClaim, *, dry_run: bool) -> list[str]:
        """Evict the running pods that use `victim` (with `dry_run`, only ask); the pods whose eviction a
        budget refused (429), as `namespace/name`."""
        namespace, name = victim.metadata.namespace or "", victim.metadata.name or ""
        with self.picture.lock:
            pods = [(user, self.picture.pods.pod(namespace, user))
                    for user in sorted(self.picture.pods_using(namespace, name))]
        refused: list[str] = []
        for user, body in pods:
            if body is None or not release.pod_is_running(body) or (body.get("metadata") or {}).get(
                    "deletionTimestamp"):
                continue  # gone, done, or already terminating
            uid = (body.get("metadata") or {}).get("uid")
            try:
                self.kube.evict_pod(namespace, user, uid=uid, dry_run=dry_run)
            except errors.EvictionBlocked:
                refused.append(f"{namespace}/{user}")
            except errors.Conflict:
                continue  # the uid precondition: that pod is gone, another of the name is not ours to evict
            except errors.NotFound:
                if not dry_run:
                    self._delete_without_eviction(namespace, user, uid)
                # a dry run: the pod is gone, or the server has no eviction subresource (no budget refuses)
        return refused

    def protect(self, keys: Iterable[str]) -> None:
        """Remember that a budget protects the victims of these ElasticGPUs (for `PROTECTED_S`)."""
        until = time.monotonic() + PROTECTED_S
        with self._lock:
            self._protected.update((key, until) for key in keys)

    def protected(self) -> set[str]:
        """The ElasticGPUs whose victims a budget protected lately."""
        now = time.monotonic()
        with self._lock:
            for key in [k for k, until in self._protected.items() if until <= now]:
                del self._protected[key]
            return set(self._protected)

    def _delete_without_eviction(self, namespace: str, name: str, uid: str | None) -> None:
        """A 404 from the eviction: the pod is gone, or the server has no eviction subresource (the test
        server): a live read tells which; a pod still there is deleted plainly."""
        try:
            self.kube.get_pod(namespace, name)
        except errors.NotFound:
            return
        with contextlib.suppress(errors.NotFound, errors.Conflict):
            self.kube.delete_pod(namespace, name, uid=uid)
