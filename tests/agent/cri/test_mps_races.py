"""Never two MPS daemons for one card, and never none (a flake of test_never_two_daemons_for_one_card under load):
real processes, the stand-in control binary of isolation_node.

`ensure` returned once a process with the card's environment was found, which is the launcher's forked child
before it is the daemon (for the stand-in: before its exec of `serve`): a container could be given the card before
its daemon wrote its pid file (a CUDA client that finds no daemon in its pipe folder runs without MPS), and the test
counted 0 servers. And `ensure` looked for the daemon outside the card's lock: a `release_except` that had decided
to stop the card's daemon stopped it after, or while, `ensure` found it, and `ensure` returned with no daemon."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from elasticgpu.agent import isolation
from elasticgpu.agent.isolation.mps_folders import CardFolders
from tests.agent.cri.isolation_node import IsolationNode, mounts_under, wait_until
from tests.agent.cri.node import CARDS

CARD = CARDS[0].uuid
SLOW_START_S = 1.0
"""How long the slow stand-in's launched child takes before it execs the server (a loaded node, a slow driver)."""


def lock_waiters(folders: CardFolders, uuid: str) -> int:
    """How many wait for the card's lock file (the kernel's /proc/locks: `->` marks a blocked request)."""
    inode = (folders.folder(uuid) / "lock").stat().st_ino
    return sum(1 for line in Path("/proc/locks").read_text().splitlines()
               if "->" in line.split() and line.split()[-3].endswith(f":{inode}"))


@pytest.fixture
def node(tmp_path: Path) -> Iterator[IsolationNode]:
    # A grace of 0: a card no container uses is stopped at the next release (as at the end of a grace).
    node = IsolationNode(tmp_path / "node")
    try:
        yield node
    finally:
        node.close()


def test_ensure_returns_once_the_daemon_wrote_its_pid_file(node: IsolationNode) -> None:
    """The launched child takes a second before it is the daemon: `ensure` waits for the daemon's own pid file."""
    node.control.write_text(node.control.read_text().replace(
        '"$0" serve </dev/null', f'(sleep {SLOW_START_S}; exec "$0" serve) </dev/null'))
    node.daemons.ensure(CARD)
    # Before: 0 servers and no pid file here ('assert [] == [...]'), the server up a second later.
    assert node.servers() == [node.daemons.pid(CARD)]
    assert node.daemons.folders.hinted_pid(CARD) == node.daemons.pid(CARD)
    assert node.starts() == [CARD]


def test_ensure_while_the_card_s_daemon_is_being_stopped_leaves_it_running(node: IsolationNode) -> None:
    """A release decided to stop the card's daemon (no container used it), and waits for the card's lock (held
    here as a second agent would); a container of the card comes meanwhile: whichever gets the lock first, the
    daemon the container was prepared for is not stopped."""
    daemons = node.daemons
    daemons.ensure(CARD)
    [server] = node.servers()
    released: list[list[str]] = []  # what the release stopped
    with daemons.folders.card_lock(CARD):
        releasing = threading.Thread(target=lambda: released.append(daemons.release_except([])))
        releasing.start()
        wait_until("the release decided to stop the card's daemon", lambda: CARD.lower() not in daemons.wanted())
        ensuring = threading.Thread(target=daemons.ensure, args=(CARD,))
        ensuring.start()
        wait_until("the container's ensure asked for the card", lambda: CARD.lower() in daemons.wanted())
    for thread in (releasing, ensuring):
        thread.join(30)
        assert not thread.is_alive()
    # Before: the daemon quit after (or while) `ensure` found it ("assert ['GPU-...'] == []").
    assert node.quits() == [] and released == [[]]
    assert node.servers() == [server] and daemons.pid(CARD) == server and node.starts() == [CARD]
    assert mounts_under(daemons.shm_dir(CARD)) == [str(daemons.shm_dir(CARD))]
    # Wanted again: the next release with no container of the card stops it.
    assert daemons.release_except([]) == [CARD.lower()] and node.servers() == []


def test_ensure_after_a_release_stopped_the_daemon_starts_a_new_one(node: IsolationNode) -> None:
    """The other order: the stop runs to its end first, then `ensure` finds no daemon and starts one, with the
    card's /dev/shm mounted again."""
    daemons = node.daemons
    daemons.ensure(CARD)
    [old] = node.servers()
    with daemons.folders.card_lock(CARD):
        releasing = threading.Thread(target=daemons.release_except, args=([],))
        releasing.start()
        wait_until("the release decided to stop the card's daemon", lambda: CARD.lower() not in daemons.wanted())
    releasing.join(30)
    assert node.quits() == [CARD] and node.servers() == []
    daemons.ensure(CARD)
    [new] = node.servers()
    assert new != old and node.starts() == [CARD, CARD] and daemons.pid(CARD) == new
    assert mounts_under(daemons.shm_dir(CARD)) == [str(daemons.shm_dir(CARD))]


def test_threads_recording_the_daemon_at_once_never_fail(tmp_path: Path) -> None:
    """The record is written through a temporary file: one per process was shared by the threads of the agent
    (ensure, the supervisor, the sync), and one thread's rename took another's file away (FileNotFoundError)."""
    folders = CardFolders(tmp_path)
    folders.folder(CARD).mkdir()
    failed: list[BaseException] = []

    def record(pid: int) -> None:
        try:
            for _ in range(300):
                folders.record(CARD, pid, pid * 10)
        except OSError as e:
            failed.append(e)

    threads = [threading.Thread(target=record, args=(pid,)) for pid in range(1000, 1008)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    # Before: "FileNotFoundError: [Errno 2] No such file or directory: '.../.daemon.<pid>' -> '.../daemon'".
    assert failed == []
    recorded = folders.recorded(CARD)
    assert recorded is not None and recorded[1] == recorded[0] * 10
    assert [p.name for p in folders.folder(CARD).iterdir()] == ["daemon"]


def test_the_supervisor_never_starts_a_card_released_meanwhile(node: IsolationNode) -> None:
    """The supervisor found the card's daemon gone and waits for the card's lock while a release stops the card
    for good: it starts nothing (before, a daemon ran for a card nobody wanted until a later sync stopped it)."""
    daemons = node.daemons
    daemons.ensure(CARD)
    daemons.close()  # the supervisor's passes are made by hand here
    [server] = node.servers()
    os.kill(server, signal.SIGKILL)
    wait_until("the daemon gone", lambda: node.servers() == [] and daemons.pid(CARD) is None)
    with daemons.folders.card_lock(CARD):
        checking = threading.Thread(target=daemons.check)
        checking.start()
        wait_until("the supervisor waits for the card's lock", lambda: lock_waiters(daemons.folders, CARD) == 1)
        releasing = threading.Thread(target=daemons.release_except, args=([],))
        releasing.start()
        wait_until("the release decided to stop the card", lambda: CARD.lower() not in daemons.wanted())
    for thread in (checking, releasing):
        thread.join(30)
        assert not thread.is_alive()
    # Before: started again for nobody ("assert ['GPU-...', 'GPU-...'] == ['GPU-...']").
    assert node.starts() == [CARD] and node.servers() == [] and daemons.pid(CARD) is None


def test_a_daemon_that_writes_no_pid_file_is_taken_at_the_deadline(node: IsolationNode,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A daemon whose pid file never comes (a container of the card removed it while it started) is taken as started
    once the start's deadline passes, said in a warning: no error, and no second daemon."""
    node.control.write_text(node.control.read_text().replace(
        'echo $$ > "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid"', ":"))
    daemons = isolation.MpsDaemons(control=lambda: str(node.control), state_dir=node.state / "mps",
                                   settings=isolation.DaemonSettings(start_timeout_s=1.0, check_interval_s=0.1))
    try:
        with caplog.at_level(logging.WARNING):
            daemons.ensure(CARD)
        [server] = node.servers()
        assert daemons.pid(CARD) == server and node.starts() == [CARD]
        assert "wrote no pid file in 1s; taken as started" in caplog.text
    finally:
        daemons.close()
