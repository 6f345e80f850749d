"""The MPS control daemons outlive the agent (issue 44): real processes, the stand-in control binary.

A container's runtime (and systemd, for a unit) stops a container by killing every process of its cgroup; a
daemon the agent started is in the agent's cgroup, however it daemonises. So the agent runs in a cgroup of its own
here, and is "stopped" the runtime's way: every process of that cgroup SIGKILLed. With the daemons run by the
agent itself (no --mps-daemons-socket, the old way) the card's daemon goes with it; with the MPS daemon service
(`elasticgpu agent mps-daemons`, the chart's DaemonSet elasticgpu-mps) it stays, with the ceiling it was given,
and the next agent finds it. A killed service is re-run and adopts the daemons it finds."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid as uuids
from collections.abc import Iterator
from pathlib import Path

import pytest

from elasticgpu.agent import isolation
from elasticgpu.agent.isolation.mps_ceiling import Ceiling
from tests.agent.cri.isolation_node import IsolationNode, wait_until
from tests.agent.cri.node import CARDS

CARD = CARDS[0].uuid
CEILING = Ceiling.of(30, 1024)

# The agent: joins its cgroup first (as a container's process is in it from its start), then has the card's daemon
# run with a slice's ceiling, through the service or by itself, and stays until it is killed.
AGENT = """
import os, sys, time
from pathlib import Path
procs, mode, state, control, card = sys.argv[1:6]
with open(procs, "w") as f:
    f.write(str(os.getpid()))
from elasticgpu.agent import isolation
from elasticgpu.agent.isolation.mps_ceiling import Ceiling
state = Path(state)
if mode == "service":
    daemons = isolation.MpsDaemonsClient(socket_path=state / "mps-daemons.sock", state_dir=state / "mps")
else:
    daemons = isolation.MpsDaemons(control=lambda: control, state_dir=state / "mps")
daemons.ensure(card, Ceiling.of(30, 1024))
print("ready", flush=True)
time.sleep(300)
"""


def _cgroup_root() -> Path | None:
    """A cgroup hierarchy this test may make a group in (v2, or v1's pids controller), or None."""
    for root in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup")):
        probe = root / f"elasticgpu-probe-{uuids.uuid4().hex[:8]}"
        try:
            probe.mkdir()
        except OSError:
            continue
        ok = (probe / "cgroup.procs").exists()
        probe.rmdir()
        if ok:
            return root
    return None


@pytest.fixture
def cgroup() -> Iterator[Path]:
    """A fresh cgroup, emptied (every process SIGKILLed) and removed afterwards."""
    root = _cgroup_root()
    if root is None:
        pytest.skip("no cgroup hierarchy can be written here (the test needs root and a writable /sys/fs/cgroup)")
    group = root / f"elasticgpu-agent-{uuids.uuid4().hex[:8]}"
    group.mkdir()
    try:
        yield group
    finally:
        _stop_like_a_runtime(group)
        with contextlib.suppress(OSError):
            group.rmdir()


def _members(group: Path) -> list[int]:
    return [int(pid) for pid in (group / "cgroup.procs").read_text().split()]


def _stop_like_a_runtime(group: Path) -> None:
    """SIGKILL every process of the cgroup until none is left, as runc does when a container stops."""
    deadline = time.monotonic() + 30
    while members := _members(group):
        assert time.monotonic() < deadline, f"the cgroup's processes did not end: {members}"
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _start_service(node: IsolationNode) -> subprocess.Popen[bytes]:
    service = subprocess.Popen(
        [sys.executable, "-m", "elasticgpu", "agent", "mps-daemons", "--isolation-dir", str(node.state),
         "--driver-root", str(node.driver_root), "--mps-check-interval-s", "0.2", "--isolation-idle-grace-s", "0",
         "--mps-shm-size-mib", "8", "--mps-stop-timeout-s", "5"],
        stdin=subprocess.DEVNULL, start_new_session=True)
    wait_until("the MPS daemon service listening", lambda: _answers(node.state / "mps-daemons.sock")
               or service.poll() is not None, timeout=60)
    assert service.poll() is None, f"the MPS daemon service exited with {service.returncode}"
    return service


def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(str(path))
        except OSError:
            return False
    return True


def _end(process: subprocess.Popen[bytes] | None) -> None:
    if process is not None and process.poll() is None:
        process.kill()
        process.wait(timeout=30)


def _run_agent(node: IsolationNode, group: Path, mode: str) -> subprocess.Popen[bytes]:
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT, str(group / "cgroup.procs"), mode, str(node.state), str(node.control), CARD],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, start_new_session=True)
    assert agent.stdout is not None
    line = agent.stdout.readline()  # the agent prints once its card's daemon runs (ensure has a deadline)
    assert line == b"ready\n", f"the agent did not get its card's daemon (exit {agent.poll()})"
    return agent


def _client(node: IsolationNode) -> isolation.MpsDaemonsClient:
    return isolation.MpsDaemonsClient(socket_path=node.state / "mps-daemons.sock", state_dir=node.state / "mps")


def test_an_agent_stopped_by_its_runtime_takes_its_own_daemons_along(tmp_path: Path, cgroup: Path) -> None:
    """The old way, for contrast (and to show the kill below is real): the daemons the agent ran die with it."""
    node = IsolationNode(tmp_path / "node")
    agent = None
    try:
        agent = _run_agent(node, cgroup, "here")
        [daemon] = node.servers()
        _stop_like_a_runtime(cgroup)
        wait_until("the daemon gone with the agent", lambda: node.servers() == [])
        assert daemon not in node.servers()
    finally:
        _end(agent)
        node.close()


def test_an_agent_killed_leaves_the_service_s_daemons_and_their_ceiling(tmp_path: Path, cgroup: Path) -> None:
    node = IsolationNode(tmp_path / "node")
    service = agent = None
    try:
        service = _start_service(node)
        agent = _run_agent(node, cgroup, "service")
        [daemon] = node.servers()
        ceiling = CEILING.commands()
        assert node.commands(CARD)[-len(ceiling):] == ceiling  # the slice's ceiling, on the daemon
        _stop_like_a_runtime(cgroup)  # kill -9 of the agent, or its container stopped: every process of it
        assert agent.wait(timeout=30) == -signal.SIGKILL
        time.sleep(1.0)  # several supervision passes of the service
        assert node.servers() == [daemon], "the MPS daemon died with the agent"
        # The next agent finds the same daemon, which kept its ceiling: nothing started, nothing sent again.
        sent = len(node.commands(CARD))
        client = _client(node)
        assert client.problem() is None
        client.ensure(CARD, CEILING)
        assert client.pid(CARD) == daemon and node.starts() == [CARD]
        assert len(node.commands(CARD)) == sent
        # The card's last container gone: the service stops its daemon.
        assert client.release_except([]) == [CARD.lower()]
        assert node.servers() == [] and node.quits() == [CARD]
    finally:
        _end(agent)
        _end(service)
        node.close()


def test_a_killed_service_is_run_again_and_adopts_its_daemons(tmp_path: Path) -> None:
    node = IsolationNode(tmp_path / "node")
    service = None
    try:
        service = _start_service(node)
        _client(node).ensure(CARD, CEILING)
        [daemon] = node.servers()
        service.send_signal(signal.SIGKILL)
        service.wait(timeout=30)
        assert node.servers() == [daemon]
        with pytest.raises(isolation.MpsServiceUnreachable, match="elasticgpu-mps"):
            _client(node).ensure(CARD, CEILING)  # the agent refuses the container, retryably, and says why
        service = _start_service(node)  # its socket left behind is replaced
        client = _client(node)
        assert client.pid(CARD) == daemon and node.starts() == [CARD]
        client.ensure(CARD, CEILING)  # adopted, not started again (its ceiling is given again: harmless)
        assert client.pid(CARD) == daemon and node.starts() == [CARD]
        # Supervised after the adoption: a daemon that dies is started again.
        os.kill(daemon, signal.SIGKILL)
        wait_until("the adopted daemon started again", lambda: node.starts() == [CARD, CARD]
                   and client.pid(CARD) not in (None, daemon))
    finally:
        _end(service)
        node.close()


def test_only_the_owner_reaches_the_service_and_a_bad_request_is_answered(tmp_path: Path) -> None:
    node = IsolationNode(tmp_path / "node")
    service = None
    try:
        service = _start_service(node)
        path = node.state / "mps-daemons.sock"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        for request in (b"not json\n", b'{"op": "ensure", "uuid": "../../etc"}\n', b'{"op": "format"}\n'):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(30)
                conn.connect(str(path))
                conn.sendall(request)
                with conn.makefile("rb") as answer:
                    assert "bad_request" in json.loads(answer.readline()), request
        assert _client(node).problem() is None and service.poll() is None  # still serving
        assert not (node.state / "etc").exists() and node.starts() == []
    finally:
        _end(service)
        node.close()


def test_the_agent_s_mps_room_refuses_retryably_while_the_service_is_away(tmp_path: Path) -> None:
    """The agent's side as running.py builds it with --mps-daemons-socket: while the service does not answer, an
    MPS container is refused retryably, naming the service, the cards stop offering MPS, and a sync of the runtime's
    containers neither fails nor stops anything; once the service answers, the container gets its daemon."""
    node = IsolationNode(tmp_path / "node")
    room = isolation.MpsRoom(_client(node), control=lambda: str(node.control), control_setting="the test")
    slice_ = isolation.Slice(claim="team/c", uuids=(CARD,), cores=30, memory_mib=1024, pod_uid="u", container="main")
    service = None
    try:
        with pytest.raises(isolation.Unavailable) as refused:
            room.prepare(slice_)
        assert refused.value.retryable and "elasticgpu-mps" in refused.value.message
        assert "does not answer" in (room.problem() or "")
        room.sync([])  # no exception: the next sync tries again
        service = _start_service(node)
        assert room.problem() is None
        room.prepare(slice_)
        [daemon] = node.servers()
        assert _client(node).pid(CARD) == daemon and node.commands(CARD)[-2:] == CEILING.commands()
    finally:
        _end(service)
        node.close()
