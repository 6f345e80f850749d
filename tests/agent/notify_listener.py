"""What systemd does with `$NOTIFY_SOCKET`, for tests: a unix datagram socket that receives the
agent's `KEY=value` lines (a path, or an abstract name written with a leading `@`)."""

from __future__ import annotations

import socket
import time


class Listener:
    """What systemd does with $NOTIFY_SOCKET: receive datagrams of KEY=value lines."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.address = address

    def receive(self, timeout_s: float) -> dict[str, str] | None:
        """The next datagram's fields, or None when none comes within `timeout_s`."""
        self.sock.settimeout(timeout_s)
        try:
            data = self.sock.recv(4096)
        except TimeoutError:
            return None
        return dict(line.split("=", 1) for line in data.decode().splitlines())

    def until(self, key: str, timeout_s: float) -> list[dict[str, str]]:
        """Every datagram up to and including the first carrying `key`; fails after `timeout_s`."""
        seen: list[dict[str, str]] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            fields = self.receive(max(0.01, deadline - time.monotonic()))
            if fields is not None:
                seen.append(fields)
                if key in fields:
                    return seen
        raise AssertionError(f"no {key} within {timeout_s} s; got {seen}")


def drain(listener: Listener, for_s: float = 0.0) -> list[dict[str, str]]:
    """Every datagram that arrives within `for_s` seconds (or is already waiting)."""
    seen: list[dict[str, str]] = []
    deadline = time.monotonic() + for_s
    while True:
        fields = listener.receive(max(0.01, deadline - time.monotonic()))
        if fields is None:
            return seen
        seen.append(fields)
