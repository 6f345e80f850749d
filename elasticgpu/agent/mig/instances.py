"""A claim's MIG instance: created before its first container, destroyed after its last holder.

Two-phase, like the CRI hook's injections (NVIDIA's DRA driver prepares the same way):

    ensure:  ledger row "creating" (card, start, profile)  ->  NVML creates the GPU instance
             (and its compute instance)  ->  row "created" with the instance's id and uuid
    release: NVML destroys the instance  ->  the row is deleted

A kill -9 at any step converges (`converge`, at start-up, with the claims that running
containers still hold):
- a "creating" row whose instance exists (killed after NVML, before the row said so) is
  adopted; one whose instance does not exist is forgotten (the next container creates it);
- a row nobody holds any more has its instance destroyed, then the row goes;
- a row a running container holds is kept, whatever its state (its instance is adopted);
- an instance the ledger does not know (an admin's carving) is left alone.
A destroy refused because a process still runs on the instance (`MigInUse`) keeps the row:
the next `converge` or `release` tries again.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from elasticgpu.agent import errors
from elasticgpu.agent.discovery.mig import MigControl, MigInstanceInfo
from elasticgpu.agent.ledger import models
from elasticgpu.agent.ledger.store import LedgerStore, MigRecord

logger = logging.getLogger(__name__)


class MigInstances:
    """The MIG instances of this node's claims, kept in step with the ledger."""

    def __init__(self, *, store: LedgerStore, backend: MigControl) -> None:
        self.store = store
        self.backend = backend

    def _find(self, record: MigRecord) -> MigInstanceInfo | None:
        for instance in self.backend.mig_instances(record.card_uuid):
            if instance.start == record.start and instance.profile == record.profile:
                return instance
        return None

    def ensure(self, *, elastic_gpu: str, card_uuid: str, profile: str, start: int) -> MigInstanceInfo:
        """The claim's instance, created when it does not exist yet. Raises the backend's
        `MigError` (nothing created; the "creating" row is forgotten) when NVML refuses."""
        record = self.store.record_mig_creating(card_uuid=card_uuid, elastic_gpu=elastic_gpu, profile=profile,
                                                start=start)
        if (record.card_uuid, record.profile, record.start) != (card_uuid, profile, start):
            raise errors.LedgerStateError(
                f"{elastic_gpu} holds MIG {record.profile} at slice {record.start} of {record.card_uuid}, not {profile}"
                f" at slice {start} of {card_uuid}: a MIG instance does not move; release it first")
        existing = self._find(record)
        if existing is None:
            try:
                existing = self.backend.create_mig_instance(card_uuid, profile=profile, start=start)
            except errors.MigError:
                self.store.forget_mig(record.id)
                raise
        if record.state != models.MIG_CREATED or record.gpu_instance_id != existing.gpu_instance_id:
            self.store.mark_mig_created(record.id, gpu_instance_id=existing.gpu_instance_id, mig_uuid=existing.uuid)
        return existing

    def release(self, elastic_gpu: str) -> bool:
        """Destroy the claim's instance and forget it; True when nothing of it is left. False while
        a process still runs on it (`MigInUse`): the row stays for the next try."""
        for record in self.store.mig_records():
            if record.elastic_gpu == elastic_gpu:
                return self._destroy(record)
        return True

    def _destroy(self, record: MigRecord) -> bool:
        instance = self._find(record)
        if instance is not None:
            try:
                self.backend.destroy_mig_instance(record.card_uuid, instance.gpu_instance_id)
            except errors.MigInUse as e:
                logger.info("MIG instance of %s kept for now: %s", record.elastic_gpu, e)
                return False
            except errors.MigNotFound:
                pass  # gone meanwhile: nothing left to destroy
        self.store.forget_mig(record.id)
        return True

    def converge(self, *, held: Collection[str]) -> None:
        """Bring the ledger and the cards in step after a restart; `held`: the ElasticGPUs that
        running containers hold (the CRI hook's open ledger rows)."""
        for record in self.store.mig_records():
            if record.elastic_gpu not in held:
                # OBSERVATION: nobody holds it (any more): whatever the state, the instance goes.
                self._destroy(record)
                continue
            instance = self._find(record)
            if instance is None:
                # OBSERVATION: held, but its instance is gone (never created, or destroyed by hand):
                # forget the row; the claim's next container creates it again.
                logger.warning("MIG instance of %s at slice %d of %s is missing; it is created again on the claim's"
                               " next container", record.elastic_gpu, record.start, record.card_uuid)
                self.store.forget_mig(record.id)
            elif record.state != models.MIG_CREATED:
                # OBSERVATION: killed after NVML created it, before the row said so: adopt it.
                self.store.mark_mig_created(record.id, gpu_instance_id=instance.gpu_instance_id,
                                            mig_uuid=instance.uuid)
