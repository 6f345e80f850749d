"""The recommendation flow: feed a Bound share claim's `status.usage` into its in-memory window,
write `status.recommendation` (and one Event when the claim turns over- or under-sized), and with
`resizePolicy: Auto` patch the claim's own `spec.resources.requests` (the resizer then does the
work, as for a user's change). The rule is `decisions.recommend`'s; docs/recommendations.md.

Writes, each with the claim's resourceVersion: the claim's status only when the recommended
size or the state changes (not at every sample), the claim's spec on an Auto resize. A 409 (the
agent wrote the usage meanwhile) is quiet: the agent's write queues the claim again.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from elasticgpu.api import ElasticGPUClaim, InvalidRequest, names, timestamps
from elasticgpu.api.gpu_class import ElasticGPUClass
from elasticgpu.controller import errors
from elasticgpu.controller.decisions import bound_class, recommend
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.machinery.events import NORMAL, WARNING, EventRecorder
from elasticgpu.controller.flow.machinery.workqueue import WorkQueue
from elasticgpu.controller.picture.picture import Picture
from elasticgpu.controller.settings import ControllerSettings

logger = logging.getLogger(__name__)

_PRUNE_EVERY_S = 60.0
"""Seconds between two sweeps of the windows of claims that are gone (memory stays bounded by
the live claims even when nobody scrapes the gauges)."""


@dataclass(frozen=True)
class ClaimSizes:
    """One claim's figures for the gauges: requested, used (last sample), recommended (0: none yet)."""

    namespace: str
    name: str
    uid: str
    requested_cores: int
    requested_memory: int
    used_cores: int
    used_memory: int
    recommended_cores: int
    recommended_memory: int
    class_name: str = ""


class Recommender:
    """Recommends sizes for Bound share claims (see the module docstring)."""

    def __init__(self, *, kube: KubeApi, picture: Picture, queue: WorkQueue, events: EventRecorder,
                 settings: ControllerSettings) -> None:
        self.kube = kube
        self.picture = picture
        self.queue = queue
        self.events = events
        self.settings = settings.recommend
        self._lock = threading.Lock()  # workers sync different claims at once
        self._windows: dict[str, recommend.UsageWindow] = {}
        self._last_auto: dict[str, float] = {}
        self._sizes: dict[str, ClaimSizes] = {}
        self._looks: dict[str, float] = {}
        """The monotonic time of each claim's next look (`_look_later`), by uid."""
        self._pruned_at = time.monotonic()

    def sync(self, namespace: str, name: str, egpu_name: str) -> None:
        """Take in the claim's latest usage, write its recommendation, resize it under Auto."""
        with self.picture.lock:
            claim = self.picture.claim(namespace, name)
            egpu = self.picture.egpu(egpu_name)
            klass = bound_class.class_of(claim, egpu, self.picture.view().classes) if claim and egpu else None
            gpus = [g for n in self.picture.ledger.gpus_holding(egpu_name) if (g := self.picture.ledger.gpu(n))]
        uid = (claim.metadata.uid or "") if claim is not None else ""
        if claim is None or klass is None or klass.resize_policy == "Off" or len(gpus) != 1:
            self._forget(uid)
            if claim is not None and klass is not None and klass.resize_policy == "Off":
                self._clear(claim)  # turned Off: an old recommendation would mislead
            return
        try:
            request, _limit = claim.spec.gpu_request()
        except InvalidRequest:
            self._forget(uid)
            return
        if request.is_whole:
            self._forget(uid)  # a whole card is all of it: nothing to recommend
            return
        card_memory = gpus[0].spec.memory
        cores, memory = request.cores, request.memory_on(card_memory)
        now = time.monotonic()
        if now - self._pruned_at > _PRUNE_EVERY_S:
            # A deleted claim is never synced here again: its window goes with the next prune
            # (or the next scrape of the gauges, whichever comes first).
            self._pruned_at = now
            self.sizes()
        usage = claim.status.usage
        with self._lock:
            window = self._windows.setdefault(uid, recommend.UsageWindow(window_s=self.settings.window_s))
            if usage is not None and usage.update_time:
                window.add(recommend.Sample(now, usage.cores_used, usage.memory_used), key=usage.update_time)
            window.trim(now)
            samples = list(window.samples)
            watched = window.watched_s(now)
            last_auto = self._last_auto.get(uid)
            first_at = window.first_at if samples else None
        auto = klass.resize_policy == "Auto"
        settings = self.settings
        # When the answer below can change with time alone (no new sample): the oldest sample
        # but the last leaves the window, the watch grows long enough for one sample or for a
        # shrink, the Auto interval ends. The periodic resync no longer comes round to look.
        self._look_later(namespace, name, uid, now, [
            samples[1].at + settings.window_s if len(samples) > 1 else None,
            first_at + settings.min_watch_s if first_at is not None else None,
            first_at + settings.shrink_after_s if first_at is not None and auto else None,
            last_auto + settings.auto_interval_s if last_auto is not None and auto else None])
        bounds = self._bounds(klass, claim, card_memory)
        # A steady claim sends few samples (the agent writes on change): after a while, one will do.
        needed = self.settings.min_samples if watched < self.settings.min_watch_s else 1
        rec = recommend.recommend(samples, bounds=bounds, requested_cores=cores, requested_memory=memory,
                                  min_samples=needed)
        with self._lock:
            self._sizes[uid] = ClaimSizes(
                namespace, name, uid, cores, memory,
                usage.cores_used if usage else 0, usage.memory_used if usage else 0,
                rec.cores if rec else 0, rec.memory if rec else 0, klass.metadata.name or "")
        if rec is None:
            return
        self._show(claim, rec)
        if klass.resize_policy != "Auto" or not klass.allow_claim_resize or not claim.status.resizable:
            return
        since_auto = None if last_auto is None else now - last_auto
        target = recommend.auto_target(rec, bounds=bounds, requested_cores=cores, requested_memory=memory,
                                       watched_s=watched, since_last_auto_s=since_auto,
                                       min_interval_s=self.settings.auto_interval_s,
                                       shrink_after_s=self.settings.shrink_after_s)
        if target is not None:
            self._auto_resize(claim, target, rec)

    def observe(self, body: dict[str, Any]) -> None:
        """A claim as the watch delivered it: its usage sample goes into its window now, if the claim has one
        (a sync made it). The work queue coalesces a claim's changes, so a sync sees only the latest sample:
        on a busy controller the agent's samples in between were lost and the recommendation (and an Auto
        resize) depended on the controller's speed (issue 44: two controllers disagreed, a test never settled)."""
        uid = str((body.get("metadata") or {}).get("uid") or "")
        usage = (body.get("status") or {}).get("usage") or {}
        key = usage.get("updateTime")
        if not uid or not key:
            return
        try:
            sample = recommend.Sample(time.monotonic(), int(usage.get("coresUsed") or 0),
                                      int(usage.get("memoryUsed") or 0))
        except (TypeError, ValueError):
            return  # the sync reads it through the model, and says nothing either
        with self._lock:
            window = self._windows.get(uid)
            if window is not None:
                window.add(sample, key=str(key))

    def sizes(self) -> list[ClaimSizes]:
        """The figures of the claims still in the picture (for the gauges, read at each scrape);
        forgets the claims that are gone."""
        with self._lock:
            entries = list(self._sizes.values())
        kept = []
        for entry in entries:
            # The uid alone: building each claim's model here cost ~20 µs a claim at every scrape.
            if self.picture.claim_uid(entry.namespace, entry.name) == entry.uid:
                kept.append(entry)
            else:
                self._forget(entry.uid)
        return sorted(kept, key=lambda e: (e.namespace, e.name))

    def _look_later(self, namespace: str, name: str, uid: str, now: float, when: list[float | None]) -> None:
        """Queue the claim for a look at the earliest future moment of `when` (monotonic), unless a
        look is already due by then (one per moment, not one per sync)."""
        due = min((at for at in when if at is not None and at > now), default=None)
        if due is None:
            return
        with self._lock:
            pending = self._looks.get(uid)
            if pending is not None and now < pending <= due:
                return
            self._looks[uid] = due
        # A little after the moment: the look must find it passed.
        self.queue.add(("claim", namespace, name), delay_s=due - now + 1.0, recheck=True)

    def _forget(self, uid: str) -> None:
        with self._lock:
            self._looks.pop(uid, None)
            self._windows.pop(uid, None)
            self._last_auto.pop(uid, None)
            self._sizes.pop(uid, None)

    @staticmethod
    def _bounds(klass: ElasticGPUClass, claim: ElasticGPUClaim, card_memory: int) -> recommend.Bounds:
        low, high = klass.min_size, klass.max_size
        max_cores = high.cores if high else None
        max_memory = high.memory if high else None
        if claim.spec.resources.limits:
            # The claim's limits stay (immutable) and the requests may not exceed them.
            try:
                _request, limit = claim.spec.gpu_request()
            except InvalidRequest:
                limit = None
            if limit is not None:
                max_cores = min(max_cores or limit.cores, limit.cores)
                limit_memory = limit.memory_on(card_memory)
                max_memory = min(max_memory or limit_memory, limit_memory)
        return recommend.bounds(margin=klass.recommendation_margin, card_memory=card_memory,
                                min_cores=low.cores if low else None, max_cores=max_cores,
                                min_memory=low.memory if low else None, max_memory=max_memory)

    def _show(self, claim: ElasticGPUClaim, rec: recommend.Recommendation) -> None:
        """Write `status.recommendation` when the size or the state changed; one Event when the
        claim turns over- or under-sized."""
        old = claim.status.recommendation
        if old is not None and (old.cores, old.memory, old.state) == (rec.cores, rec.memory, rec.state):
            return
        since = old.since if old is not None and old.state == rec.state else timestamps.now_rfc3339()
        namespace, name = claim.metadata.namespace or "", claim.metadata.name or ""
        patch = {"metadata": {"resourceVersion": claim.metadata.resource_version},
                 "status": {"recommendation": {"cores": rec.cores, "memory": rec.memory, "state": rec.state,
                                               "reason": rec.message, "since": since}}}
        try:
            answer = self.kube.patch_claim_status(namespace, name, patch)
        except (errors.Conflict, errors.NotFound):
            return  # changed meanwhile (the agent's usage): its watch event syncs the claim again
        self.picture.put_claim(answer)
        if rec.state != recommend.RIGHT_SIZED and (old is None or old.state != rec.state):
            self.events.record(answer, type_=WARNING if rec.state == recommend.UNDER_SIZED else NORMAL,
                               reason=rec.state, message=f"claim {namespace}/{name} is {rec.state}: {rec.message}")

    def _clear(self, claim: ElasticGPUClaim) -> None:
        """Remove `status.recommendation` (the class's resizePolicy is Off now)."""
        if claim.status.recommendation is None:
            return
        patch = {"metadata": {"resourceVersion": claim.metadata.resource_version}, "status": {"recommendation": None}}
        try:
            answer = self.kube.patch_claim_status(claim.metadata.namespace or "", claim.metadata.name or "", patch)
        except (errors.Conflict, errors.NotFound):
            return  # changed meanwhile: its next sync clears it
        self.picture.put_claim(answer)

    def _auto_resize(self, claim: ElasticGPUClaim, target: tuple[int, int], rec: recommend.Recommendation) -> None:
        """Patch the claim's own requests to `target` (resizePolicy Auto); the resizer does the rest."""
        namespace, name = claim.metadata.namespace or "", claim.metadata.name or ""
        cores, memory = target
        requests = {names.RESOURCE_CORE: cores, names.RESOURCE_MEMORY: f"{memory}Mi"}
        patch = {"metadata": {"resourceVersion": claim.metadata.resource_version},
                 "spec": {"resources": {"requests": requests}}}
        try:
            answer = self.kube.patch_claim(namespace, name, patch)
        except (errors.Conflict, errors.NotFound):
            return  # changed meanwhile: decided again at its next sync
        except errors.Rejected as err:
            logger.warning("Auto resize of claim %s/%s refused by the API server: %s", namespace, name, err)
            return
        with self._lock:
            self._last_auto[claim.metadata.uid or ""] = time.monotonic()
        self.picture.put_claim(answer)
        self.events.record(answer, type_=NORMAL, reason=recommend.REASON_AUTO_RESIZED,
                           message=f"claim {namespace}/{name}: resizePolicy Auto set the requests to {cores}% cores,"
                           f" {memory} MiB ({rec.state}: {rec.message})")
