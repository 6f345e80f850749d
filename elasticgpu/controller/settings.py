"""Settings of the controller: one small dataclass per concern, combined in `ControllerSettings`.

Every field has a typed default and says its unit and why it has that value. They are built
once (from flags and environment by `run_controller`) and passed down; nothing reads the
environment elsewhere.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class ApiSettings:
    """How the controller talks to the API server."""

    field_manager: str = "elasticgpu-controller"
    """Field manager recorded in managedFields for every write."""
    request_timeout_s: float = 10.0
    """Seconds one API call may take before it counts as failed (ApiUnavailable)."""
    events_namespace: str = "default"
    """Namespace of the Events about cluster-scoped objects (ElasticGPUs, GPUs), as for PVs."""
    component: str = "elasticgpu-controller"
    """`source.component` / `reportingController` of the Events the controller writes."""


@dataclass(frozen=True, kw_only=True)
class BindingSettings:
    """How claims are bound."""

    conflict_retries: int = 8
    """How often one claim is re-planned after a resourceVersion conflict on a GPU before the
    sync gives up and requeues it. Conflicts are normal with two controllers on one card."""
    requeue_delay_s: float = 0.5
    """Seconds before a GPU whose allocations could not be stamped with the claim (a conflict)
    is looked at again. (A failed sync is retried with `RetrySettings`' backoff instead.)"""
    conflict_backoff_s: float = 0.005
    """Seconds of the first jittered pause before re-planning after a conflict on a GPU (doubling
    per attempt, at most 16x). Short: the conflicting card was re-read already; the pause only
    keeps two controllers from colliding again on the next attempt."""
    workers: int = 32
    """Threads that carry out the steps after the commit point (create the ElasticGPU, bind the
    claim) and, when above 0, a background Event writer. Decisions and reservations stay on one
    thread, so the picture never races itself. 0: every write inline on the binder thread.
    32: a bind is 4 writes in a row, each waiting on the API server; enough binds must be in
    flight to keep it busy (`bench/binding.py` on the test server: 53 claims/s with 4, 82 with 32)."""
    batch_size: int = 256
    """Most claims decided in one pass of the binder before their API writes are flushed."""
    background_batch_size: int = 16
    """Most keys of the resync's background lane synced in one pass: a claim created while a
    resync of every object is worked off waits for at most this many syncs (each well under
    a millisecond when nothing changed) before it is decided."""
    group_partial_grace_s: float = 30.0
    """Seconds a claim group may hold some members' reservations but not all (another
    controller mid-commit) before a sync that cannot complete it releases them (docs/gangs.md)."""
    group_reserve_after_s: float = 300.0
    """Seconds a claim group waits with GroupDoesNotFit before smaller claims stop being placed
    on the nodes its plan needs, so it is not starved for ever (docs/gangs.md). 0: never."""


@dataclass(frozen=True, kw_only=True)
class QuotaSettings:
    """How ElasticGPUQuotas are enforced (docs/quota.md)."""

    refresh_s: float = 2.0
    """Only while the quota watch is not working (no RBAC to watch quotas, a watch that just
    failed): seconds a list of every quota, which says which namespaces have one, is trusted.
    A claim of a namespace with none is bound without reading quotas, so a new quota applies
    within this time (the resync then charges what was bound before it)."""
    recheck_s: float = 2.0
    """Seconds before a claim kept Pending by a quota is checked again. The quota watch says only
    which namespaces have a quota and wakes no claim: a raised quota or a freed charge is found
    by this check."""


@dataclass(frozen=True, kw_only=True)
class RetrySettings:
    """How a key whose sync failed is retried: per-key exponential backoff, and a global token
    bucket over all retries, as client-go's default controller rate limiter does."""

    base_delay_s: float = 0.005
    """Seconds before the first retry of a key; doubled for each failure in a row (client-go's
    5 ms). Most failures are races (a 409, an object being deleted) that the next try settles."""
    max_delay_s: float = 60.0
    """Most seconds between two retries of one key (client-go: 1,000 s). A minute keeps a
    persistent error (a 403 from missing RBAC, a 422 the CRD refuses) at one try a minute,
    while a claim that was stuck behind an outage is retried within a minute of its end."""
    jitter: float = 0.5
    """Each delay is scaled by a random factor in 1 +- `jitter`: two controllers that
    conflicted on one object must not retry in step."""
    rate_per_s: float = 50.0
    """Retries per second over all keys once the burst is spent (client-go: 10): a failure
    that hits every object at once (the API server gone) cannot turn into a retry storm."""
    burst: int = 500
    """Retries that may go at once before `rate_per_s` applies (client-go: 100)."""


@dataclass(frozen=True, kw_only=True)
class WatchSettings:
    """How the controller learns of changes."""

    engine: str = "client"
    """"client": list+watch with the controller's own HTTP client (`watching.py`), cheap per
    event; "kopf": kopf's watches and lifecycle (`operator.py`), about 3x the CPU per event."""
    timeout_s: int = 60
    """Seconds a watch request stays open before the server ends it and it is reopened."""
    stuck_after_s: float = 180.0
    """Seconds without a step of a watch loop or of the worker loop after which the liveness
    check fails. A watch steps at least every `timeout_s` (plus its read timeout) even when
    nothing changes, and the worker every fraction of a second; an API server that is down is
    not "stuck" (every failed attempt is a step)."""


@dataclass(frozen=True, kw_only=True)
class ResyncSettings:
    """The periodic, level-based repair."""

    interval_s: float = 30.0
    """Seconds between resyncs: the objects not settled (`flow/machinery/settled.py`: a Pending
    claim, a failed or writing sync) are synced again from the picture (behind the keys events
    queued), with a slice of the settled ones; orphan reservations are freed."""
    relist_interval_s: float = 300.0
    """Seconds between relists: the resync first merges fresh lists of every kind into the
    picture. Watches keep the picture current; a relist repairs what no watch delivered (a
    deletion while a watch was down). Rarer than the resync: listing 50,000 claims costs the
    API server and the controller far more than requeueing them."""
    settled_walk_per_s: float = 50.0
    """Settled objects (their last sync found nothing to do, nothing changed since) looked at
    again per second at most: each resync walks a slice of them, all of them once per
    `relist_interval_s` up to this rate (50/s: 15,000 objects per 300 s; a fleet of 140,000
    takes ~47 minutes), so that what a bug left wrong is still repaired. 0: never."""
    orphan_grace_s: float = 60.0
    """Seconds a reservation may exist on a GPU without its ElasticGPU before it is freed. It
    covers the gap between the commit point and the ElasticGPU's creation (and a crash there)."""
    relist_by_metadata: bool = True
    """The periodic relist lists metadata only and reads whole just the objects the picture has
    wrong (`flow/machinery/metadata_relist.py`); False: full lists of every kind, as before (for
    a server that cannot answer PartialObjectMetadataList, and to compare the two)."""


@dataclass(frozen=True, kw_only=True)
class GPUHealthSettings:
    """How the controller reads the agents' heartbeats (`gpu_health`)."""

    heartbeat_grace_s: float = 120.0
    """Seconds without a heartbeat after which a GPU takes no new reservations (`Ready=False`,
    `HeartbeatExpired`). The agent beats every 30 s: four beats may be lost (an agent restart,
    a slow API server) before its cards are set aside."""
    running_claims_expire_s: float = 300.0
    """Seconds without a heartbeat after which the GPU's `status.runningClaims` (the claims its
    agent last reported running) are no longer believed: a released claim's reservation is
    freed instead of being kept for containers nobody can see any more. Five minutes, as the
    node lifecycle controller's eviction of a NotReady node's pods: far above an agent restart
    (the heartbeat is every 30 s), far below "for ever". The card takes no new reservations
    meanwhile anyway (`heartbeat_grace_s`). A GPU that never had a heartbeat is believed as it is."""
    node_gone_grace_s: float = 60.0
    """Seconds a GPU's Node may be missing (deleted) before the controller deletes the GPU object,
    as the pod garbage collector deletes the pods of a deleted Node (the agent also sets an
    ownerReference to its Node, which the cluster's garbage collector follows). A GPU of a missing
    Node has its `status.runningClaims` disbelieved at once."""


@dataclass(frozen=True, kw_only=True)
class OwnerMoveSettings:
    """How a card moves between our controller and DRA (`owner_move`, docs/dra.md)."""

    unpublish_grace_s: float = 10.0
    """Seconds a move from DRA back to ElasticGPU waits, counted from when it started waiting, before it
    may flip even with no ResourceClaim on the card: the driver drops the card from its ResourceSlice
    when spec.owner changes, and a scheduler that allocated from the slice it read just before writes its
    claim within this time (its cache lags by milliseconds). Far below any drain, so it costs nothing."""


@dataclass(frozen=True, kw_only=True)
class RecommendSettings:
    """Recommendations from measured use and `resizePolicy: Auto` (`decisions.recommend`)."""

    window_s: float = 3600.0
    """Seconds of `status.usage` samples the peak is taken over (kept in memory per claim)."""
    min_samples: int = 3
    """Samples (distinct agent updateTimes) needed before a recommendation is written: one
    reading says little, and after a restart the window starts empty."""
    min_watch_s: float = 300.0
    """Seconds of watching after which fewer than `min_samples` samples do: the agent writes
    only when the use changes, so a steady claim sends few."""
    auto_interval_s: float = 300.0
    """Seconds between two Auto resizes of one claim (with the margin band, the hysteresis
    that keeps Auto from flapping)."""
    shrink_after_s: float = 1800.0
    """Seconds the controller must have watched a claim before Auto shrinks it: a window that
    restarted empty must not shrink a claim from a few quiet minutes."""


@dataclass(frozen=True, kw_only=True)
class AutoscaleSettings:
    """Node autoscalers (docs/autoscaling.md): placeholder pods for claims that wait for capacity,
    and protection of the nodes whose cards hold claims."""

    enabled: bool = False
    """Keep placeholder pods for claims that wait NoCapacity (a node autoscaler adds their node).
    Off by default: on a cluster without a node autoscaler they would only wait."""
    protect_nodes: bool = False
    """Annotate nodes whose cards hold a reservation so that Karpenter and Cluster Autoscaler
    leave them; remove the annotations when they hold none. Needs `patch` on nodes."""
    namespace: str = "elasticgpu-system"
    """Namespace of the placeholder pods (the controller's own: tenants cannot touch them)."""
    resource: str = "nvidia.com/gpu"
    """The resource placeholders ask for, one per card: what the GPU node pools' templates offer
    and their nodes advertise."""
    image: str = "registry.k8s.io/pause:3.10"
    """The placeholders' image (does nothing; pulled only where a placeholder lands)."""
    priority_class: str = ""
    """PriorityClass of the placeholders ("": none). A negative one lets real pods preempt them."""
    interval_s: float = 10.0
    """Seconds between two passes (placeholders and node annotations are level-based)."""
    give_up_s: float = 900.0
    """Seconds a placeholder may stay unscheduled before its claims say NodeNotProvisioned (with
    a Warning Event). Karpenter launches in about a minute; Cluster Autoscaler's own
    max-node-provision-time is 15 minutes."""


@dataclass(frozen=True, kw_only=True)
class ControllerSettings:
    """All settings of the controller."""

    api: ApiSettings = field(default_factory=ApiSettings)
    binding: BindingSettings = field(default_factory=BindingSettings)
    resync: ResyncSettings = field(default_factory=ResyncSettings)
    retry: RetrySettings = field(default_factory=RetrySettings)
    watch: WatchSettings = field(default_factory=WatchSettings)
    gpu_health: GPUHealthSettings = field(default_factory=GPUHealthSettings)
    owner_move: OwnerMoveSettings = field(default_factory=OwnerMoveSettings)
    quota: QuotaSettings = field(default_factory=QuotaSettings)
    recommend: RecommendSettings = field(default_factory=RecommendSettings)
    autoscale: AutoscaleSettings = field(default_factory=AutoscaleSettings)

    @staticmethod
    def environment_help() -> str:
        """The environment variables `from_env` reads, with their defaults (for `--help`)."""
        return (
            "settings from the environment (default): "
            f"ELASTICGPU_BINDING_WORKERS ({BindingSettings.workers}), "
            f"ELASTICGPU_RESYNC_INTERVAL_S ({ResyncSettings.interval_s:g}), "
            f"ELASTICGPU_RELIST_INTERVAL_S ({ResyncSettings.relist_interval_s:g}), "
            f"ELASTICGPU_ORPHAN_GRACE_S ({ResyncSettings.orphan_grace_s:g}), "
            f"ELASTICGPU_SETTLED_WALK_PER_S ({ResyncSettings.settled_walk_per_s:g}), "
            f"ELASTICGPU_RELIST_BY_METADATA ({str(ResyncSettings.relist_by_metadata).lower()}), "
            f"ELASTICGPU_HEARTBEAT_GRACE_S ({GPUHealthSettings.heartbeat_grace_s:g}), "
            f"ELASTICGPU_RUNNING_CLAIMS_EXPIRE_S ({GPUHealthSettings.running_claims_expire_s:g}), "
            f"ELASTICGPU_NODE_GONE_GRACE_S ({GPUHealthSettings.node_gone_grace_s:g}), "
            f"ELASTICGPU_GROUP_PARTIAL_GRACE_S ({BindingSettings.group_partial_grace_s:g}), "
            f"ELASTICGPU_GROUP_RESERVE_AFTER_S ({BindingSettings.group_reserve_after_s:g}), "
            f"ELASTICGPU_OWNER_UNPUBLISH_GRACE_S ({OwnerMoveSettings.unpublish_grace_s:g}), "
            f"ELASTICGPU_WATCH ({WatchSettings.engine}; or kopf), "
            "ELASTICGPU_AUTOSCALE (false), ELASTICGPU_PROTECT_NODES (false), "
            f"ELASTICGPU_AUTOSCALE_RESOURCE ({AutoscaleSettings.resource}), "
            f"ELASTICGPU_AUTOSCALE_GIVE_UP_S ({AutoscaleSettings.give_up_s:g})"
        )

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> ControllerSettings:
        """Settings with `ELASTICGPU_RESYNC_INTERVAL_S`, `ELASTICGPU_RELIST_INTERVAL_S`,
        `ELASTICGPU_ORPHAN_GRACE_S`, `ELASTICGPU_HEARTBEAT_GRACE_S`, `ELASTICGPU_RUNNING_CLAIMS_EXPIRE_S`,
        `ELASTICGPU_NODE_GONE_GRACE_S`, `ELASTICGPU_BINDING_WORKERS`, `ELASTICGPU_OWNER_UNPUBLISH_GRACE_S`,
        `ELASTICGPU_RELIST_BY_METADATA` and
        `ELASTICGPU_WATCH` read from the environment where set."""
        env = os.environ if environ is None else environ
        resync = ResyncSettings(
            interval_s=float(env.get("ELASTICGPU_RESYNC_INTERVAL_S", ResyncSettings.interval_s)),
            orphan_grace_s=float(env.get("ELASTICGPU_ORPHAN_GRACE_S", ResyncSettings.orphan_grace_s)),
            relist_interval_s=float(env.get("ELASTICGPU_RELIST_INTERVAL_S", ResyncSettings.relist_interval_s)),
            settled_walk_per_s=float(env.get("ELASTICGPU_SETTLED_WALK_PER_S", ResyncSettings.settled_walk_per_s)),
            relist_by_metadata=_flag(env, "ELASTICGPU_RELIST_BY_METADATA", default=ResyncSettings.relist_by_metadata),
        )
        binding = BindingSettings(
            workers=int(env.get("ELASTICGPU_BINDING_WORKERS", BindingSettings.workers)),
            group_partial_grace_s=float(env.get("ELASTICGPU_GROUP_PARTIAL_GRACE_S",
                                                BindingSettings.group_partial_grace_s)),
            group_reserve_after_s=float(env.get("ELASTICGPU_GROUP_RESERVE_AFTER_S",
                                                BindingSettings.group_reserve_after_s)))
        watch = WatchSettings(engine=env.get("ELASTICGPU_WATCH", WatchSettings.engine))
        if watch.engine not in ("client", "kopf"):
            raise ValueError(f"ELASTICGPU_WATCH={watch.engine!r}: use client or kopf")
        gpu_health = GPUHealthSettings(
            heartbeat_grace_s=float(env.get("ELASTICGPU_HEARTBEAT_GRACE_S", GPUHealthSettings.heartbeat_grace_s)),
            running_claims_expire_s=float(env.get("ELASTICGPU_RUNNING_CLAIMS_EXPIRE_S",
                                                  GPUHealthSettings.running_claims_expire_s)),
            node_gone_grace_s=float(env.get("ELASTICGPU_NODE_GONE_GRACE_S", GPUHealthSettings.node_gone_grace_s)))
        if gpu_health.running_claims_expire_s < gpu_health.heartbeat_grace_s:
            # A report dropped while the card still takes reservations could give it to a second claim at once.
            raise ValueError(
                f"ELASTICGPU_RUNNING_CLAIMS_EXPIRE_S={gpu_health.running_claims_expire_s:g} is below"
                f" ELASTICGPU_HEARTBEAT_GRACE_S={gpu_health.heartbeat_grace_s:g}: the agent's reports must outlive"
                " the moment its card stops taking new reservations; raise it (default"
                f" {GPUHealthSettings.running_claims_expire_s:g})")
        owner_move = OwnerMoveSettings(unpublish_grace_s=float(env.get("ELASTICGPU_OWNER_UNPUBLISH_GRACE_S",
                                                                       OwnerMoveSettings.unpublish_grace_s)))
        autoscale = AutoscaleSettings(
            enabled=_flag(env, "ELASTICGPU_AUTOSCALE"), protect_nodes=_flag(env, "ELASTICGPU_PROTECT_NODES"),
            namespace=env.get("POD_NAMESPACE") or AutoscaleSettings.namespace,
            resource=env.get("ELASTICGPU_AUTOSCALE_RESOURCE", AutoscaleSettings.resource),
            image=env.get("ELASTICGPU_AUTOSCALE_IMAGE", AutoscaleSettings.image),
            priority_class=env.get("ELASTICGPU_AUTOSCALE_PRIORITY_CLASS", AutoscaleSettings.priority_class),
            give_up_s=float(env.get("ELASTICGPU_AUTOSCALE_GIVE_UP_S", AutoscaleSettings.give_up_s)))
        return cls(binding=binding, resync=resync, watch=watch, gpu_health=gpu_health, owner_move=owner_move,
                   autoscale=autoscale)


def _flag(env: Mapping[str, str], name: str, *, default: bool = False) -> bool:
    """A true/false variable (unset or empty: `default`); anything else is refused with the variable's name."""
    value = env.get(name, "").strip().lower()
    if value not in ("true", "false", "1", "0", ""):
        raise ValueError(f"{name}={value!r}: use true or false")
    return default if value == "" else value in ("true", "1")
