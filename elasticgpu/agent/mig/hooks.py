"""The CRI hooks of MIG claims: the claim hooks, plus the claim's MIG instance around them.

`MigHooks` wraps the claim hooks (`cri.claim_hooks.ClaimHooks`) and leaves every decision of
theirs as it is; for a container of a claim with a `partition` (a `partitioning: MIG` class,
`status.partition`) it adds:

    prepare_create  after the claim hooks recorded the row `started`: the instance is ensured
                    at the committed profile and start (`instances.MigInstances`, two-phase in
                    the ledger), the instances' CDI spec written, and the container given the
                    instance: its CDI device besides the card's (whose device node and spec-wide
                    edits it needs), NVIDIA_VISIBLE_DEVICES=<MIG uuid>, no soft limits (MPS,
                    HAMi-core: the instance is the limit), and the annotation
                    `elasticgpu.io/mig-instance` (`cri/mig_annotation.py`: what a ledger rebuild
                    reads back, so a lost ledger neither destroys nor forgets the instance).
                    NVML refusing rolls the row back and refuses the container with NVML's reason.
    removed         after the claim hooks: when no open row holds the claim any more, its
                    instance is destroyed (a process still on it: kept, destroyed by a later
                    reconcile).
    reconcile       after the claim hooks: `converge` with the claims the open rows hold (at
                    start: a kill -9 at any step is settled; later: releases that waited).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import grpc

from elasticgpu.agent import errors
from elasticgpu.agent.discovery.mig import MigInstanceInfo
from elasticgpu.agent.discovery.models import Card
from elasticgpu.agent.injecting import claim_hooks, hooks, injection, mig_annotation
from elasticgpu.agent.ledger import models
from elasticgpu.agent.mig import cdi
from elasticgpu.agent.mig.instances import MigInstances

# What decide() gives a soft slice, which a MIG instance does not need (it is the limit itself).
_SOFT_LIMITS = (injection.ENV_MPS_THREADS, injection.ENV_MPS_MEMORY, injection.ENV_HAMI_SM)


class MigHooks:
    """hooks.ContainerHooks: the claim hooks, with MIG instances for MIG claims."""

    def __init__(self, *, inner: claim_hooks.ClaimHooks, view: injection.AgentView, instances: MigInstances,
                 cards: Callable[[], Sequence[Card]], cdi_dir: Path) -> None:
        """`cards`: discovery's cards now (for their device nodes); `cdi_dir`: where the runtime reads CDI specs."""
        self.inner = inner
        self._view = view
        self._instances = instances
        self._cards = cards
        self._cdi_dir = cdi_dir

    def attach_runtime(self, list_containers: Callable[[], Sequence[hooks.RuntimeContainer]]) -> None:
        """As the claim hooks."""
        self.inner.attach_runtime(list_containers)

    def prepare_create(self, request: injection.ContainerRequest) -> hooks.PreparedCreate:
        """The claim hooks' decision; for a MIG claim, its instance too (see the module docstring)."""
        prepared = self.inner.prepare_create(request)
        where = prepared.details.get("claim", "")
        if prepared.token is None or not where:
            return prepared
        namespace, _, name = where.partition("/")
        claim = self._view.claim(namespace, name)
        if claim is None or claim.partition is None or not claim.gpus:
            return prepared
        profile, start = claim.partition
        try:
            instance = self._instances.ensure(elastic_gpu=claim.elastic_gpu, card_uuid=claim.gpus[0], profile=profile,
                                              start=start)
            self._write_spec()
        except (errors.MigError, errors.LedgerError, OSError) as e:
            self.inner.create_failed(prepared, grpc.StatusCode.FAILED_PRECONDITION)  # the row goes
            raise hooks.Refused(f"claim {where}: the MIG instance {profile} at slice {start} of card {claim.gpus[0]}"
                                f" cannot be created: {e}") from e
        assert prepared.edit is not None  # a claim's container always has its edit
        prepared.edit = _give_instance(prepared.edit, instance, mig_annotation.MigAnnotation(
            uuid=instance.uuid, profile=profile, start=start, card=claim.gpus[0],
            gpu_instance_id=instance.gpu_instance_id, elastic_gpu=claim.elastic_gpu, cores=claim.cores,
            memory_mib=claim.memory_mib))
        prepared.details["mig"] = instance.uuid
        return prepared

    def _write_spec(self) -> None:
        cards = {card.uuid: card for card in self._cards()}
        devices = []
        for record in self._instances.store.mig_records():
            if record.state != models.MIG_CREATED or record.card_uuid not in cards:
                continue
            for instance in self._instances.backend.mig_instances(record.card_uuid):
                if instance.gpu_instance_id == record.gpu_instance_id:
                    devices.append(cdi.mig_device(instance, cards[record.card_uuid]))
        cdi.write_spec(self._cdi_dir, devices)

    def created(self, prepared: hooks.PreparedCreate, container_id: str) -> None:
        """As the claim hooks."""
        self.inner.created(prepared, container_id)

    def create_failed(self, prepared: hooks.PreparedCreate, code: grpc.StatusCode) -> None:
        """As the claim hooks (the instance stays until nobody holds the claim: the next try reuses it)."""
        self.inner.create_failed(prepared, code)

    def removed(self, container_id: str) -> None:
        """As the claim hooks; then the instances nobody holds any more go."""
        self.inner.removed(container_id)
        self._release_unheld()

    def reconcile(self, containers: Sequence[hooks.RuntimeContainer], *, starting: bool) -> None:
        """As the claim hooks; then the instances are brought in step with what is held."""
        self.inner.reconcile(containers, starting=starting)
        self._instances.converge(held=self._held())
        self._write_spec()

    def _held(self) -> set[str]:
        self.inner.flush()  # the rows' queued writes first: a released row must read released
        return {row.elastic_gpu for row in self._instances.store.open_allocations()}

    def _release_unheld(self) -> None:
        held = self._held()
        for record in self._instances.store.mig_records():
            if record.elastic_gpu not in held:
                self._instances.release(record.elastic_gpu)
        self._write_spec()


def _give_instance(edit: injection.ContainerEdit, instance: MigInstanceInfo,
                   named: mig_annotation.MigAnnotation) -> injection.ContainerEdit:
    """The edit with the instance's CDI device added, NVIDIA_VISIBLE_DEVICES pointed at it, the soft
    limits dropped, and the instance named in the container's annotations."""
    annotations = {**edit.annotations, mig_annotation.MIG_ANNOTATION: named.value()}
    envs = tuple((k, v) for k, v in edit.envs if k not in _SOFT_LIMITS and k != injection.ENV_VISIBLE_DEVICES
                 and not k.startswith(injection.ENV_HAMI_MEMORY_PREFIX))
    envs += ((injection.ENV_VISIBLE_DEVICES, instance.uuid),)
    name = injection.cdi_device(instance.uuid)
    if injection.CDI_ANNOTATION_KEY in annotations:
        annotations[injection.CDI_ANNOTATION_KEY] += f",{name}"
    cdi_devices = edit.cdi_devices
    if any(device.startswith(injection.CDI_KIND) for device in cdi_devices):
        cdi_devices += (name,)
    return replace(edit, envs=envs, annotations=annotations, cdi_devices=cdi_devices, devices=(*edit.devices, name))
