"""The ledger: the two-phase allocation record, usage retention, Alembic migrations, crash safety."""

from __future__ import annotations

import itertools
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alembic import command

from elasticgpu.agent import errors
from elasticgpu.agent.ledger import store as ledger_store
from elasticgpu.agent.ledger.store import LedgerStore, UsageSample

REPO = Path(__file__).resolve().parents[2]


def url_of(path: Path) -> str:
    return f"sqlite:///{path}"


def started(store: LedgerStore, n: int = 0) -> int:
    return store.record_started(
        pod_uid=f"uid-{n}", pod_namespace="ns", pod_name=f"pod-{n}", container_name="main", claim_namespace="ns",
        claim_name=f"claim-{n}", elastic_gpu=f"egpu-{n}", gpu_uuids=["GPU-a", "GPU-b"], cores=30, memory_mib=10240,
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LedgerStore]:
    opened = LedgerStore.open(url_of(tmp_path / "ledger.db"))
    yield opened
    opened.close()


def test_two_phase_life_of_an_allocation(store: LedgerStore) -> None:
    row = started(store, 1)
    (open_row,) = store.open_allocations()
    assert (open_row.id, open_row.state, open_row.container_id) == (row, "started", None)
    assert open_row.gpu_uuids == ("GPU-a", "GPU-b") and open_row.started_at.tzinfo is not None
    store.mark_created(row, "c0ffee")
    store.mark_created(row, "c0ffee")  # a retried call is harmless
    created = store.allocation_for_container("c0ffee")
    assert created is not None and created.state == "created" and created.created_at is not None
    with pytest.raises(errors.LedgerStateError, match="not 'started'"):
        store.mark_created(row, "other")
    with pytest.raises(errors.LedgerStateError, match="only a 'started' row"):
        store.roll_back(row)
    assert store.mark_released("c0ffee") is True
    assert store.mark_released("c0ffee") is False  # idempotent
    assert store.mark_released("never-seen") is False
    assert store.open_allocations() == []
    released = store.allocation_for_container("c0ffee")
    assert released is not None and released.state == "released" and released.released_at is not None
    # A started row whose CreateContainer failed is rolled back, twice if need be.
    failed = started(store, 2)
    store.roll_back(failed)
    store.roll_back(failed)
    assert store.open_allocations() == []
    with pytest.raises(errors.LedgerStateError, match="does not exist"):
        store.mark_created(failed, "x")
    assert store.prune_released(before=datetime.now(UTC) + timedelta(seconds=1)) == 1
    assert store.allocation_for_container("c0ffee") is None


def test_sqlite_runs_in_wal_mode(store: LedgerStore, tmp_path: Path) -> None:
    started(store)
    with sqlite3.connect(tmp_path / "ledger.db") as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_usage_samples_and_retention(store: LedgerStore) -> None:
    now = datetime.now(UTC)
    old = [UsageSample(taken_at=now - timedelta(hours=2), gpu_uuid="GPU-a", pid=10, memory_mib=100)]
    new = [UsageSample(taken_at=now, gpu_uuid="GPU-a", pid=11, memory_mib=200, sm_percent=40, container_id="c",
                       claim_namespace="ns", claim_name="claim")]
    store.record_usage(old + new)
    assert store.count_usage_samples() == 2
    assert store.prune_usage(before=now - timedelta(hours=1)) == 1
    (kept,) = store.usage_samples()
    assert kept == new[0]
    assert store.usage_samples(since=now + timedelta(seconds=1)) == []


# Migrations ------------------------------------------------------------------------------------------

REVISIONS = [revision for revision, _, _ in reversed(ledger_store.history())]  # oldest first
HEAD = ledger_store.head_revision()


def migrate_to(url: str, revision: str) -> None:
    engine = ledger_store.make_engine(url)
    config = ledger_store.alembic_config(url)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
    engine.dispose()


def test_opening_a_fresh_ledger_logs_one_line_not_alembic_s(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 50: every agent start logged eight Alembic INFO lines (`Context impl SQLiteImpl.`, one per
    revision run); the agent's own line says the migration once. Alembic's pass at DEBUG."""
    import logging

    with caplog.at_level(logging.INFO):
        LedgerStore.open(url_of(tmp_path / "ledger.db")).close()
    assert [r.getMessage() for r in caplog.records if r.name.startswith("alembic")] == []
    assert len([r for r in caplog.records if r.name == ledger_store.__name__]) == 1, caplog.records
    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        LedgerStore.open(url_of(tmp_path / "debug.db")).close()
    assert any(r.name.startswith("alembic") for r in caplog.records)


def test_at_least_two_revisions_in_one_line() -> None:
    assert len(REVISIONS) >= 2 and REVISIONS[-1] == HEAD
    downs = {revision: down for revision, down, _ in ledger_store.history()}
    assert downs[REVISIONS[0]] is None
    assert all(downs[later] == earlier for earlier, later in itertools.pairwise(REVISIONS))


def test_migrate_from_empty(tmp_path: Path) -> None:
    opened = LedgerStore.open(url_of(tmp_path / "new" / "ledger.db"))  # the folder is created too
    assert ledger_store.current_revision(opened._engine) == HEAD
    started(opened)
    assert len(opened.open_allocations()) == 1
    opened.close()


@pytest.mark.parametrize("revision", [r for r in REVISIONS if r != HEAD])
def test_migrate_from_each_earlier_revision_keeps_data(tmp_path: Path, revision: str) -> None:
    path = tmp_path / "ledger.db"
    migrate_to(url_of(path), revision)
    # Rows written by the code of that revision: the allocations table exists since the first one.
    with sqlite3.connect(path) as connection:
        connection.execute(
            "INSERT INTO allocations (state, container_id, pod_uid, pod_namespace, pod_name, container_name,"
            " claim_namespace, claim_name, elastic_gpu, gpu_uuids, cores, memory_mib, started_at, created_at)"
            " VALUES ('created', 'old-container', 'u', 'ns', 'p', 'c', 'ns', 'cl', 'egpu-x', '[\"GPU-a\"]', 50, 4096,"
            " '2026-01-01 00:00:00.000000', '2026-01-01 00:00:01.000000')"
        )
    opened = LedgerStore.open(url_of(path))
    assert ledger_store.current_revision(opened._engine) == HEAD
    (row,) = opened.open_allocations()
    assert (row.container_id, row.elastic_gpu, row.gpu_uuids, row.cores, row.memory_mib) == (
        "old-container", "egpu-x", ("GPU-a",), 50, 4096)
    assert row.started_at == datetime(2026, 1, 1, tzinfo=UTC)
    # A container created before the limits file: none mounted, nothing applied, sizes not recorded yet.
    assert (row.limits_file, row.requested, row.applied) == (False, None, None)
    assert opened.record_limits([row.id], requested=(20, 2048), applied=(20, 2048)) == 1
    (row,) = opened.open_allocations()
    assert (row.requested, row.applied) == ((20, 2048), None)  # it cannot take a new size while it runs
    assert opened.mark_released("old-container") is True  # the new column works on the old row
    opened.close()


def test_downgrade_one_step_keeps_allocations(tmp_path: Path) -> None:
    url = url_of(tmp_path / "ledger.db")
    opened = LedgerStore.open(url)
    row = started(opened)
    opened.mark_created(row, "kept")
    opened.record_usage([UsageSample(taken_at=datetime.now(UTC), gpu_uuid="GPU-a", pid=1, memory_mib=1)])
    opened.close()
    engine = ledger_store.make_engine(url)
    before, after = ledger_store.downgrade(engine, url, "0002")
    assert (before, after) == (HEAD, "0002")
    before, after = ledger_store.downgrade(engine, url, "-1")
    assert (before, after) == ("0002", "0001")
    with sqlite3.connect(tmp_path / "ledger.db") as connection:
        tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert "usage_samples" not in tables
        assert connection.execute("SELECT container_id FROM allocations").fetchall() == [("kept",)]
    engine.dispose()
    reopened = LedgerStore.open(url)  # and up again
    found = reopened.allocation_for_container("kept")
    assert found is not None and found.state == "created"
    reopened.close()


def test_limits_sizes_round_trip_through_0003(tmp_path: Path) -> None:
    """Revision 0003 (issue 17): the sizes asked and applied are kept; down to 0002 drops them and keeps the
    row; up again the row reads as a container without a limits file (it cannot take a new size)."""
    url = url_of(tmp_path / "ledger.db")
    opened = LedgerStore.open(url)
    row = opened.record_started(
        pod_uid="u", pod_namespace="ns", pod_name="p", container_name="main", claim_namespace="ns", claim_name="c",
        elastic_gpu="egpu-c", gpu_uuids=["GPU-a"], cores=30, memory_mib=10240, limits=(30, 10240),
    )
    opened.mark_created(row, "resized")
    found = opened.allocation_for_container("resized")
    assert found is not None and (found.limits_file, found.requested, found.applied) == (True, (30, 10240), (30, 10240))
    assert opened.record_limits([row], requested=(20, 4096), applied=(20, 4096)) == 1
    assert opened.record_limits([row], requested=(20, 4096), applied=(20, 4096)) == 0  # nothing new: no write
    found = opened.allocation_for_container("resized")
    assert found is not None and (found.requested, found.applied, found.cores) == ((20, 4096), (20, 4096), 30)
    assert found.limits_changed_at is not None
    opened.close()
    engine = ledger_store.make_engine(url)
    assert ledger_store.downgrade(engine, url, "0002") == (HEAD, "0002")
    with sqlite3.connect(tmp_path / "ledger.db") as connection:
        columns = {c[1] for c in connection.execute("PRAGMA table_info(allocations)")}
        assert not columns & {"limits_file", "requested_cores", "applied_cores", "limits_changed_at"}
        assert connection.execute("SELECT container_id, cores FROM allocations").fetchall() == [("resized", 30)]
    engine.dispose()
    reopened = LedgerStore.open(url)
    found = reopened.allocation_for_container("resized")
    assert found is not None and (found.state, found.limits_file, found.applied) == ("created", False, None)
    reopened.close()


def test_a_newer_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    LedgerStore.open(url_of(path)).close()
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE alembic_version SET version_num = '9999_from_the_future'")
    with pytest.raises(errors.LedgerNewerThanCode) as caught:
        LedgerStore.open(url_of(path))
    text = str(caught.value)
    assert "9999_from_the_future" in text and f"its newest is {HEAD!r}" in text and "newer agent" in text
    # The command line says the same in one line, without a stack trace.
    result = subprocess.run(
        [sys.executable, "-m", "elasticgpu", "agent", "db", "upgrade", "--ledger-url", url_of(path)],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "9999_from_the_future" in result.stderr


def test_db_commands(tmp_path: Path) -> None:
    url = url_of(tmp_path / "ledger.db")

    def cli(*args: str) -> str:
        result = subprocess.run([sys.executable, "-m", "elasticgpu", "agent", "db", *args], capture_output=True,
                                text=True, cwd=REPO, timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stdout

    missing = tmp_path / "ledger.db"
    assert cli("current", "--ledger-url", url).strip() == (
        f"no ledger at {missing} (<base>: the agent creates it when it starts)")
    assert not missing.exists() and not list(tmp_path.iterdir())  # looking created nothing
    assert cli("upgrade", "--ledger-url", url).strip() == f"<base> -> {HEAD}"
    assert cli("current", "--ledger-url", url).strip() == f"{HEAD} (head)"
    assert f"-> {HEAD} (head)" in cli("history")


# Crash safety ---------------------------------------------------------------------------------------------

WRITER = """
import sys
from elasticgpu.agent.ledger.store import LedgerStore
store = LedgerStore.open(sys.argv[1])
n = 0
while True:
    row = store.record_started(pod_uid=f"u{n}", pod_namespace="ns", pod_name=f"p{n}", container_name="c",
        claim_namespace="ns", claim_name="cl", elastic_gpu="e", gpu_uuids=["GPU-a"], cores=1, memory_mib=1)
    store.mark_created(row, f"container-{n}")
    print(f"created {row} container-{n}", flush=True)   # only after the commit returned
    n += 1
"""


def test_kill_9_during_writes_loses_nothing_committed(tmp_path: Path) -> None:
    url = url_of(tmp_path / "ledger.db")
    LedgerStore.open(url).close()  # migrate first, so the writer starts writing at once
    writer = subprocess.Popen([sys.executable, "-c", WRITER, url], stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert writer.stdout is not None
    reported: list[tuple[int, str]] = []
    deadline = time.monotonic() + 60
    try:
        while len(reported) < 200:
            assert time.monotonic() < deadline, f"writer reported only {len(reported)} rows in 60 s"
            line = writer.stdout.readline()
            assert line, f"writer ended early with {writer.poll()}"
            _, row, container = line.split()
            reported.append((int(row), container))
    finally:
        os.kill(writer.pid, signal.SIGKILL)  # in the middle of its next transactions
        writer.wait(timeout=30)
    assert writer.returncode == -signal.SIGKILL
    # Lines it printed between our last read and the kill were committed too.
    for line in writer.stdout.read().splitlines():
        if line.count(" ") == 2:
            _, row, container = line.split()
            reported.append((int(row), container))
    # Whatever it printed after the commit is there; the database opens cleanly (WAL recovery).
    reopened = LedgerStore.open(url)
    by_container = {a.container_id: a for a in reopened.open_allocations()}
    for row, container in reported:
        assert container in by_container, f"committed row {row} ({container}) lost"
        assert by_container[container].id == row and by_container[container].state == "created"
    # Only the one allocation in flight at the kill may be more: started (or created but not yet printed).
    assert len(reopened.open_allocations()) - len(reported) <= 1
    reopened.close()


def test_database_errors_become_ledger_errors(store: LedgerStore, tmp_path: Path) -> None:
    first, second = started(store, 1), started(store, 2)
    store.mark_created(first, "same-id")
    with pytest.raises(errors.LedgerStateError, match="a container id is recorded once"):
        store.mark_created(second, "same-id")
    (tmp_path / "read-only").mkdir()
    (tmp_path / "read-only" / "file").write_text("")
    with pytest.raises(errors.LedgerError, match="cannot be opened or migrated") as caught:
        LedgerStore.open(url_of(tmp_path / "read-only" / "file" / "ledger.db"))  # a file where a folder must be
    assert "--ledger-url" in str(caught.value)


def test_many_threads_write_at_once(store: LedgerStore) -> None:
    import threading

    failures: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            for n in range(25):
                row = started(store, worker * 100 + n)
                store.mark_created(row, f"c-{worker}-{n}")
                if n % 5 == 0:
                    assert store.mark_released(f"c-{worker}-{n}")
        except BaseException as e:  # reported below, in the test's thread
            failures.append(e)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert failures == []
    assert len(store.open_allocations()) == 8 * 20


def test_a_wheel_carries_the_migrations(tmp_path: Path) -> None:
    """The scripts live in the top-level migrations/ and reach the package through a link: a built wheel must
    hold them, and the ledger must migrate from that installation (not from this checkout)."""
    import shutil

    source = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("elasticgpu", "migrations"):
        shutil.copytree(REPO / name, source / name, symlinks=True, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path / "wheel")], capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(tmp_path / "site"), str(wheel)],
        capture_output=True, text=True, timeout=300,
    )
    assert installed.returncode == 0, installed.stderr
    probe = (
        "import sys; from elasticgpu.agent.ledger import store;"
        f" assert store.__file__.startswith({str(tmp_path / 'site')!r}), store.__file__;"
        f" s = store.LedgerStore.open({url_of(tmp_path / 'l.db')!r});"
        " print(store.current_revision(s._engine))"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env=env)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == HEAD
