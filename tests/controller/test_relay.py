"""The test relay (`relay.Relay`) itself: `refuse` leaves no connection alive, even one accepted
while it ran (accepted, its upstream being opened, not yet recorded: the old relay relayed it for
good, and a fault-injection test "without the API server" still had a working connection)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from tests.controller.relay import Relay

DEADLINE_S = 10.0
HAMMERS = 4
ROUNDS = 30


class Echo:
    """A TCP server on loopback that sends back what it reads: a connection that answers is alive."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.address = ("127.0.0.1", int(self._server.getsockname()[1]))
        threading.Thread(target=self._accept, daemon=True, name="echo-accept").start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True, name="echo").start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(4096):
                conn.sendall(data)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()


def _alive(sock: socket.socket) -> bool:
    """Whether the connection still reaches the echo server (an echo within 2 s)."""
    sock.settimeout(2.0)
    try:
        sock.sendall(b"x")
        return sock.recv(1) == b"x"
    except OSError:  # reset, broken pipe, or no answer within the timeout
        return False


def _hammer(port: int, stop: threading.Event, opened: list[socket.socket], lock: threading.Lock) -> None:
    while not stop.is_set():
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=0.2)  # a SYN the closing port dropped: 1 s
        except OSError:
            time.sleep(0.001)  # refused: the port is closed; the next round reopens it
            continue
        with lock:
            opened.append(sock)


def test_no_connection_survives_refuse_while_clients_connect() -> None:
    echo = Echo()
    relay = Relay(echo.address)
    survivors: list[int] = []
    try:
        for round_ in range(ROUNDS):
            stop, lock, opened = threading.Event(), threading.Lock(), []
            hammers = [threading.Thread(target=_hammer, args=(relay.port, stop, opened, lock), daemon=True)
                       for _ in range(HAMMERS)]
            for thread in hammers:
                thread.start()
            deadline = time.monotonic() + DEADLINE_S
            while len(opened) < 20:  # connecting in full swing
                assert time.monotonic() < deadline, "the relay accepted no connection"
                time.sleep(0.001)
            relay.refuse()
            stop.set()
            for thread in hammers:
                thread.join(DEADLINE_S)
                assert not thread.is_alive(), "a client thread hung"
            with lock:
                got = list(opened)
            survivors += [round_ for sock in got if _alive(sock)]
            for sock in got:
                sock.close()
            relay.accept_again()
        assert not survivors, f"connections relayed after refuse() returned, in rounds {survivors}"
    finally:
        relay.close()
        echo.close()
