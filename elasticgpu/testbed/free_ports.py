"""Starting a process on free loopback ports, again on fresh ones when a port was taken meanwhile.

A port that `free_port` found free is only free until someone binds it: on the shared machines
another test or a benchmark starting its own servers can take it between the choice and the bind
("bind: address already in use", seen once for kube-controller-manager in a full suite). So a
component chooses its ports when it starts (`command()` is called once per attempt), and
`start_on_free_ports` starts it again on fresh ones when its log says the port was taken. Both
launchers use it: local_cluster.py (etcd and the test API server) and real_cluster.py (etcd and
Kubernetes' own components).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from elasticgpu.testbed import processes

T = TypeVar("T")

PORT_ATTEMPTS = 3
"""Starts of one component on fresh ports when the one chosen was taken meanwhile by another process."""
TAKEN = "already in use"
"""What a bind error says, lower-cased: Go writes `bind: address already in use`, Python's
http.server `[Errno 98] Address already in use`, `elasticgpu webhook` `a port to listen on
(--port N) is already in use`."""

ChoosePort = Callable[[str], int]
"""How a launcher chooses a port, given its name (the key of `ControlPlane.ports`: "etcd",
"kube-apiserver", ...): `any_free_port` in use; the tests pass one that hands out a port they hold."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def any_free_port(name: str) -> int:
    """`free_port()` whatever the port is for (the ChoosePort of normal use)."""
    return free_port()


class _Attempt:
    """What one attempt wrote to the log (attempts append to one log): read as it grows, so a long
    log (kube-apiserver's start) is read once, not at every poll."""

    def __init__(self, log: Path) -> None:
        self._log = log
        try:
            self._offset = log.stat().st_size
        except FileNotFoundError:
            self._offset = 0
        self._tail = ""
        self.taken = False

    def port_taken(self) -> str:
        """Why waiting is hopeless, once the attempt's log says a port was taken (kubelet's healthz
        server logs it and tries again every 5 s instead of exiting); "" until then."""
        if not self.taken:
            try:
                with self._log.open("rb") as f:
                    f.seek(self._offset)
                    raw = f.read()
            except OSError:
                raw = b""
            self._offset += len(raw)
            fresh = raw.decode(errors="replace")
            # The tail of the last read too: the words may straddle two reads.
            self.taken = TAKEN in (self._tail + fresh).lower()
            self._tail = fresh[-len(TAKEN) :]
        return "its log says a port it was given is taken (already in use)" if self.taken else ""


def start_on_free_ports(
    children: processes.Children,
    name: str,
    command: Callable[[], tuple[list[str], T]],
    *,
    log: Path,
    ready: Callable[[T], Callable[[], bool]],
    timeout_s: float,
    env: dict[str, str] | None = None,
    also: Sequence[processes.Child] = (),
    cwd: Path | None = None,
    attempts: int = PORT_ATTEMPTS,
) -> tuple[processes.Child, T]:
    """Start `name` with the arguments `command()` gives (choosing its ports; with what it chose,
    `where`) until `ready(where)` passes; again, with a fresh `command()`, as soon as this attempt's
    log says a port was taken (whether it exits or not), up to `attempts` times. Returns the child
    and `where`.

    Raises processes.DemoError when it does not come up for another reason, or still finds its
    port taken at the last attempt: its child is in `children` (stopped); the attempts before it
    are forgotten (Children.forget), as after a start that came up."""
    for attempt in range(1, attempts + 1):
        arguments, where = command()
        this = _Attempt(log)
        child = children.start(name, arguments, log=log, env=env, cwd=cwd)
        try:
            processes.wait_until(ready(where), f"{name} to answer", timeout_s=timeout_s, children=[*also, child],
                                 hopeless=this.port_taken)  # fmt: skip
            return child, where
        except processes.DemoError:
            this.port_taken()  # what it wrote as it exited
            if attempt == attempts or not this.taken:
                child.stop()
                raise
            children.forget(child)
    raise AssertionError("unreachable: the last attempt returns or raises")
