"""The MPS daemon's pid file is a tenant's to write, and never leads the agent to another process (issue 44):
kubelet (our CRI client) -> proxy with claim hooks -> real containerd, the stand-in control binary.

The pipe folder is mounted writable into the card's MPS containers (clients write to its pipes), and the daemon
writes its pid file there. Before, `stop` killed whatever live process with the control binary's name the file
named: a tenant of one card could have the agent SIGKILL another card's daemon (every client of another tenant on
that card lost its work), and a process of its own container, named like the daemon, passed for the card's
daemon, so the supervisor never started the real one again. Now a pid is taken for the card's daemon only when the
process is (its root is the agent's, its environment names the card's pipe folder, its start time is the one the
agent recorded where only it writes), and it is signalled through a pidfd."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from elasticgpu.agent.isolation import mps_finding
from tests.agent.cri.isolation_node import wait_until
from tests.agent.cri.node import CARDS
from tests.agent.cri.test_isolation import Node, make_node, run, sh
from tests.containerd_runtime import TestRuntime

CARD, OTHER = CARDS[0].uuid, CARDS[1].uuid
PID_FILE = "/run/nvidia-mps/nvidia-cuda-mps-control.pid"


@pytest.fixture
def node(containerd: TestRuntime, proxy_socket: Path, tmp_path: Path) -> Iterator[Node]:
    yield from make_node(containerd, proxy_socket, tmp_path)


def alive(pid: int) -> bool:
    return mps_finding.start_time(pid) is not None and mps_finding.is_control(pid)


def test_a_pid_file_naming_another_card_s_daemon_never_gets_it_killed(node: Node) -> None:
    iso = node.isolation
    mine = run(node, "trainer", "train", mode="MPS")
    run(node, "server", "serve", mode="MPS", gpus=(OTHER,))  # another tenant's claim on the other card
    own, victim = iso.daemons.pid(CARD), iso.daemons.pid(OTHER)
    assert own is not None and victim is not None and own != victim
    # The tenant of the first card names the other card's daemon in its pid file.
    assert sh(node, mine, f"echo {victim} > {PID_FILE}")[0] == 0
    # The first card's claim ends: its daemon is stopped, and only it.
    node.kubelet.remove_container(mine)
    iso.daemons.release_except([OTHER])
    assert alive(victim), "the agent killed the other card's daemon named in a tenant's pid file"
    assert not alive(own) and iso.daemons.pid(CARD) is None
    assert iso.daemons.pid(OTHER) == victim and iso.quits() == [CARD]


def test_a_container_process_named_like_the_daemon_is_never_taken_for_it(node: Node) -> None:
    iso = node.isolation
    mine = run(node, "trainer", "train", mode="MPS")
    own = iso.daemons.pid(CARD)
    assert own is not None
    # A process of the tenant's container that calls itself the control daemon, with the card's pipe folder as
    # the agent sees it in its environment: only its root tells it from the daemon.
    pipe = iso.daemons.pipe_dir(CARD)
    marker = "elasticgpu-test-impostor"
    script = (f"CUDA_MPS_PIPE_DIRECTORY={pipe} sh -c 'while :; do sleep 1; done; {marker}' "
              f"nvidia-cuda-mps-control >/dev/null 2>&1 &")
    assert sh(node, mine, script)[0] == 0
    impostor = wait_for_impostor(marker)
    try:
        # The real daemon dies; the tenant removes the agent's way to it and names its own process.
        os.kill(own, signal.SIGKILL)
        assert sh(node, mine, f"echo {impostor} > {PID_FILE}")[0] == 0
        wait_until("the supervisor started the card's daemon again",
                   lambda: iso.starts() == [CARD, CARD] and iso.daemons.pid(CARD) not in (None, own, impostor))
        assert alive(impostor)
    finally:
        os.kill(impostor, signal.SIGKILL)


def wait_for_impostor(marker: str) -> int:
    found: list[int] = []

    def look() -> bool:
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                except OSError:
                    continue
                if marker.encode() in cmdline and cmdline.split(b"\0")[-2:-1] == [b"nvidia-cuda-mps-control"]:
                    found.append(int(entry))
                    return True
        return False

    wait_until("the impostor running", look)
    return found[0]

