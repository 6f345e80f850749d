"""HTTP/1.1 keep-alive connections to the API server, one per thread, for `kube.KubeApi`.

Why not the kubernetes client's own path (`ApiClient.call_api` over urllib3): under a burst
of binds it cost about a quarter of the controller's CPU (py-spy, `bench/binding.py`) in
per-call work this controller does not need: walking every body through
`sanitize_for_serialization`, building urllib3 pool keys and header dicts, checking each pooled
connection for a drop. Why not `http.client` either: it parses every answer's headers with the
`email` package and reads them line by line through a buffered file, about a third of the
client's CPU per request (bench/README.md, "controller CPU per claim"); a watch through urllib3
costs as much again per event (chunk framing read a line at a time). Here a request is one
`sendall` of bytes built in one piece, and an answer is read in large blocks from the socket
and framed (status line, the three headers that matter, Content-Length or chunked body) in a
few byte-string operations.

This transport keeps what matters from the client's `Configuration` (server address, CA, client
certificate, bearer token with its refresh hook, TLS server name). It knows nothing of
Kubernetes objects: bytes in, (status, bytes) out, or a `Stream` of lines for a watch.
Connection failures are raised as `OSError` / `http.client.HTTPException` (a read timeout is
`TimeoutError`, an `OSError`) for `KubeApi` to translate.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import types
import weakref
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import urlsplit

_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ssl.SSLEOFError)
"""What reading an answer raises when the server had closed the connection before it."""

_READ_SIZE = 65536
"""Bytes asked of the socket per read: a whole answer, or many watch events, in one call."""

_MAX_HEAD = 65536
"""The longest status line and headers accepted before the answer is called malformed."""

_NO_BODY = frozenset((204, 304))


def _header(head: bytes, marker: bytes) -> bytes | None:
    """The value of the header `marker` (b"\\r\\nname:") in a lowered head, stripped; None if absent."""
    at = head.find(marker)
    if at < 0:
        return None
    start = at + len(marker)
    return head[start:head.find(b"\r\n", start)].strip()


class Connection:
    """One HTTP/1.1 connection: a socket (TLS or plain) and the bytes read ahead of the answer
    being framed."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock: socket.socket | None = sock
        self._buffer = bytearray()
        self._scratch = bytearray(_READ_SIZE)
        self._view = memoryview(self._scratch)
        self.timeout_s: float | None = None
        self.owner: threading.Thread | None = None
        """The thread that alone reads and writes it (None: shared, the caller serialises)."""

    def settimeout(self, timeout_s: float) -> None:
        """Every later read and write of this connection gives up after `timeout_s` of silence."""
        if timeout_s != self.timeout_s and self.sock is not None:
            self.sock.settimeout(timeout_s)
            self.timeout_s = timeout_s

    def close(self) -> None:
        """Close the socket (idempotent)."""
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()

    def shut_down(self) -> None:
        """End the connection both ways but keep its descriptor (`Transport.close` for another
        thread's connection): a read on it ends with the end of the stream, a write fails, and
        the owner closes it (`close`) when it next uses it."""
        sock = self.sock
        if sock is not None:
            with contextlib.suppress(OSError):  # already closed by its owner, or never connected
                # The plain socket's shutdown: SSLSocket.shutdown also drops the TLS object,
                # which the owner may be inside this instant (this is not its thread).
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def fill(self) -> bool:
        """Read what the socket has (at least one byte, waiting up to the timeout) into the
        buffer; False at the end of the stream."""
        if self.sock is None:
            raise http.client.HTTPException("the connection was closed")
        count = self.sock.recv_into(self._view, _READ_SIZE)
        if count == 0:
            return False
        self._buffer += self._view[:count]
        return True

    def read_head(self) -> tuple[int, bool, int | None, bool]:
        """Read a status line and headers: (status, chunked, Content-Length or None, whether the
        server closes the connection after this answer). 1xx answers are skipped."""
        while True:
            start = 0
            while (end := self._buffer.find(b"\r\n\r\n", start)) < 0:
                start = max(0, len(self._buffer) - 3)
                if len(self._buffer) > _MAX_HEAD:
                    raise http.client.LineTooLong("answer headers")
                if not self.fill():
                    if self._buffer:
                        raise http.client.IncompleteRead(bytes(self._buffer))
                    raise http.client.RemoteDisconnected("the server closed the connection without an answer")
            head = bytes(self._buffer[:end + 2]).lower()  # with the last CRLF: every header ends in one
            del self._buffer[:end + 4]
            line_end = head.find(b"\r\n")
            version, _, rest = head[:line_end].partition(b" ")
            code = rest[:3]
            if not version.startswith(b"http/1.") or not code.isdigit():
                raise http.client.BadStatusLine(head[:line_end].decode("latin-1"))
            status = int(code)
            if 100 <= status < 200:
                continue  # 100 Continue and the like: the real answer follows
            # Three headers matter; finding them beats splitting every line (header names are
            # case-insensitive: `head` is lowered; optional whitespace is stripped).
            length_value = _header(head, b"\r\ncontent-length:")
            length = int(length_value) if length_value is not None else None
            chunked = b"chunked" in (_header(head, b"\r\ntransfer-encoding:") or b"")
            connection = _header(head, b"\r\nconnection:")
            close = connection == b"close" or (version == b"http/1.0" and connection != b"keep-alive")
            return status, chunked, length, close

    def read_exact(self, count: int) -> bytes:
        """The next `count` bytes."""
        while len(self._buffer) < count:
            if not self.fill():
                raise http.client.IncompleteRead(bytes(self._buffer), count - len(self._buffer))
        data = bytes(self._buffer[:count])
        del self._buffer[:count]
        return data

    def read_line(self) -> bytes:
        """The next line without its CRLF (chunk sizes and trailers)."""
        start = 0
        while (end := self._buffer.find(b"\r\n", start)) < 0:
            start = max(0, len(self._buffer) - 1)
            if len(self._buffer) > _MAX_HEAD:
                raise http.client.LineTooLong("chunk size")
            if not self.fill():
                raise http.client.IncompleteRead(bytes(self._buffer))
        line = bytes(self._buffer[:end])
        del self._buffer[:end + 2]
        return line

    def read_chunk(self) -> bytes | None:
        """The data of the next chunk of a chunked body; None after the last (trailers read)."""
        size_line = self.read_line()
        try:
            size = int(size_line.split(b";", 1)[0], 16)
        except ValueError:
            raise http.client.HTTPException(f"bad chunk size {size_line[:40]!r}") from None
        if size == 0:
            while self.read_line():
                pass  # trailers, up to the empty line
            return None
        data = self.read_exact(size + 2)
        return data[:-2]

    def take_buffered(self) -> bytes:
        """The bytes read ahead and not yet framed (emptied)."""
        data = bytes(self._buffer)
        self._buffer.clear()
        return data

    def read_to_end(self) -> bytes:
        """Everything until the server closes the connection (an answer with no length)."""
        while self.fill():
            pass
        data = bytes(self._buffer)
        self._buffer.clear()
        return data

    def read_body(self, status: int, chunked: bool, length: int | None, method: str) -> tuple[bytes, bool]:
        """The body of an answer whose head was read, and whether the connection can be reused."""
        if method == "HEAD" or status in _NO_BODY:
            return b"", True
        if chunked:
            parts = []
            while (chunk := self.read_chunk()) is not None:
                parts.append(chunk)
            return b"".join(parts), True
        if length is not None:
            return self.read_exact(length), True
        return self.read_to_end(), False


class Stream:
    """A watch: the answer's status, and its body as lines (one JSON event each) until the server
    ends it. The connection is its own, closed by `close`."""

    def __init__(self, conn: Connection, status: int, chunked: bool, length: int | None) -> None:
        self._conn = conn
        self.reader = threading.current_thread()
        """The thread that opened it, which reads it (`Transport.end_watches`)."""
        self.status = status
        self._chunked = chunked
        self._length = length

    def read(self) -> bytes:
        """The whole body (of an answer that is not a watch: an error's Status)."""
        return self._conn.read_body(self.status, self._chunked, self._length, "GET")[0]

    def _pieces(self) -> Iterator[bytes]:
        """The body as it arrives: chunk by chunk (a watch), or block by block."""
        conn = self._conn
        if self._chunked:
            while (chunk := conn.read_chunk()) is not None:
                yield chunk
        elif self._length is not None:
            yield conn.read_exact(self._length)
        else:
            while True:
                if buffered := conn.take_buffered():
                    yield buffered
                if not conn.fill():
                    return

    def lines(self) -> Iterator[bytes]:
        """Each non-empty line of the body, as it arrives."""
        pending = b""
        for data in self._pieces():
            if not pending and data.endswith(b"\n") and data.count(b"\n") == 1:
                yield data  # the API server writes each event as one line in one chunk
                continue
            pending += data
            *complete, pending = pending.split(b"\n")
            for line in complete:
                if line.strip():
                    yield line
        if pending.strip():
            yield pending

    def close(self) -> None:
        """Close the watch's connection."""
        self._conn.close()

    def shut_down(self) -> None:
        """End the watch from another thread (`Connection.shut_down`): its reader sees the end."""
        self._conn.shut_down()


class _Guard:
    """Sits in a thread's `threading.local` beside that thread's connection: when the thread ends,
    Python drops the thread's local values, and the guard's finaliser (set in `Transport._connection`)
    closes the connection. Without it a long-lived controller kept the socket of every thread that
    ever made a request until `Transport.close` (a test fixture's cleanup: ~8 per test)."""


def _release(transport: weakref.ref[Transport], conn: Connection) -> None:
    """Close the connection of a thread that ended (or dropped it) and forget it."""
    conn.close()
    if (alive := transport()) is not None:
        with alive._lock:
            alive._open.discard(conn)


class Transport:
    """Requests to one API server over per-thread keep-alive HTTPS (or HTTP) connections; a
    thread's connection is closed when the thread ends (`_Guard`)."""

    def __init__(self, configuration: Any, *, per_thread: bool = True) -> None:
        """`configuration`: a `kubernetes.client.Configuration` (read once; the token is read
        per request, so a rotated in-cluster token is picked up by its refresh hook).
        `per_thread` False: one connection for every thread, whose requests the caller
        serialises (the leader's Lease: acquired in one thread, renewed in another, it keeps
        the connection the acquisition opened instead of a TLS handshake at the first renewal)."""
        self._configuration = configuration
        url = urlsplit(configuration.host)
        self._https = url.scheme == "https"
        self._host = url.hostname or "localhost"
        self._port = url.port or (443 if self._https else 80)
        self._prefix = url.path.rstrip("/")
        host = f"[{self._host}]" if ":" in self._host else self._host
        default_port = 443 if self._https else 80
        self._host_header = host if self._port == default_port else f"{host}:{self._port}"
        self._server_name = getattr(configuration, "tls_server_name", None) or self._host
        self._context = self._ssl_context(configuration) if self._https else None
        self._per_thread = per_thread
        self._local: Any = threading.local() if per_thread else types.SimpleNamespace(conn=None)
        self._lock = threading.Lock()
        self._open: set[Connection] = set()
        self._streams: weakref.WeakSet[Stream] = weakref.WeakSet()
        """The watches open now (a watch forgotten unclosed is not kept): `close` ends them."""

    @staticmethod
    def _ssl_context(configuration: Any) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None)
        if not configuration.verify_ssl:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif configuration.assert_hostname is False:
            context.check_hostname = False
        if configuration.cert_file:
            context.load_cert_chain(configuration.cert_file, configuration.key_file or None)
        return context

    def _connect(self, timeout_s: float) -> Connection:
        """A new connection (TLS checked against kubeconfig's tls-server-name when it has one)."""
        sock = socket.create_connection((self._host, self._port), timeout=timeout_s)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # requests are one write each
            if self._context is not None:
                sock = self._context.wrap_socket(sock, server_hostname=self._server_name)
        except BaseException:
            sock.close()
            raise
        conn = Connection(sock)
        conn.timeout_s = timeout_s
        return conn

    def _connection(self, timeout_s: float) -> tuple[Connection, bool]:
        """This thread's connection, and whether it was used before (a reused one may be stale)."""
        conn: Connection | None = getattr(self._local, "conn", None)
        if conn is not None and conn.sock is not None:
            return conn, True
        conn = self._connect(timeout_s)
        conn.owner = threading.current_thread() if self._per_thread else None
        self._local.conn = conn
        if self._per_thread:
            guard = _Guard()
            weakref.finalize(guard, _release, weakref.ref(self), conn)
            self._local.guard = guard  # replaces (and so releases) the guard of a dropped connection
        with self._lock:
            self._open.add(conn)
        return conn, False

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
            self._local.guard = None  # its finaliser closes what is closed already: harmless
            with self._lock:
                self._open.discard(conn)

    def _head(self, method: str, path: str, body: bytes | None, content_type: str, accept: str) -> bytes:
        """The request line and headers, as sent."""
        lines = [f"{method} {self._prefix}{path} HTTP/1.1", f"Host: {self._host_header}", f"Accept: {accept}",
                 "Accept-Encoding: identity"]
        for setting in self._configuration.auth_settings().values():
            if setting.get("in") == "header" and setting.get("value"):
                lines.append(f"{setting['key']}: {setting['value']}")
        if body is not None:
            lines.append(f"Content-Type: {content_type}")
            lines.append(f"Content-Length: {len(body)}")
        elif method in ("POST", "PUT", "PATCH"):
            lines.append("Content-Length: 0")
        lines.append("\r\n")
        return "\r\n".join(lines).encode("latin-1")

    def request(self, method: str, path: str, *, body: bytes | None, content_type: str, timeout_s: float,
                accept: str = "application/json") -> tuple[int, bytes]:
        """Send one request (`path` with its query string) and read the whole answer (`accept`:
        the media type asked for, e.g. a list of metadata only).

        A connection the server closed while it sat idle is reopened and the request sent
        once more; that is the only retry (every write of the controller is safe to repeat:
        preconditions and uid-derived names turn a repeat into a 409 it handles)."""
        head = self._head(method, path, body, content_type, accept)
        message = head + body if body is not None else head  # one write: no Nagle/delayed-ACK stall
        for attempt in (0, 1):
            try:
                conn, reused = self._connection(timeout_s)
            except (OSError, http.client.HTTPException):
                self._drop()
                raise
            retry = attempt == 0 and reused
            try:
                conn.settimeout(timeout_s)
                assert conn.sock is not None
                conn.sock.sendall(message)
            except (OSError, http.client.HTTPException):
                self._drop()
                if retry:
                    continue
                raise
            try:
                status, chunked, length, close = conn.read_head()
            except _STALE:
                self._drop()  # closed before any answer: the server dropped an idle connection
                if retry:
                    continue
                raise
            except (OSError, http.client.HTTPException):
                self._drop()
                raise
            try:
                data, reusable = conn.read_body(status, chunked, length, method)
            except (OSError, http.client.HTTPException):
                self._drop()
                raise
            if close or not reusable:
                self._drop()
            return status, data
        raise AssertionError("unreachable")  # pragma: no cover

    def stream(self, path: str, *, connect_timeout_s: float, read_timeout_s: float) -> Stream:
        """Open a watch (`path` with its query string) on a connection of its own: the answer's
        head is read; its lines come from `Stream.lines`. A read silent for `read_timeout_s`
        raises `TimeoutError`. The caller closes the stream."""
        conn = self._connect(connect_timeout_s)
        try:
            assert conn.sock is not None
            conn.sock.sendall(self._head("GET", path, None, "", "application/json"))
            conn.settimeout(read_timeout_s)
            status, chunked, length, _close = conn.read_head()
        except BaseException:
            conn.close()
            raise
        stream = Stream(conn, status, chunked, length)
        with self._lock:
            self._streams.add(stream)
        return stream

    def end_watches(self, readers: Iterable[threading.Thread]) -> None:
        """End the open watches of `readers` at once (shut down as by `close`: each reader's next
        read ends its stream), the rest left open: the watch threads of one controller whose stop
        was set, on a client other controllers share (a test's), end now, not at their timeout."""
        wanted = set(readers)
        with self._lock:
            streams = [stream for stream in self._streams if stream.reader in wanted]
        for stream in streams:
            stream.shut_down()

    def close(self) -> None:
        """Close every connection of every thread: this thread's, a shared one's (its caller
        serialises) and a finished thread's at once; a live thread's is only shut down
        (`Connection.shut_down`), its owner closes it. That thread may be inside a read or write
        on it this instant (a worker still syncing when the controller stops): closed here, the
        descriptor's number goes to the next socket anyone in the process opens, and the
        thread's read takes that socket's bytes, two TLS streams mixed
        (DECRYPTION_FAILED_OR_BAD_RECORD_MAC on both). Shut down, the read ends at once and the
        owner's next request finds it dead: dropped and reopened, as one the server closed.

        Every open watch is shut down the same way: its reader's next read ends the stream (it
        closes it), at once instead of at the watch's timeout (a minute). A controller's watch
        threads then see their stop as it closes, and none outlives it (a test's controller
        logged into the next tests)."""
        me = threading.current_thread()
        with self._lock:
            connections, self._open = list(self._open), set()
            streams = list(self._streams)
            self._streams.clear()
        for conn in connections:
            owner = conn.owner
            if owner is None or owner is me or not owner.is_alive():
                conn.close()
            else:
                conn.shut_down()
        for stream in streams:
            stream.shut_down()
