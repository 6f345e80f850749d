"""HTTP/1.1 keep-alive connections to the API server, one per thread, for `kube.KubeApi`.

Why not the kubernetes client's own path (`ApiClient.call_api` over urllib3): under a burst
of binds it cost about a quarter of the controller's CPU (py-spy, `bench/binding.py`) in
per-call work this controller does not need: walking every body through
`sanitize_for_serialization`, building urllib3 pool keys and header dicts, checking each pooled
connection for a drop. This transport keeps what matters from the client's `Configuration`
(server address, CA, client certificate, bearer token with its refresh hook, TLS server name)
and sends each request on a connection its thread keeps open.

It knows nothing of Kubernetes objects: bytes in, (status, bytes) out. Connection failures are
raised as `OSError` / `http.client.HTTPException` for `KubeApi` to translate.
"""

from __future__ import annotations

import http.client
import ssl
import threading
from typing import Any
from urllib.parse import urlsplit

_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ssl.SSLEOFError)
"""What reading an answer raises when the server had closed the connection before it."""


class Transport:
    """Requests to one API server over per-thread keep-alive HTTPS (or HTTP) connections."""

    def __init__(self, configuration: Any) -> None:
        """`configuration`: a `kubernetes.client.Configuration` (read once; the token is read
        per request, so a rotated in-cluster token is picked up by its refresh hook)."""
        self._configuration = configuration
        url = urlsplit(configuration.host)
        self._https = url.scheme == "https"
        self._host = url.hostname or "localhost"
        self._port = url.port or (443 if self._https else 80)
        self._prefix = url.path.rstrip("/")
        self._context = self._ssl_context(configuration) if self._https else None
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: set[http.client.HTTPConnection] = set()

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

    def _connection(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            if self._context is not None:
                server_name = getattr(self._configuration, "tls_server_name", None)
                conn = _NamedHTTPSConnection(self._host, self._port, context=self._context,
                                             server_hostname=server_name or self._host)
            else:
                conn = http.client.HTTPConnection(self._host, self._port)
            self._local.conn = conn
            with self._lock:
                self._open.add(conn)
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
            with self._lock:
                self._open.discard(conn)

    def _auth_headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        for setting in self._configuration.auth_settings().values():
            if setting.get("in") == "header" and setting.get("value"):
                headers[setting["key"]] = setting["value"]
        return headers

    def request(self, method: str, path: str, *, body: bytes | None, content_type: str, timeout_s: float
                ) -> tuple[int, bytes]:
        """Send one request (`path` with its query string) and read the whole answer.

        A connection the server closed while it sat idle is reopened and the request sent
        once more; that is the only retry (every write of the controller is safe to repeat:
        preconditions and uid-derived names turn a repeat into a 409 it handles)."""
        headers = {"Accept": "application/json", **self._auth_headers()}
        if body is not None:
            headers["Content-Type"] = content_type
        for attempt in (0, 1):
            conn = self._connection()
            retry = attempt == 0 and conn.sock is not None  # a reused connection may have gone stale
            try:
                conn.timeout = timeout_s
                if conn.sock is not None:
                    conn.sock.settimeout(timeout_s)
                conn.request(method, self._prefix + path, body=body, headers=headers)
            except (OSError, http.client.HTTPException):
                self._drop()
                if retry:
                    continue
                raise
            try:
                response = conn.getresponse()
                data = response.read()
            except _STALE:
                self._drop()  # closed before any answer: the server dropped an idle connection
                if retry:
                    continue
                raise
            except (OSError, http.client.HTTPException):
                self._drop()
                raise
            if response.will_close:
                self._drop()
            return response.status, data
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        """Close every connection of every thread."""
        with self._lock:
            connections, self._open = list(self._open), set()
        for conn in connections:
            conn.close()


class _NamedHTTPSConnection(http.client.HTTPSConnection):
    """An HTTPS connection that checks the certificate against `server_hostname` (kubeconfig's
    tls-server-name) instead of the host it connects to."""

    def __init__(self, host: str, port: int, *, context: ssl.SSLContext, server_hostname: str) -> None:
        super().__init__(host, port, context=context)
        self._server_hostname = server_hostname
        self._ssl_context = context

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._ssl_context.wrap_socket(self.sock, server_hostname=self._server_hostname)
