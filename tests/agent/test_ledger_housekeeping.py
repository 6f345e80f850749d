"""Ledger housekeeping (issue 15, item 11): the file is owner-only, and a migration round trip
leaves released rows that pruning deletes. Real SQLite files, migrated by Alembic."""

from __future__ import annotations

import os
import sqlite3
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from elasticgpu.agent import errors
from elasticgpu.agent.ledger import store as ledger_store
from elasticgpu.agent.ledger.store import LedgerStore


def url_of(path: Path) -> str:
    return f"sqlite:///{path}"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def release_one(opened: LedgerStore, n: int) -> None:
    row = opened.record_started(
        pod_uid=f"uid-{n}", pod_namespace="ns", pod_name=f"pod-{n}", container_name="main", claim_namespace="ns",
        claim_name=f"claim-{n}", elastic_gpu=f"egpu-{n}", gpu_uuids=["GPU-a"], cores=30, memory_mib=1024,
    )  # fmt: skip
    opened.mark_created(row, f"container-{n}")
    assert opened.mark_released(f"container-{n}")


def test_a_new_ledger_file_is_owner_only(tmp_path: Path) -> None:
    old = os.umask(0o022)  # the usual umask, under which SQLite makes 0644 files
    try:
        path = tmp_path / "ledger.db"
        opened = LedgerStore.open(url_of(path))
        release_one(opened, 1)  # writes: the -wal file exists now
        assert mode(path) == 0o600
        for side in (path.with_name("ledger.db-wal"), path.with_name("ledger.db-shm")):
            if side.exists():
                assert mode(side) == 0o600, side
        opened.close()
    finally:
        os.umask(old)


def test_an_existing_readable_ledger_is_narrowed_at_open(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    LedgerStore.open(url_of(path)).close()
    path.chmod(0o644)  # as an older agent left it
    opened = LedgerStore.open(url_of(path))
    assert mode(path) == 0o600
    opened.close()


def test_down_and_up_leaves_released_rows_prunable(tmp_path: Path) -> None:
    """0002 down drops released_at; up again must not leave released rows that no prune deletes."""
    url = url_of(tmp_path / "ledger.db")
    opened = LedgerStore.open(url)
    release_one(opened, 1)
    opened.close()
    engine = ledger_store.make_engine(url)
    ledger_store.downgrade(engine, url, "0001")
    engine.dispose()
    reopened = LedgerStore.open(url)  # up to head again
    with sqlite3.connect(tmp_path / "ledger.db") as connection:
        rows = connection.execute("SELECT state, released_at FROM allocations").fetchall()
    assert len(rows) == 1 and rows[0][0] == "released"
    assert rows[0][1] is not None, "a released row lost its release time in the round trip: never pruned"
    # Not pruned before it has been kept a retention period (its release time is unknown: now at the latest) ...
    assert reopened.prune_released(before=datetime.now(UTC) - timedelta(hours=1)) == 0
    # ... and pruned after.
    assert reopened.prune_released(before=datetime.now(UTC) + timedelta(seconds=1)) == 1
    reopened.close()


def test_open_rows_keep_no_release_time_after_a_round_trip(tmp_path: Path) -> None:
    url = url_of(tmp_path / "ledger.db")
    opened = LedgerStore.open(url)
    row = opened.record_started(
        pod_uid="u", pod_namespace="ns", pod_name="p", container_name="main", claim_namespace="ns",
        claim_name="c", elastic_gpu="e", gpu_uuids=["GPU-a"], cores=30, memory_mib=1024,
    )  # fmt: skip
    opened.mark_created(row, "running")
    opened.close()
    engine = ledger_store.make_engine(url)
    ledger_store.downgrade(engine, url, "0001")
    engine.dispose()
    reopened = LedgerStore.open(url)
    (found,) = reopened.open_allocations()
    assert (found.state, found.released_at) == ("created", None)
    reopened.close()


def test_a_file_that_is_no_database_is_set_aside(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "ledger.db"
    path.write_bytes(b"this is not an SQLite database " * 200)
    opened, aside = LedgerStore.open_or_set_aside(url_of(path))
    assert aside is not None and aside.name.startswith("ledger.db.corrupt-")
    assert aside.read_bytes().startswith(b"this is not")  # kept, for whoever investigates
    assert opened.open_allocations() == []  # a new, empty ledger in its place
    release_one(opened, 1)
    opened.close()
    assert [r.levelname for r in caplog.records if "moved to" in r.getMessage()] == ["WARNING"]


def test_a_failing_migration_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with sqlite3.connect(path) as connection:  # says 0001, has no allocations table: 0002 fails
        connection.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)")
        connection.execute("INSERT INTO alembic_version VALUES ('0001')")
    opened, aside = LedgerStore.open_or_set_aside(url_of(path))
    assert aside is not None and aside.exists()
    assert ledger_store.current_revision(opened._engine) == ledger_store.head_revision()
    opened.close()


def test_a_good_or_newer_ledger_is_never_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    opened, aside = LedgerStore.open_or_set_aside(url_of(path))
    release_one(opened, 1)
    opened.close()
    again, aside = LedgerStore.open_or_set_aside(url_of(path))
    assert aside is None
    again.close()
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE alembic_version SET version_num = '9999'")
    with pytest.raises(errors.LedgerNewerThanCode):
        LedgerStore.open_or_set_aside(url_of(path))
    assert list(tmp_path.glob("*.corrupt-*")) == []
