"""Containers of ResourceClaims our DRA driver prepared (issue 48): which claim a container carries, and
what the node hook adds to it.

Kubelet creates such a container with the CDI ids the driver answered at prepare: the card's
(`elasticgpu.io/gpu=<uuid>`) and the claim's own (`elasticgpu.io/claim=<uid>`, whose spec sets
NVIDIA_VISIBLE_DEVICES). The hook trusts only the driver's checkpoint for which claims were prepared for
which pod (`DraClaim`, one per completed claim reserved for the pod), never what the pod writes. Such a
container gets:

    isolation      for a slice whose DeviceClass names an enforcing mode (MPS, HAMiCore: `isolation`,
                   read at prepare from the class's opaque config, kept in the checkpoint), what that
                   mode's room contributes (isolation/base.py: the card's MPS pipe folder and per-client
                   limits, HAMi-core's preloaded library and limits), exactly as a slice of ours; its
                   annotations keep the card's MPS daemon up while the container lives (Room.sync)
    a marker       the annotation `elasticgpu.io/resource-claim: <namespace>/<name>`, which only the agent
                   writes (a pod's own is removed): the start-up reconcile matches a `started` ledger row to
                   its container by it
    a ledger row   (claim_hooks) of kind ResourceClaim: usage, policing and the metrics see the claim

Whole cards and mode None get no room: the claim's CDI spec already carries NVIDIA_VISIBLE_DEVICES (and
for a slice in mode None the advisory limits env, isolation/none.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from elasticgpu.agent import isolation
from elasticgpu.agent.injecting import injection
from elasticgpu.api import names

RESOURCE_CLAIM_ANNOTATION = injection.RESOURCE_CLAIM_ANNOTATION
ENFORCING_MODES = (isolation.MODE_MPS, isolation.MODE_HAMI_CORE)


@dataclass(frozen=True, kw_only=True)
class DraClaim:
    """A ResourceClaim the driver prepared for a pod, as the node hook needs it (from the checkpoint)."""

    uid: str
    namespace: str
    name: str
    cdi_ids: tuple[str, ...]  # every CDI id its prepare answered (cards' and the claim's own)
    gpus: tuple[str, ...]  # uuids of its cards, in its devices' order
    cores: int  # percent of each card it consumed (100: whole; the smallest over its devices)
    memory_mib: int  # MiB of each card it consumed (0: whole cards)
    isolation: str = isolation.MODE_NONE  # the DeviceClass's mode (None, MPS, HAMiCore)

    @property
    def whole_cards(self) -> bool:
        """True when the claim holds entire cards (nothing to enforce)."""
        return self.memory_mib == 0 and self.cores >= names.CORES_PER_CARD

    def __str__(self) -> str:
        return f"ResourceClaim {self.namespace}/{self.name}"


def devices(claims: Sequence[DraClaim]) -> frozenset[str]:
    """Every CDI id of `claims` (what the hook lets a container of their pod keep)."""
    return frozenset(cdi_id for claim in claims for cdi_id in claim.cdi_ids)


def claims_of(request: injection.ContainerRequest, claims: Sequence[DraClaim]) -> tuple[DraClaim, ...]:
    """The prepared claims whose devices the container carries, when it carries only prepared devices of ours
    (the rule of `injection.decide`'s pass-through); () for any other container."""
    asked = {d for d in request.cdi_devices if injection.is_ours(d)}
    if not asked or not asked <= devices(claims):
        return ()
    return tuple(sorted((c for c in claims if asked & set(c.cdi_ids)), key=lambda c: (c.namespace, c.name, c.uid)))


def slice_of(claim: DraClaim, request: injection.ContainerRequest) -> isolation.Slice | None:
    """The container as its claim's isolation mode sees it; None when no room applies (whole cards, mode None)."""
    if claim.whole_cards or claim.isolation not in ENFORCING_MODES:
        return None
    return isolation.Slice(claim=f"{claim.namespace}/{claim.name}", uuids=claim.gpus, cores=claim.cores,
                           memory_mib=claim.memory_mib, pod_uid=request.pod.uid, container=request.container,
                           user=request.run_as_user)  # fmt: skip


def edit(request: injection.ContainerRequest, passed: injection.ContainerEdit, claim: DraClaim,
         contribution: isolation.Contribution | None, *, gpus: Sequence[str] = ()) -> injection.ContainerEdit:
    """The container's edit: kubelet's devices, the marker, and the room's contribution when it has one (the
    env of ours the container has is then replaced: a tenant does not write its own limits). `gpus`: every card
    of the container's claims, its NVIDIA_VISIBLE_DEVICES (as the claims' CDI specs say: with NRI the env the
    core returns is the container's whole env, so it is written, not left out)."""
    envs = passed.envs
    if contribution is not None:
        visible = (injection.ENV_VISIBLE_DEVICES, ",".join(gpus or claim.gpus))
        envs = (*injection.without_ours(request)[0], visible, *contribution.envs)
    annotations = {**passed.annotations, **(contribution.annotations if contribution else {}),
                   RESOURCE_CLAIM_ANNOTATION: f"{claim.namespace}/{claim.name}"}  # fmt: skip
    return injection.ContainerEdit(envs=tuple(envs), cdi_devices=passed.cdi_devices, annotations=annotations,
                                   mounts=contribution.mounts if contribution else ())  # fmt: skip
