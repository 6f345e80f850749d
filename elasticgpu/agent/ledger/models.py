"""Tables of the agent's ledger (SQLAlchemy 2 typed ORM): allocations and usage samples.

The schema is changed only by the Alembic revisions in `migrations/versions/`; these models
describe the newest revision and are what `alembic revision --autogenerate` compares against.
Only `store.py` uses them: everyone else gets the frozen values `store.Allocation` and
`store.UsageSample`, never a row bound to a session.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Boolean, DateTime, Index, Integer, String, UniqueConstraint, false
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# The states of an allocation, in the order a container lives them.
STARTED = "started"  # recorded before the runtime's CreateContainer is called
CREATED = "created"  # the runtime answered with a container id
RELEASED = "released"  # the container was removed; kept for the record until pruned
STATES = (STARTED, CREATED, RELEASED)
OPEN_STATES = (STARTED, CREATED)

# What kind of claim a container uses (issue 48): ours, or a ResourceClaim our DRA driver prepared.
KIND_ELASTIC = "ElasticGPUClaim"
KIND_DRA = "ResourceClaim"


class Base(DeclarativeBase):
    """Declarative base of the ledger's tables."""


class AllocationRow(Base):
    """One injection of cards into one container."""

    __tablename__ = "allocations"
    __table_args__ = (Index("ix_allocations_state", "state"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    state: Mapped[str] = mapped_column(String(16))
    container_id: Mapped[str | None] = mapped_column(String(128), unique=True)
    pod_uid: Mapped[str] = mapped_column(String(64))
    pod_namespace: Mapped[str] = mapped_column(String(253))
    pod_name: Mapped[str] = mapped_column(String(253))
    container_name: Mapped[str] = mapped_column(String(253))
    claim_namespace: Mapped[str] = mapped_column(String(253))
    claim_name: Mapped[str] = mapped_column(String(253))
    elastic_gpu: Mapped[str] = mapped_column(String(253))
    gpu_uuids: Mapped[list[str]] = mapped_column(JSON)
    cores: Mapped[int] = mapped_column(Integer)
    memory_mib: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    released_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Resize (issue 17, docs/resize-node.md): whether the container was created with the claim's
    # limits file mounted (only then can a new size reach it while it runs), the size the GPU
    # objects last asked for, and the size its limits file says (None: not known / no file).
    limits_file: Mapped[bool] = mapped_column(Boolean, server_default=false())
    requested_cores: Mapped[int | None] = mapped_column(Integer)
    requested_memory_mib: Mapped[int | None] = mapped_column(Integer)
    applied_cores: Mapped[int | None] = mapped_column(Integer)
    applied_memory_mib: Mapped[int | None] = mapped_column(Integer)
    limits_changed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Issue 48: a DRA container's row names its ResourceClaim (claim_namespace/claim_name) and has no ElasticGPU
    # (elastic_gpu is the claim's uid); usage, policing and metrics see it, the controller's runningClaims do not.
    claim_kind: Mapped[str] = mapped_column(String(32), server_default=KIND_ELASTIC)


class UsageSampleRow(Base):
    """What one process used on one card at one moment, attributed to a container and claim when known."""

    __tablename__ = "usage_samples"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    taken_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    gpu_uuid: Mapped[str] = mapped_column(String(64))
    pid: Mapped[int] = mapped_column(Integer)
    memory_mib: Mapped[int] = mapped_column(Integer)
    sm_percent: Mapped[int | None] = mapped_column(Integer)
    container_id: Mapped[str | None] = mapped_column(String(128))
    claim_namespace: Mapped[str | None] = mapped_column(String(253))
    claim_name: Mapped[str | None] = mapped_column(String(253))


# The states of a MIG instance row (agent/mig/): recorded before NVML creates it, then created.
MIG_CREATING = "creating"
MIG_CREATED = "created"


class MigInstanceRow(Base):
    """One MIG instance the agent created for a claim (its ElasticGPU), at a start slice of a card."""

    __tablename__ = "mig_instances"
    __table_args__ = (UniqueConstraint("card_uuid", "start", name="uq_mig_instances_card_start"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    state: Mapped[str] = mapped_column(String(16))
    card_uuid: Mapped[str] = mapped_column(String(64))
    elastic_gpu: Mapped[str] = mapped_column(String(253), unique=True)
    profile: Mapped[str] = mapped_column(String(32))
    start: Mapped[int] = mapped_column(Integer)
    gpu_instance_id: Mapped[int | None] = mapped_column(Integer)
    mig_uuid: Mapped[str | None] = mapped_column(String(64))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
