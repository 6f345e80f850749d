"""The ledger store: the only module of elasticgpu that talks to the agent's database.

Every injection of cards into a container is written here in two steps, before and after the
runtime's CreateContainer (the two-phase prepare of NVIDIA's DRA driver, in SQL):

    record_started (row "started", before the runtime is called)
        -> mark_created (the runtime answered with a container id)   -> mark_released (container removed)
        -> roll_back (the runtime refused or failed: the row is deleted)

A crash between the steps leaves a "started" row; on restart the agent matches the open rows
against the runtime's container list (the CRI hook's job). Each call is its own transaction,
committed before it returns: what a call returned survives a kill -9 of the agent (tested).

`LedgerStore.open` runs the Alembic migrations to the newest revision this code knows and
refuses, with `LedgerNewerThanCode`, a database that a newer agent migrated further.

SQLite (the default, one file per node) runs in WAL mode with synchronous=FULL: readers never
block the writer, and a committed transaction survives a crash of the process and of the machine.
Any other SQLAlchemy URL works too (PostgreSQL for a shared ledger, `sqlite://` in memory for tests).

Where the migration scripts are: the top-level `migrations/` of the repository is the source;
`elasticgpu/agent/ledger/migrations` is a symbolic link to it, so the scripts are found next to
this file in a checkout and in an editable install, and setuptools (which follows the link)
copies them into the wheel as package files at the same place. `ELASTICGPU_LEDGER_MIGRATIONS`
overrides the location.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import Engine, create_engine, delete, event, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from elasticgpu.agent import errors
from elasticgpu.agent.ledger import models
from elasticgpu.agent.settings import DEFAULT_LEDGER_URL

logger = logging.getLogger(__name__)

DEFAULT_URL = DEFAULT_LEDGER_URL
DRA_CLAIM_PREFIX = "resourceclaim/"
"""How usage, policing and the metrics name a ResourceClaim (`Allocation.claim_key`), as kubectl writes it."""


def migrations_dir() -> Path:
    """Folder of the Alembic scripts (env.py, versions/): the override, else the link beside this file."""
    override = os.environ.get("ELASTICGPU_LEDGER_MIGRATIONS")
    return Path(override) if override else Path(__file__).resolve().parent / "migrations"


def alembic_config(url: str) -> Config:
    """An Alembic configuration for the ledger at `url`, with the scripts of this code."""
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))  # configparser interpolates %
    return config


def head_revision() -> str:
    """The newest revision this code knows."""
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None, f"no Alembic revisions under {migrations_dir()}"
    return head


def _utc(value: datetime | None) -> datetime | None:
    # SQLite keeps no time zone: everything is written in UTC, so naive values read back are UTC.
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, kw_only=True)
class MigRecord:
    """One MIG instance row, as a plain value (agent/mig/)."""

    id: int
    state: str
    card_uuid: str
    elastic_gpu: str
    profile: str
    start: int
    gpu_instance_id: int | None
    mig_uuid: str | None

    @classmethod
    def from_row(cls, row: models.MigInstanceRow) -> MigRecord:
        """The value of an ORM row."""
        return cls(id=row.id, state=row.state, card_uuid=row.card_uuid, elastic_gpu=row.elastic_gpu,
                   profile=row.profile, start=row.start, gpu_instance_id=row.gpu_instance_id, mig_uuid=row.mig_uuid)


@dataclass(frozen=True, kw_only=True)
class Allocation:
    """One ledger row, as a plain value."""

    id: int
    state: str
    container_id: str | None
    pod_uid: str
    pod_namespace: str
    pod_name: str
    container_name: str
    claim_namespace: str
    claim_name: str
    elastic_gpu: str
    gpu_uuids: tuple[str, ...]
    cores: int
    memory_mib: int
    started_at: datetime
    created_at: datetime | None
    released_at: datetime | None
    limits_file: bool = False  # created with the claim's limits file mounted (docs/resize-node.md)
    requested_cores: int | None = None  # the size the GPU objects last asked for
    requested_memory_mib: int | None = None
    applied_cores: int | None = None  # the size the limits file says (None: no file, or not known)
    applied_memory_mib: int | None = None
    limits_changed_at: datetime | None = None
    claim_kind: str = models.KIND_ELASTIC  # KIND_DRA: a ResourceClaim our DRA driver prepared (issue 48)

    @property
    def is_dra(self) -> bool:
        """True for a container of a ResourceClaim (DRA's): not one of ours, the controller never hears of it."""
        return self.claim_kind == models.KIND_DRA

    @property
    def claim_key(self) -> tuple[str, str]:
        """(namespace, name) by which usage, policing and the metrics know the row's claim: a ResourceClaim's
        name is `resourceclaim/<name>` there (a name has no `/`: it never meets an ElasticGPUClaim's)."""
        if self.is_dra:
            return self.claim_namespace, f"{DRA_CLAIM_PREFIX}{self.claim_name}"
        return self.claim_namespace, self.claim_name

    @property
    def applied(self) -> tuple[int, int] | None:
        """(cores, memory MiB) in effect in the container through its limits file, or None."""
        if not self.limits_file or self.applied_cores is None or self.applied_memory_mib is None:
            return None
        return self.applied_cores, self.applied_memory_mib

    @property
    def requested(self) -> tuple[int, int] | None:
        """(cores, memory MiB) the GPU objects last asked of the container, or None (not recorded yet)."""
        if self.requested_cores is None or self.requested_memory_mib is None:
            return None
        return self.requested_cores, self.requested_memory_mib

    @property
    def size_now(self) -> tuple[int, int]:
        """(cores, memory MiB) the container may use now: the one notion of a claim's size for the card check,
        usage, policing and metrics (issue 33.5). The size its allocation asks now, as the controller wrote it on
        the claim's cards (GPU `status.allocations`: its `limit` during a shrink, else its cores and memory;
        recorded on the row by the running-claims pass, `requested_*`), else the size the container was created
        with (no pass has seen the allocation yet)."""
        return self.requested if self.requested is not None else (self.cores, self.memory_mib)

    @classmethod
    def from_row(cls, row: models.AllocationRow) -> Allocation:
        """The value of an ORM row."""
        started = _utc(row.started_at)
        assert started is not None
        return cls(
            id=row.id, state=row.state, container_id=row.container_id, pod_uid=row.pod_uid,
            pod_namespace=row.pod_namespace, pod_name=row.pod_name, container_name=row.container_name,
            claim_namespace=row.claim_namespace, claim_name=row.claim_name, elastic_gpu=row.elastic_gpu,
            gpu_uuids=tuple(row.gpu_uuids), cores=row.cores, memory_mib=row.memory_mib, started_at=started,
            created_at=_utc(row.created_at), released_at=_utc(row.released_at), limits_file=bool(row.limits_file),
            requested_cores=row.requested_cores, requested_memory_mib=row.requested_memory_mib,
            applied_cores=row.applied_cores, applied_memory_mib=row.applied_memory_mib,
            limits_changed_at=_utc(row.limits_changed_at), claim_kind=row.claim_kind or models.KIND_ELASTIC,
        )


@dataclass(frozen=True, kw_only=True)
class UsageSample:
    """What one process used on one card at one moment, attributed when the container is known."""

    taken_at: datetime
    gpu_uuid: str
    pid: int
    memory_mib: int
    sm_percent: int | None = None
    container_id: str | None = None
    claim_namespace: str | None = None
    claim_name: str | None = None


def _set_sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # WAL: the CRI hook's writes never wait for a reader (metrics, usage). FULL: a commit is on disk
    # when it returns, so a crash of the machine, not only of the process, loses nothing committed.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute("PRAGMA busy_timeout=5000")  # a second process (db upgrade) waits instead of failing
    cursor.close()


LEDGER_FILE_MODE = 0o600
"""The ledger file (and SQLite's -wal and -shm beside it) is the agent's alone: its rows name
pods, namespaces and claims, which other users of the node have no business reading."""


def _private_file(path: Path) -> None:
    """Create the SQLite file owner-only before SQLite does (it would use 0644 under the usual
    umask), or narrow an existing one (and its -wal/-shm) to owner-only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, LEDGER_FILE_MODE))
        return
    except FileExistsError:
        pass
    for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            mode = file.stat().st_mode & 0o777
        except FileNotFoundError:
            continue
        if mode != LEDGER_FILE_MODE:
            os.chmod(file, LEDGER_FILE_MODE)
            logger.info("ledger file %s was mode %o; narrowed to %o (owner only)", file, mode, LEDGER_FILE_MODE)


def missing_file(url: str) -> Path | None:
    """The SQLite file of `url` when it does not exist (opening it would create it), else None."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    path = Path(str(parsed.database))
    return None if path.exists() else path


def make_engine(url: str) -> Engine:
    """An engine for `url`; for an SQLite file, its folder is created, the file made owner-only
    (`LEDGER_FILE_MODE`), and WAL mode set on every connection."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        _private_file(Path(parsed.database))
    engine = create_engine(url)
    if parsed.get_backend_name() == "sqlite":
        event.listen(engine, "connect", _set_sqlite_pragmas)
    return engine


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at; None for an empty database."""
    with engine.connect() as connection, _alembic_quiet():
        return MigrationContext.configure(connection).get_current_revision()


@contextlib.contextmanager
def _alembic_quiet() -> Iterator[None]:
    """Alembic's INFO lines (`Context impl SQLiteImpl.`, `Will assume non-transactional DDL.`, one
    per revision run: eight at a fresh agent's start) stay out of an INFO log; the caller logs the
    migration once, with its revisions. At DEBUG they pass."""
    alembic_logger = logging.getLogger("alembic")
    old = alembic_logger.level
    if not alembic_logger.isEnabledFor(logging.DEBUG):
        alembic_logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        alembic_logger.setLevel(old)


def upgrade(engine: Engine, url: str) -> tuple[str | None, str]:
    """Migrate to the newest revision this code knows; returns (before, after).

    Raises `LedgerNewerThanCode` when the database is at a revision this code does not know.
    """
    config = alembic_config(url)
    scripts = ScriptDirectory.from_config(config)
    before = current_revision(engine)
    if before is not None:
        try:
            known = scripts.get_revision(before)
        except CommandError:
            known = None
        if known is None:
            raise errors.LedgerNewerThanCode(
                f"ledger database {make_url(url).render_as_string(hide_password=True)} is at revision {before!r},"
                f" which this agent does not know (its newest is {scripts.get_current_head()!r}): a newer agent"
                " migrated it. Run that newer agent, or downgrade the database with the newer version's"
                f" `elasticgpu agent db downgrade {scripts.get_current_head()}` before starting this one."
            )
    with engine.begin() as connection, _alembic_quiet():
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
    after = current_revision(engine)
    assert after is not None
    return before, after


def downgrade(engine: Engine, url: str, revision: str) -> tuple[str | None, str | None]:
    """Migrate down to `revision` (`-1`: one step, `base`: empty); returns (before, after)."""
    config = alembic_config(url)
    before = current_revision(engine)
    with engine.begin() as connection, _alembic_quiet():
        config.attributes["connection"] = connection
        command.downgrade(config, revision)
    return before, current_revision(engine)


def history() -> list[tuple[str, str | None, str]]:
    """Every revision this code knows, newest first: (revision, the one it revises, its first doc line)."""
    scripts = ScriptDirectory.from_config(alembic_config("sqlite://"))
    result = []
    for script in scripts.walk_revisions():
        down = script.down_revision
        result.append((script.revision, down if isinstance(down, str) or down is None else ",".join(down),
                       (script.doc or "").strip().splitlines()[0] if script.doc else ""))
    return result


class LedgerStore:
    """The agent's ledger. Thread-safe: each call opens its own session and commits before it returns."""

    def __init__(self, engine: Engine, *, url: str) -> None:
        self._engine = engine
        self._url = url
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._write_lock = threading.Lock()  # SQLite has one writer; queue ours here instead of on busy_timeout
        self.writes = 0
        """Transactions committed since the store was opened (for the metrics)."""
        self._listeners: list[Callable[[], None]] = []

    def on_allocations_changed(self, callback: Callable[[], None]) -> None:
        """Call `callback` after every committed change of the open rows (a row started, created,
        released or rolled back), on the writer's thread: it must return at once (set an Event)."""
        self._listeners.append(callback)

    def _changed(self) -> None:
        for callback in list(self._listeners):
            try:
                callback()
            except Exception:  # a listener's bug must not turn a committed write into an error
                logger.exception("ledger listener %r failed", callback)

    @classmethod
    def open(cls, url: str = DEFAULT_URL) -> LedgerStore:
        """Open the ledger at `url`, migrating it to the newest revision; refuses a database newer than the code."""
        engine: Engine | None = None
        try:
            engine = make_engine(url)
            before, after = upgrade(engine, url)
        except errors.LedgerError:
            if engine is not None:
                engine.dispose()
            raise
        except (SQLAlchemyError, CommandError, OSError) as e:
            if engine is not None:
                engine.dispose()
            raise errors.LedgerError(
                f"ledger database {make_url(url).render_as_string(hide_password=True)} cannot be opened or migrated:"
                f" {e}. Check --ledger-url (ELASTICGPU_AGENT_LEDGER_URL), the file's folder and its permissions."
            ) from None
        if before != after:
            logger.info("ledger %s migrated from %s to %s", url, before or "empty", after)
        return cls(engine, url=url)

    @classmethod
    def open_or_set_aside(cls, url: str = DEFAULT_URL) -> tuple[LedgerStore, Path | None]:
        """Open the ledger; an SQLite file that cannot be opened or migrated (not a database, a
        failing migration) is renamed `<file>.corrupt-<UTC time>` (with its -wal and -shm) and a
        new, empty ledger is opened in its place. Returns the store and where the old file went
        (None when nothing was set aside): the caller rebuilds the rows from the runtime.

        The agent must not stay down for a broken ledger file (kubelet needs its socket for every
        pod), and must not delete evidence either. A database a newer agent migrated
        (`LedgerNewerThanCode`) and any non-file URL are never set aside: they raise as `open` does."""
        try:
            return cls.open(url), None
        except errors.LedgerNewerThanCode:
            raise
        except errors.LedgerError as e:
            parsed = make_url(url)
            path = Path(parsed.database or "")
            if parsed.get_backend_name() != "sqlite" or not parsed.database or not path.is_file():
                raise
            aside = path.with_name(f"{path.name}.corrupt-{_now().strftime('%Y%m%dT%H%M%S.%fZ')}")
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.rename(f"{path}{suffix}", f"{aside}{suffix}")
            logger.warning("%s; the file was moved to %s and a new ledger is started, rebuilt from the runtime's "
                         "containers", e, aside)  # fmt: skip
        return cls.open(url), aside

    def close(self) -> None:
        """Close every connection."""
        self._engine.dispose()

    @property
    def url(self) -> str:
        """The database URL (password hidden)."""
        return make_url(self._url).render_as_string(hide_password=True)

    @contextmanager
    def _writing(self) -> Iterator[Session]:
        """One transaction, committed on exit; SQLAlchemy's errors become the ledger's here, at the edge."""
        try:
            with self._write_lock, self._sessions.begin() as session:
                yield session
        except IntegrityError as e:
            raise errors.LedgerStateError(
                f"ledger {self.url}: the write breaks a rule of the schema ({e.orig}); a container id is recorded"
                " once (mark_created of a second row with the same id is a caller's bug)"
            ) from None
        except OperationalError as e:
            raise errors.LedgerError(
                f"ledger {self.url}: the write failed ({e.orig}); check the disk (full? read-only?) and that no"
                " other process holds the database locked"
            ) from None
        self.writes += 1

    # Allocations ---------------------------------------------------------------------------------

    def record_started(
        self,
        *,
        pod_uid: str,
        pod_namespace: str,
        pod_name: str,
        container_name: str,
        claim_namespace: str,
        claim_name: str,
        elastic_gpu: str,
        gpu_uuids: list[str],
        cores: int,
        memory_mib: int,
        limits: tuple[int, int] | None = None,
        container_id: str | None = None,
        claim_kind: str = models.KIND_ELASTIC,
    ) -> int:
        """Record an injection about to be made (state "started"); returns the row id for the next steps.

        `limits`: (cores, memory MiB) the claim's limits file says as the container gets it mounted;
        None: no limits file (the size cannot change while the container runs). `container_id`: the
        container's id when the front knows it before the runtime creates the container (NRI names it in
        its CreateContainer): the row is "created" at once, one write instead of two (a creation that then
        fails reaches the front as a removal, and a row whose container is gone is released by reconcile).
        `claim_kind`: `models.KIND_DRA` for a container of a ResourceClaim (the claim names it; issue 48)."""
        if claim_kind not in (models.KIND_ELASTIC, models.KIND_DRA):
            raise ValueError(f"claim_kind {claim_kind!r}: use {models.KIND_ELASTIC!r} or {models.KIND_DRA!r}")
        row = models.AllocationRow(
            state=models.STARTED if container_id is None else models.CREATED, container_id=container_id,
            pod_uid=pod_uid, pod_namespace=pod_namespace,
            pod_name=pod_name, container_name=container_name, claim_namespace=claim_namespace,
            claim_name=claim_name, elastic_gpu=elastic_gpu, gpu_uuids=list(gpu_uuids), cores=cores,
            memory_mib=memory_mib, started_at=_now(), limits_file=limits is not None, claim_kind=claim_kind,
        )
        if limits is not None:
            row.requested_cores, row.requested_memory_mib = limits
            row.applied_cores, row.applied_memory_mib = limits
            row.limits_changed_at = row.started_at
        if container_id is not None:
            row.created_at = row.started_at
        with self._writing() as session:
            session.add(row)
            session.flush()
            row_id = row.id
        self._changed()
        return row_id

    def mark_created(self, row_id: int, container_id: str) -> None:
        """The runtime created the container: the row becomes "created" with its id. Idempotent for the same id."""
        with self._writing() as session:
            row = session.get(models.AllocationRow, row_id)
            if row is None:
                raise errors.LedgerStateError(f"ledger row {row_id} does not exist: record_started first")
            if row.state == models.CREATED and row.container_id == container_id:
                return
            if row.state != models.STARTED:
                raise errors.LedgerStateError(
                    f"ledger row {row_id} is {row.state!r} (container {row.container_id}), not 'started':"
                    f" it cannot become container {container_id}"
                )
            row.state = models.CREATED
            row.container_id = container_id
            row.created_at = _now()
        self._changed()

    def mark_released(self, container_id: str) -> bool:
        """The container is gone: its row becomes "released". False when no open row has that id (idempotent)."""
        with self._writing() as session:
            row = session.scalars(
                select(models.AllocationRow).where(
                    models.AllocationRow.container_id == container_id,
                    models.AllocationRow.state.in_(models.OPEN_STATES),
                )
            ).one_or_none()
            if row is None:
                return False
            row.state = models.RELEASED
            row.released_at = _now()
        self._changed()
        return True

    def roll_back(self, row_id: int) -> None:
        """Forget a "started" row whose CreateContainer failed. A missing row is fine (idempotent)."""
        with self._writing() as session:
            row = session.get(models.AllocationRow, row_id)
            if row is None:
                return
            if row.state != models.STARTED:
                raise errors.LedgerStateError(
                    f"ledger row {row_id} is {row.state!r} (container {row.container_id}): only a 'started' row"
                    " can be rolled back; release a created container with mark_released"
                )
            session.delete(row)
        self._changed()

    def open_allocations(self) -> list[Allocation]:
        """Every "started" and "created" row, oldest first."""
        with self._sessions() as session:
            rows = session.scalars(
                select(models.AllocationRow)
                .where(models.AllocationRow.state.in_(models.OPEN_STATES))
                .order_by(models.AllocationRow.id)
            ).all()
            return [Allocation.from_row(row) for row in rows]

    def allocation_for_container(self, container_id: str) -> Allocation | None:
        """The row of a container (open or released), or None."""
        with self._sessions() as session:
            row = session.scalars(
                select(models.AllocationRow).where(models.AllocationRow.container_id == container_id)
            ).one_or_none()
            return None if row is None else Allocation.from_row(row)

    def record_limits(self, row_ids: Sequence[int], *, requested: tuple[int, int],
                      applied: tuple[int, int] | None) -> int:
        """Record a claim's size on open rows: `requested` (cores, memory MiB) the GPU objects ask for,
        `applied` what its limits file says now, written only on rows created with the file (the others
        keep None: their containers cannot take a new size). Returns how many rows changed; a row that
        is not open (released meanwhile) is left alone."""
        changed = 0
        with self._writing() as session:
            rows = session.scalars(
                select(models.AllocationRow).where(
                    models.AllocationRow.id.in_(list(row_ids)), models.AllocationRow.state.in_(models.OPEN_STATES)
                )
            ).all()
            now = _now()
            for row in rows:
                before = (row.requested_cores, row.requested_memory_mib, row.applied_cores, row.applied_memory_mib)
                row.requested_cores, row.requested_memory_mib = requested
                if row.limits_file and applied is not None:
                    row.applied_cores, row.applied_memory_mib = applied
                if (row.requested_cores, row.requested_memory_mib, row.applied_cores, row.applied_memory_mib) != before:
                    row.limits_changed_at = now
                    changed += 1
        if changed:
            self._changed()
        return changed

    # -- MIG instances (agent/mig/): "creating" before NVML is called, "created" after ---------------

    def record_mig_creating(self, *, card_uuid: str, elastic_gpu: str, profile: str, start: int) -> MigRecord:
        """Record that an instance is about to be created for `elastic_gpu`; the row already there
        when one is (idempotent). `LedgerStateError` when another claim's row holds that start."""
        with self._writing() as session:
            row = session.scalars(select(models.MigInstanceRow).where(
                models.MigInstanceRow.elastic_gpu == elastic_gpu)).one_or_none()
            if row is None:
                taken = session.scalars(select(models.MigInstanceRow).where(
                    models.MigInstanceRow.card_uuid == card_uuid, models.MigInstanceRow.start == start)).one_or_none()
                if taken is not None:
                    raise errors.LedgerStateError(
                        f"MIG slice {start} of card {card_uuid} is recorded for {taken.elastic_gpu}, not {elastic_gpu};"
                        " release that claim's instance first")
                row = models.MigInstanceRow(state=models.MIG_CREATING, card_uuid=card_uuid, elastic_gpu=elastic_gpu,
                                            profile=profile, start=start, started_at=_now())
                session.add(row)
                session.flush()
            return MigRecord.from_row(row)

    def mark_mig_created(self, row_id: int, *, gpu_instance_id: int, mig_uuid: str) -> None:
        """NVML created the row's instance: record its id and uuid."""
        with self._writing() as session:
            row = session.get(models.MigInstanceRow, row_id)
            if row is None:
                raise errors.LedgerStateError(f"MIG instance row {row_id} does not exist")
            row.state, row.gpu_instance_id, row.mig_uuid = models.MIG_CREATED, gpu_instance_id, mig_uuid
            row.created_at = _now()

    def forget_mig(self, row_id: int) -> None:
        """The row's instance is destroyed (or was never created): delete the row (idempotent)."""
        with self._writing() as session:
            session.execute(delete(models.MigInstanceRow).where(models.MigInstanceRow.id == row_id))

    def mig_records(self) -> list[MigRecord]:
        """Every MIG instance row, oldest first."""
        with self._sessions() as session:
            rows = session.scalars(select(models.MigInstanceRow).order_by(models.MigInstanceRow.id))
            return [MigRecord.from_row(row) for row in rows]

    def prune_released(self, *, before: datetime) -> int:
        """Delete released rows released before `before`; returns how many."""
        with self._writing() as session:
            result = session.execute(
                delete(models.AllocationRow).where(
                    models.AllocationRow.state == models.RELEASED, models.AllocationRow.released_at < before
                )
            )
            return int(getattr(result, "rowcount", 0) or 0)

    # Usage samples ---------------------------------------------------------------------------------

    def record_usage(self, samples: Sequence[UsageSample]) -> None:
        """Store samples in one transaction."""
        if not samples:
            return
        with self._writing() as session:
            session.add_all(
                models.UsageSampleRow(
                    taken_at=s.taken_at, gpu_uuid=s.gpu_uuid, pid=s.pid, memory_mib=s.memory_mib,
                    sm_percent=s.sm_percent, container_id=s.container_id, claim_namespace=s.claim_namespace,
                    claim_name=s.claim_name,
                )
                for s in samples
            )

    def usage_samples(self, *, since: datetime | None = None) -> list[UsageSample]:
        """Samples taken at or after `since` (all when None), oldest first."""
        with self._sessions() as session:
            query = select(models.UsageSampleRow).order_by(models.UsageSampleRow.id)
            if since is not None:
                query = query.where(models.UsageSampleRow.taken_at >= since)
            result = []
            for row in session.scalars(query):
                taken = _utc(row.taken_at)
                assert taken is not None
                result.append(UsageSample(
                    taken_at=taken, gpu_uuid=row.gpu_uuid, pid=row.pid, memory_mib=row.memory_mib,
                    sm_percent=row.sm_percent, container_id=row.container_id,
                    claim_namespace=row.claim_namespace, claim_name=row.claim_name,
                ))
            return result

    def prune_usage(self, *, before: datetime) -> int:
        """Delete samples taken before `before` (the retention); returns how many."""
        with self._writing() as session:
            result = session.execute(delete(models.UsageSampleRow).where(models.UsageSampleRow.taken_at < before))
            return int(getattr(result, "rowcount", 0) or 0)

    def count_usage_samples(self) -> int:
        """How many usage samples are kept."""
        with self._sessions() as session:
            return int(session.scalar(select(func.count()).select_from(models.UsageSampleRow)) or 0)
