"""Repair: the periodic, level-based resync that fixes what no event will ever fix.

Every `ResyncSettings.interval_s` the keys that are not settled (a Pending claim, a key whose
last sync failed or wrote, `settled.SettledKeys`) are queued again on the queue's background
lane (behind the keys events queued), with a slice of the settled ones (each about once per
relist interval, at most `settled_walk_per_s` a second): the work at rest follows the changes,
not the number of objects (issue 49: every key each 30 s was ~3,300 syncs a second at 40,000
cards and 50,000 claims). Every `relist_interval_s` the picture is first compared with lists of
metadata and what differs is read and taken in (`metadata_relist`: what repairs a deletion no
watch delivered; full lists where `relist_by_metadata` is off), and the keys whose objects or
inputs that changed are unsettled (`Picture.input_versions` before and after). Reservations whose
ElasticGPU does not exist, older than the grace period, are freed after a live read confirms
the ElasticGPU is gone (`resync.find_orphans` decides which), unless their claim is still
binding (`resync.still_binding`) or the node's agent reports the claim running on the card
(`running_holders`: freeing it would give the card to a second claim while the first runs), while
that report is believed (its node exists, its heartbeat is fresh enough).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from elasticgpu.api import GPU
from elasticgpu.controller import errors
from elasticgpu.controller.decisions import resync, running_holders
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.binding.commit import Commit
from elasticgpu.controller.flow.machinery.informer import Informer
from elasticgpu.controller.flow.machinery.metadata_relist import MetadataRelist
from elasticgpu.controller.flow.machinery.workqueue import Key, WorkQueue
from elasticgpu.controller.picture.picture import Picture
from elasticgpu.controller.settings import GPUHealthSettings, ResyncSettings

logger = logging.getLogger(__name__)


class Repair:
    """The resync (see the module docstring)."""

    def __init__(self, *, kube: KubeApi, picture: Picture, queue: WorkQueue, informer: Informer, commit: Commit,
                 settings: ResyncSettings, gpu_health: GPUHealthSettings | None = None) -> None:
        """`gpu_health`: when the agents' running-claims reports expire (`running_holders`)."""
        self.kube = kube
        self.picture = picture
        self.queue = queue
        self.informer = informer
        self.commit = commit
        self.settings = settings
        self.gpu_health = gpu_health or GPUHealthSettings()
        self._kept_running: set[str] = set()  # orphans kept for a running holder, said once each
        self.metadata_relist = MetadataRelist(informer=informer)

    def resync(self, *, relist: bool = True) -> None:
        """Free orphan reservations past the grace period and requeue the keys that are not
        settled and a slice of those that are, behind the keys events queued; `relist`: bring the
        picture level with fresh lists first (`metadata_relist`). The orphans found in the picture
        are confirmed by a live read before anything is freed."""
        settled = self.queue.settled
        if relist and self.settings.relist_by_metadata:
            before: list[dict[Key, object]] = []
            # Taken only when the relist is about to change something: at rest nothing differs,
            # and two input_versions were most of a relist's CPU (bench/relist_cost.py).
            self.metadata_relist.relist(before_change=lambda: before.append(self.picture.input_versions()))
            if before:
                settled.relisted(before[0], self.picture.input_versions())
        elif relist:
            before_full = self.picture.input_versions()
            self.informer.relist(background=True, every=False)
            settled.relisted(before_full, self.picture.input_versions())
        walk = settled.walk_size(interval_s=self.settings.interval_s,
                                 relist_interval_s=self.settings.relist_interval_s,
                                 per_s=self.settings.settled_walk_per_s)
        for key in settled.to_look_at(walk=walk):
            self.queue.add(key, background=True)
        with self.picture.lock:
            drifted = self.picture.ledger.repair_inventory()
            orphans = resync.find_orphans(self.picture.ledger, elastic_gpus=set(self.picture.elastic_gpus()),
                                          now=datetime.now(UTC), grace_s=self.settings.orphan_grace_s)
        if drifted:
            # Not an expected race: a path that changes reservations left the allocator's
            # inventory unlike the GPU objects. Repaired here, said so that it gets found.
            logger.warning("the allocator's inventory disagreed with the GPU objects for %d reservation(s)"
                           " (%s); mirrored them again", len(drifted), ", ".join(sorted(drifted)[:5]))
        for orphan in orphans:
            if resync.still_binding(orphan, self.picture.claim):
                logger.debug("reservation %s has no ElasticGPU yet; its claim is still binding", orphan.key)
                continue
            with self.picture.lock:
                holders = running_holders.running(running_holders.holders_of(
                    orphan.key, claim_ref=orphan.claim_ref, gpu_names=orphan.gpu_names, gpus=self.picture.ledger.gpu,
                    expired=self._expired))
            if holders:
                if orphan.key not in self._kept_running:
                    self._kept_running.add(orphan.key)
                    logger.warning("reservation %s has no ElasticGPU but is kept: %s", orphan.key,
                                   running_holders.describe(holders))
                continue
            self._kept_running.discard(orphan.key)
            try:
                self.kube.get_elastic_gpu(orphan.key)
                continue  # it exists after all (created since the list)
            except errors.NotFound:
                pass
            logger.info("GPU %s: freeing reservation %s: its ElasticGPU does not exist",
                        ",".join(orphan.gpu_names), orphan.key)
            for gpu_name in orphan.gpu_names:
                self.commit.free_on(gpu_name, orphan.key)
        if self.commit.quota is not None:
            # After the orphans are freed: a quota is recomputed from the reservations that remain.
            self.commit.quota.resync()

    def _expired(self, gpu: GPU) -> str:
        """Why the running claims the agent reports on `gpu` are no longer believed, or ""."""
        return running_holders.expired_reason(gpu, now=time.time(),
                                              expire_after_s=self.gpu_health.running_claims_expire_s,
                                              node_gone_for_s=self.picture.nodes.gone_for(gpu))

    def run(self, stop: threading.Event, *, after: Callable[[], None] = lambda: None) -> None:
        """Resync every `interval_s`, relisting every `relist_interval_s`, until `stop` is set
        (both watch engines use it); `after` runs after each resync."""
        interval = self.settings.interval_s
        relist_every = self.settings.relist_interval_s
        last_relist = time.monotonic()
        said = ""
        while not stop.wait(interval):
            relist = time.monotonic() - last_relist >= relist_every
            try:
                self.resync(relist=relist)
                if relist:
                    last_relist = time.monotonic()
                after()
                said = ""
            except Exception as err:  # a failed resync must not end the loop; the next one retries
                said = self._say(err, interval, said)

    @staticmethod
    def _say(err: Exception, interval: float, said: str) -> str:
        """Log a failed resync once per reason (an unreachable server at DEBUG: `KubeApi`
        says that once); returns the reason now said."""
        reason = f"{type(err).__name__}: {err}"
        if reason == said or (isinstance(err, errors.ApiUnavailable) and err.status == 0):
            logger.debug("resync failed again; retrying in %.0fs: %s", interval, reason)
        elif isinstance(err, errors.ElasticGPUError):
            logger.warning("resync failed; retrying in %.0fs: %s", interval, err)
        else:
            logger.error("resync failed (a bug); retrying in %.0fs: %s", interval, reason, exc_info=err)
        return reason
