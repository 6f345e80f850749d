"""Settings of the controller: one small dataclass per concern, combined in `ControllerSettings`.

Every field has a typed default and says its unit and why it has that value. They are built
once (from flags and environment by `run_controller`) and passed down; nothing reads the
environment elsewhere.
"""

from __future__ import annotations

import os
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
    """Seconds before a claim whose sync failed (API unavailable, too many conflicts) is retried;
    jittered by 0.5x..1.5x so that two controllers that conflicted do not retry in step."""
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


@dataclass(frozen=True, kw_only=True)
class WatchSettings:
    """How the controller learns of changes."""

    engine: str = "client"
    """"client": list+watch with the controller's own HTTP client (`watching.py`), cheap per
    event; "kopf": kopf's watches and lifecycle (`operator.py`), about 3x the CPU per event."""
    timeout_s: int = 60
    """Seconds a watch request stays open before the server ends it and it is reopened."""


@dataclass(frozen=True, kw_only=True)
class ResyncSettings:
    """The periodic, level-based repair."""

    interval_s: float = 30.0
    """Seconds between resyncs: every object is synced again from the picture (behind the keys
    events queued), orphan reservations are freed, claims whose ElasticGPU vanished become Lost."""
    relist_interval_s: float = 300.0
    """Seconds between relists: the resync first merges fresh lists of every kind into the
    picture. Watches keep the picture current; a relist repairs what no watch delivered (a
    deletion while a watch was down). Rarer than the resync: listing 50,000 claims costs the
    API server and the controller far more than requeueing them."""
    orphan_grace_s: float = 60.0
    """Seconds a reservation may exist on a GPU without its ElasticGPU before it is freed. It
    covers the gap between the commit point and the ElasticGPU's creation (and a crash there)."""


@dataclass(frozen=True, kw_only=True)
class ControllerSettings:
    """All settings of the controller."""

    api: ApiSettings = field(default_factory=ApiSettings)
    binding: BindingSettings = field(default_factory=BindingSettings)
    resync: ResyncSettings = field(default_factory=ResyncSettings)
    watch: WatchSettings = field(default_factory=WatchSettings)

    @staticmethod
    def environment_help() -> str:
        """The environment variables `from_env` reads, with their defaults (for `--help`)."""
        return (
            "settings from the environment (default): "
            f"ELASTICGPU_BINDING_WORKERS ({BindingSettings.workers}), "
            f"ELASTICGPU_RESYNC_INTERVAL_S ({ResyncSettings.interval_s:g}), "
            f"ELASTICGPU_RELIST_INTERVAL_S ({ResyncSettings.relist_interval_s:g}), "
            f"ELASTICGPU_ORPHAN_GRACE_S ({ResyncSettings.orphan_grace_s:g}), "
            f"ELASTICGPU_WATCH ({WatchSettings.engine}; or kopf)"
        )

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> ControllerSettings:
        """Settings with `ELASTICGPU_RESYNC_INTERVAL_S`, `ELASTICGPU_RELIST_INTERVAL_S`,
        `ELASTICGPU_ORPHAN_GRACE_S`, `ELASTICGPU_BINDING_WORKERS` and `ELASTICGPU_WATCH` read from
        the environment where set."""
        env = os.environ if environ is None else environ
        resync = ResyncSettings(
            interval_s=float(env.get("ELASTICGPU_RESYNC_INTERVAL_S", ResyncSettings.interval_s)),
            orphan_grace_s=float(env.get("ELASTICGPU_ORPHAN_GRACE_S", ResyncSettings.orphan_grace_s)),
            relist_interval_s=float(env.get("ELASTICGPU_RELIST_INTERVAL_S", ResyncSettings.relist_interval_s)),
        )
        binding = BindingSettings(workers=int(env.get("ELASTICGPU_BINDING_WORKERS", BindingSettings.workers)))
        watch = WatchSettings(engine=env.get("ELASTICGPU_WATCH", WatchSettings.engine))
        if watch.engine not in ("client", "kopf"):
            raise ValueError(f"ELASTICGPU_WATCH={watch.engine!r}: use client or kopf")
        return cls(binding=binding, resync=resync, watch=watch)
