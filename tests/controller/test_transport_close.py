"""`Transport.close` while other threads still use their connections (a controller closes its
client as it stops, while its worker may still be inside a request): their descriptors stay
theirs until they let go, and a read in flight ends at once.

The old close closed every thread's socket: a descriptor a thread was reading went to the next
socket anyone in the process opened, and two TLS streams mixed (tests/controller/test_early_start.py
errored at teardown with DECRYPTION_FAILED_OR_BAD_RECORD_MAC once under load 6-10). Against a real
socket server on loopback that holds one answer until the test releases it."""

from __future__ import annotations

import http.client
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

from elasticgpu.controller.edge.transport import Transport

DEADLINE_S = 10.0
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"


@contextmanager
def _server(held: threading.Event, release: threading.Event) -> Iterator[int]:
    """A plain HTTP server on loopback, a thread per connection, keep-alive: it answers every
    request at once but one for /held, which it answers when `release` is set (at most 30 s),
    `held` set once that request is read. Yields the port."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer(conn: socket.socket) -> None:
        with conn:
            buffered = b""
            while True:
                while b"\r\n\r\n" not in buffered:
                    try:
                        data = conn.recv(65536)
                    except OSError:
                        return
                    if not data:
                        return
                    buffered += data
                head, _, buffered = buffered.partition(b"\r\n\r\n")
                if head.split(b" ")[1] == b"/held":
                    held.set()
                    release.wait(30.0)
                try:
                    conn.sendall(ANSWER)
                except OSError:
                    return

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        release.set()
        listener.close()
        thread.join(timeout=DEADLINE_S)


def _transport(port: int) -> Transport:
    return Transport(SimpleNamespace(host=f"http://127.0.0.1:{port}", auth_settings=dict))


def _get(transport: Transport, path: str) -> tuple[int, bytes]:
    return transport.request("GET", path, body=None, content_type="", timeout_s=20.0)


def test_a_read_in_flight_on_another_thread_ends_at_once() -> None:
    held, release = threading.Event(), threading.Event()
    with _server(held, release) as port:
        transport = _transport(port)
        outcome: list[object] = []

        def waiting() -> None:
            try:
                outcome.append(_get(transport, "/held"))  # its first request: no retry on a new connection
            except (OSError, http.client.HTTPException) as err:
                outcome.append(err)

        worker = threading.Thread(target=waiting, daemon=True)
        worker.start()
        assert held.wait(DEADLINE_S), "the server never read the request"
        closed = time.monotonic()
        transport.close()
        worker.join(DEADLINE_S / 2)
        # Old code: the socket closed under the reader woke nothing; it waited for the answer
        # (released below, after the deadline), its descriptor meanwhile free for anyone's socket.
        assert not worker.is_alive(), "a request in flight on another thread still waits after close"
        assert time.monotonic() - closed < DEADLINE_S / 2
        assert outcome and isinstance(outcome[0], (OSError, http.client.HTTPException)), outcome


def test_a_connection_another_thread_holds_keeps_its_descriptor_until_it_lets_go() -> None:
    held, release = threading.Event(), threading.Event()
    with _server(held, release) as port:
        transport = _transport(port)
        assert _get(transport, "/mine") == (200, b"{}")
        mine = transport._local.conn
        descriptor: list[int] = []
        parked, go = threading.Event(), threading.Event()
        after: list[tuple[int, bytes]] = []

        def holding() -> None:
            _get(transport, "/first")
            descriptor.append(transport._local.conn.sock.fileno())
            parked.set()
            go.wait(DEADLINE_S)  # between two requests: its kept connection is still its own
            after.append(_get(transport, "/second"))

        worker = threading.Thread(target=holding, daemon=True)
        worker.start()
        try:
            assert parked.wait(DEADLINE_S), "the other thread's first request never ended"
            before = os.fstat(descriptor[0])
            transport.close()
            # Old code: closed here (EBADF), or already another socket's (a new inode).
            assert os.fstat(descriptor[0]).st_ino == before.st_ino, "close released another thread's descriptor"
            assert mine.sock is None, "this thread's own connection is closed at once"
        finally:
            go.set()
            worker.join(DEADLINE_S)
        # Its next request finds the connection dead and reopens it, as one the server closed.
        assert after == [(200, b"{}")]
