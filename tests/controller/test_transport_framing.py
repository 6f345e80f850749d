"""The transport's HTTP/1.1 framing against a real socket server that answers in the shapes the
API server seldom uses (a 100 Continue, a body split across chunks and reads, an answer that
closes the connection, several watch events in one chunk, one event over three chunks)."""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from elasticgpu.controller.edge.transport import Transport


@contextmanager
def _server(answers: list[list[bytes]]) -> Iterator[tuple[int, list[bytes]]]:
    """A plain HTTP server on loopback: for each accepted connection, reads one request per
    entry of `answers` and writes that entry's pieces (one `sendall` each, a pause between);
    an empty entry closes the connection. Yields the port and the requests it read."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    requests: list[bytes] = []

    def serve() -> None:
        queue = list(answers)
        while queue:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                buffered = b""
                while queue:
                    pieces = queue.pop(0)
                    if not pieces:
                        break
                    while b"\r\n\r\n" not in buffered:
                        data = conn.recv(65536)
                        if not data:
                            return
                        buffered += data
                    head, _, buffered = buffered.partition(b"\r\n\r\n")
                    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                                   if line.lower().startswith(b"content-length:")), 0)
                    while len(buffered) < length:
                        buffered += conn.recv(65536)
                    requests.append(head + b"\r\n\r\n" + buffered[:length])
                    buffered = buffered[length:]
                    for piece in pieces:
                        conn.sendall(piece)
                        threading.Event().wait(0.01)  # separate reads on the client's side

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], requests
    finally:
        listener.close()
        thread.join(timeout=5)


def _transport(port: int) -> Transport:
    configuration = SimpleNamespace(host=f"http://127.0.0.1:{port}", auth_settings=lambda: {
        "BearerToken": {"in": "header", "key": "authorization", "value": "Bearer t0ken"}})
    return Transport(configuration)


def test_answers_in_every_framing_on_one_kept_connection() -> None:
    chunked = [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n", b"2;x=1\r\n1}\r\n",
               b"0\r\nTrailer: t\r\n\r\n"]
    with _server([
        [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 201 Created\r\ncontent-length: 7\r\n\r\n{\"b\":", b"2}"],
        chunked,
        [b"HTTP/1.1 204 No Content\r\n\r\n"],
        [b"HTTP/1.1 409 Conflict\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"],
    ]) as (port, requests):
        transport = _transport(port)
        assert transport.request("POST", "/x?y=1", body=b'{"z":1}', content_type="application/json",
                                 timeout_s=5) == (201, b'{"b":2}')
        assert transport.request("GET", "/x", body=None, content_type="", timeout_s=5) == (200, b'{"a":1}')
        assert transport.request("DELETE", "/x", body=None, content_type="", timeout_s=5) == (204, b"")
        first = transport._local.conn
        assert transport.request("PATCH", "/x", body=b"{}", content_type="application/merge-patch+json",
                                 timeout_s=5) == (409, b"{}")
        assert transport._local.conn is None, "an answer with Connection: close must not be reused"
        assert first is not None and first.sock is None
        transport.close()
    head = requests[0].split(b"\r\n")
    assert head[0] == b"POST /x?y=1 HTTP/1.1"
    assert b"authorization: Bearer t0ken" in head and b"Content-Length: 7" in head
    assert requests[0].endswith(b'{"z":1}')
    assert len(requests) == 4


def test_a_connection_closed_while_idle_is_reopened_once() -> None:
    with _server([[b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"], [],
                  [b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n\"ok\""]]) as (port, requests):
        transport = _transport(port)
        assert transport.request("GET", "/a", body=None, content_type="", timeout_s=5) == (200, b"{}")
        # The server closed the kept connection after its first answer: the second request is
        # sent once more, on a new connection.
        assert transport.request("GET", "/b", body=None, content_type="", timeout_s=5) == (200, b'"ok"')
        transport.close()
    assert [r.split(b" ")[1] for r in requests] == [b"/a", b"/b"]


def test_an_answer_cut_short_fails_and_drops_the_connection() -> None:
    with _server([[b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}"]]) as (port, _):
        transport = _transport(port)
        with pytest.raises(http.client.IncompleteRead):
            transport.request("GET", "/a", body=None, content_type="", timeout_s=5)
        assert transport._local.conn is None


def test_a_watch_yields_each_line_however_it_is_chunked() -> None:
    event = b'{"type":"ADDED","object":{"n":%d}}\n'
    two_in_one = event % 1 + event % 2
    split = event % 3
    with _server([[b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                   b"%x\r\n%s\r\n" % (len(two_in_one), two_in_one),
                   b"%x\r\n%s\r\n" % (10, split[:10]), b"%x\r\n%s\r\n" % (5, split[10:15]),
                   b"%x\r\n%s\r\n" % (len(split) - 15, split[15:]),
                   b"%x\r\n%s\r\n" % (len(event % 4), event % 4), b"0\r\n\r\n"]]) as (port, _):
        stream = _transport(port).stream("/w?watch=true", connect_timeout_s=5, read_timeout_s=5)
        assert stream.status == 200
        lines = list(stream.lines())
        stream.close()
    assert lines == [(event % n).rstrip(b"\n") if n in (1, 2, 3) else event % n for n in (1, 2, 3, 4)]


def test_a_silent_watch_times_out() -> None:
    # The second entry keeps the connection open and silent: the server waits for a request.
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    with _server([[head, b"3\r\n{}\n\r\n"], [b"never"]]) as (port, _):
        stream = _transport(port).stream("/w?watch=true", connect_timeout_s=5, read_timeout_s=0.5)
        lines = stream.lines()
        assert next(lines) == b"{}\n"
        with pytest.raises(TimeoutError):
            next(lines)
        stream.close()
