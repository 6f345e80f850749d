"""elasticgpu/testbed/free_ports.py: a component whose port was taken between choosing and binding it
starts again on a fresh one (the real control plane failed once so in a full suite: a benchmark took
kube-controller-manager's port). A tiny real server here, `python -m http.server`, on a port the test
holds bound itself; tests/realcluster/test_control_plane_ports.py does the same to Kubernetes' own."""

from __future__ import annotations

import socket
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from elasticgpu.testbed import free_ports, processes
from tests import spawning

pytestmark = pytest.mark.timeout(150)

READY_WITHIN_S = 20.0


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port this test holds (listening: a server with SO_REUSEADDR cannot bind it either)."""
    with socket.create_server(("127.0.0.1", 0)) as held:
        yield int(held.getsockname()[1])


@pytest.fixture
def children() -> Iterator[processes.Children]:
    started = processes.Children(spawn=spawning.spawn)
    yield started
    started.stop_all()


def _http_server(choose: Callable[[], int], chosen: list[int]) -> Callable[[], tuple[list[str], int]]:
    def command() -> tuple[list[str], int]:
        chosen.append(choose())
        return [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(chosen[-1])], chosen[-1]

    return command


def _answers(port: int) -> Callable[[], bool]:
    def check() -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as answer:
            return bool(answer.status == 200)

    return check


def test_a_port_taken_before_the_bind_is_chosen_again(
    held_port: int, children: processes.Children, tmp_path: Path
) -> None:
    handed = iter([held_port])
    chosen: list[int] = []
    child, port = free_ports.start_on_free_ports(
        children, "http.server", _http_server(lambda: next(handed, 0) or free_ports.free_port(), chosen),
        log=tmp_path / "server.log", ready=_answers, timeout_s=READY_WITHIN_S,
    )  # fmt: skip
    assert chosen == [held_port, port] and port != held_port
    assert child.running() and _answers(port)()
    assert children.started == [child]  # the failed attempt forgotten: waits over `started` would fail on it
    assert (tmp_path / "server.log").read_text().count("Address already in use") == 1  # the first attempt's


def test_a_port_taken_at_every_attempt_fails_naming_the_component(
    held_port: int, children: processes.Children, tmp_path: Path
) -> None:
    chosen: list[int] = []
    with pytest.raises(processes.DemoError, match=r"http\.server exited with 1"):
        free_ports.start_on_free_ports(
            children, "http.server", _http_server(lambda: held_port, chosen),
            log=tmp_path / "server.log", ready=_answers, timeout_s=READY_WITHIN_S,
        )  # fmt: skip
    assert chosen == [held_port] * free_ports.PORT_ATTEMPTS


def test_another_failure_is_not_tried_again(children: processes.Children, tmp_path: Path) -> None:
    attempts: list[int] = []

    def command() -> tuple[list[str], int]:
        attempts.append(1)
        return [sys.executable, "-c", "raise SystemExit('no such flag')"], 0

    with pytest.raises(processes.DemoError, match="exited with 1"):
        free_ports.start_on_free_ports(children, "broken", command, log=tmp_path / "broken.log", ready=_answers,
                                       timeout_s=READY_WITHIN_S)  # fmt: skip
    assert len(attempts) == 1


STAYING = """
import http.server, sys, time
while True:  # as kubelet's healthz server: a taken port is logged and tried again, the process stays
    try:
        http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), http.server.SimpleHTTPRequestHandler).serve_forever()
    except OSError as error:
        print(f"failed to start the server: {error}", flush=True)
        time.sleep(5)
"""


def test_a_process_that_stays_up_on_a_taken_port_is_started_again_at_once(
    held_port: int, children: processes.Children, tmp_path: Path
) -> None:
    handed = iter([held_port])
    chosen: list[int] = []

    def command() -> tuple[list[str], int]:
        chosen.append(next(handed, 0) or free_ports.free_port())
        return [sys.executable, "-c", STAYING, str(chosen[-1])], chosen[-1]

    timeout_s = 60.0
    began = time.monotonic()
    child, port = free_ports.start_on_free_ports(children, "staying", command, log=tmp_path / "staying.log",
                                                 ready=_answers, timeout_s=timeout_s)  # fmt: skip
    took = time.monotonic() - began
    assert chosen == [held_port, port] and child.running() and children.started == [child]
    assert took < timeout_s / 2, f"the first attempt was waited out ({took:.1f} s), not ended when its log said so"
