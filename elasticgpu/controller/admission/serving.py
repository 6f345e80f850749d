"""The webhook's HTTPS server: stdlib `http.server`, one thread per connection, TLS per connection.

The TLS handshake runs in the connection's own thread (never in the accept loop, where one
slow client would hold up all others), with whatever certificate is current when the
connection opens: `use()` swaps it for the next connections without a restart. HTTP/1.1
keep-alive: the API server reuses its connections; an idle one is closed after
`IDLE_TIMEOUT_S`, longer than the 90 s after which Go's client drops idle connections itself,
so that the client, not we, closes them (a close racing a new request would fail that pod).

The port is bound at construction (a taken port fails at once) but listened on only once a
certificate is loaded and `start()` was called: before, a connection is refused, which the API
server reports as such, instead of accepted and closed unanswered (an EOF that looks like a
broken webhook).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import ssl
import tempfile
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cryptography import x509

from elasticgpu.controller.admission import certificates
from elasticgpu.controller.admission.metrics import WebhookMetrics

logger = logging.getLogger(__name__)

IDLE_TIMEOUT_S = 120.0
MAX_BODY_BYTES = 8 * 1024 * 1024  # an AdmissionReview of a pod with a huge spec is far below this
HEALTH_PATH = "/healthz"

Reviewer = Callable[[dict[str, Any]], dict[str, Any]]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], reviewer: Reviewer, path: str, metrics: WebhookMetrics) -> None:
        super().__init__(address, _Handler, bind_and_activate=False)
        try:
            self.server_bind()  # the port is ours now; listen() waits for the certificate
        except BaseException:
            self.server_close()
            raise
        self.reviewer = reviewer
        self.metrics = metrics
        self.review_path = path
        self.context: ssl.SSLContext | None = None
        self.connections: set[ssl.SSLSocket] = set()
        self.lock = threading.Lock()
        self.before_handshake: Callable[[], None] | None = None

    def finish_request(self, request: Any, client_address: Any) -> None:
        refresh = self.before_handshake
        if refresh is not None:
            refresh()  # a certificate kept in files (`mounting`): reloaded here when they changed
        context = self.context
        if context is None:  # cannot happen: nothing listens before the first certificate
            return
        request.settimeout(IDLE_TIMEOUT_S)
        try:
            tls = context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as error:
            # A client that does not trust our CA (yet) ends here: worth a line, not a trace.
            logger.info("TLS handshake with %s failed: %s", client_address, error)
            return
        with self.lock:
            self.connections.add(tls)
        try:
            _Handler(tls, client_address, self)
        finally:
            with self.lock:
                self.connections.discard(tls)
            tls.close()

    def close_connections(self) -> None:
        with self.lock:
            connections = list(self.connections)
        for connection in connections:
            with contextlib.suppress(OSError):  # closed by the other side meanwhile
                connection.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_GET(self) -> None:
        if self.path == HEALTH_PATH:
            self._answer(200, b"ok", "text/plain")
        else:
            self._answer(404, b"not found", "text/plain")

    def do_POST(self) -> None:
        if self.path.split("?", 1)[0] != self.server.review_path:
            self._answer(404, b"not found", "text/plain")
            return
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if not 0 < length <= MAX_BODY_BYTES:
            self.server.metrics.failed("malformed")
            self._answer(400, b"an AdmissionReview body with Content-Length is required", "text/plain")
            return
        try:
            document = json.loads(self.rfile.read(length))
            answer = self.server.reviewer(document)
        except ValueError as error:  # bad JSON, or not an AdmissionReview
            self.server.metrics.failed("malformed")
            self._answer(400, str(error).encode(), "text/plain")
            return
        except Exception:
            # A bug of ours: refuse this request (failurePolicy Fail refuses the pod), keep serving.
            logger.exception("reviewing a request failed")
            self.server.metrics.failed("error")
            self._answer(500, b"internal error", "text/plain")
            return
        self.server.metrics.reviewed(answer)
        self._answer(200, json.dumps(answer).encode(), "application/json")

    def _answer(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s " + format, self.client_address[0], *args)


def _server_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def tls_context(material: certificates.Material) -> ssl.SSLContext:
    """A server context serving `material`'s certificate (TLS 1.2 or newer)."""
    context = _server_context()
    # load_cert_chain reads files only: a private directory, removed at once.
    with tempfile.TemporaryDirectory(prefix="elasticgpu-webhook-") as directory:
        cert, key = os.path.join(directory, "tls.crt"), os.path.join(directory, "tls.key")
        with open(cert, "wb") as handle:
            handle.write(material.cert)
        with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as handle:
            handle.write(material.key)
        context.load_cert_chain(cert, key)
    return context


class HttpsServer:
    """Serves AdmissionReviews on `path` and `/healthz` over HTTPS."""

    def __init__(
        self, *, host: str, port: int, path: str, reviewer: Reviewer, metrics: WebhookMetrics | None = None
    ) -> None:
        """`metrics`: count each review's outcome there (a fresh, unserved `WebhookMetrics` when None)."""
        self.metrics = metrics or WebhookMetrics()
        self._server = _Server((host, port), reviewer, path, self.metrics)
        self._thread: threading.Thread | None = None
        self._started = False
        self._listen_lock = threading.Lock()
        self._listen_error: str | None = None
        self.serial: int | None = None
        """Serial number of the certificate being served (None before the first)."""

    @property
    def port(self) -> int:
        """The bound port (useful when 0 was asked for)."""
        return int(self._server.server_address[1])

    @property
    def accepting(self) -> bool:
        """True while the accept thread runs (listening, not stopped or dead)."""
        return self._thread is not None and self._thread.is_alive()

    def problem(self) -> str | None:
        """Why the server is not serving as it should, or None: started and listening, or started and
        waiting for its first certificate (alive: the certificate's keeper says why it is late)."""
        if self._listen_error is not None:
            return self._listen_error
        if not self._started:
            return "the HTTPS server is not started (or stopped)"
        if self._thread is None:
            return None  # waiting for the first certificate: connections are refused meanwhile
        return None if self._thread.is_alive() else "the HTTPS server's accept thread is not running"

    def use(self, material: certificates.Material) -> None:
        """Serve `material`'s certificate on every connection opened from now on (listening from the first)."""
        self._server.context = tls_context(material)
        self.serial = material.serial()
        self._listen()

    def use_files(self, *, cert: str, key: str) -> None:
        """Serve the PEM certificate (chain) and key in these files on every connection opened from
        now on. Raises `ssl.SSLError` (an `OSError`) or `ValueError` when they cannot be loaded
        (missing, garbage, or a key of another certificate); the current certificate stays then."""
        context = _server_context()
        context.load_cert_chain(cert, key)
        with open(cert, "rb") as handle:
            serial = int(x509.load_pem_x509_certificate(handle.read()).serial_number)
        self._server.context = context
        self.serial = serial
        self._listen()

    @property
    def before_handshake(self) -> Callable[[], None] | None:
        """Called in each connection's thread before its TLS handshake (None: nothing)."""
        return self._server.before_handshake

    @before_handshake.setter
    def before_handshake(self, hook: Callable[[], None] | None) -> None:
        self._server.before_handshake = hook

    def start(self) -> None:
        """Accept connections in a background thread, from the moment a certificate is loaded (now, if one is)."""
        self._started = True
        self._listen()

    def _listen(self) -> None:
        """Listen and accept once both started and a certificate is loaded; once."""
        with self._listen_lock:
            if not self._started or self._server.context is None or self._thread is not None:
                return
            try:
                self._server.server_activate()
            except OSError as error:  # another process listens on the port since we bound it
                self._listen_error = f"cannot listen on port {self.port}: {error}"
                logger.error("webhook: %s; restart it once the port is free", self._listen_error)
                return
            self._thread = threading.Thread(target=self._server.serve_forever, name="webhook-https", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop accepting, close open connections, release the port."""
        with self._listen_lock:
            self._started = False
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.close_connections()
        self._server.server_close()
