"""The controller's probe and metrics endpoints: `/healthz`, `/readyz`, `/metrics` over HTTP.

A kubelet restarts the container when `/healthz` fails and keeps traffic and rollouts waiting
while `/readyz` fails; Prometheus scrapes `/metrics`. Each probe is a set of named checks, each a
callable returning `(ok, reason)`: for example the controller's liveness (a worker thread died,
the watches are stuck) and the leader election's (the Lease was not renewed in time). A check
that raises counts as failed, with the exception as its reason, so a broken check cannot make a
probe pass.

The answer is the API server's own format: `ok` with 200 when all pass; otherwise 500 (healthz)
or 503 (readyz) and one line per check, `[+]name ok` or `[-]name failed: reason`. `?verbose`
lists every check on success too.

The server is stdlib `http.server` in one daemon thread per request (probes and scrapes are
rare and small); it never touches the Kubernetes API.
"""

from __future__ import annotations

import contextlib
import http.server
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

__all__ = ["Check", "HealthServer", "as_check", "run_checks"]

Check = Callable[[], tuple[bool, str]]
"""A probe's check: `(True, "")` when fine, `(False, "why")` when not."""

log = logging.getLogger(__name__)


def as_check(source: Any) -> Check:
    """A `Check` from `source`: a callable returning `(ok, reason)` as is, or an object with
    `alive() -> bool` and a `reason` (attribute or method) such as the controller's liveness."""
    alive = getattr(source, "alive", None)
    if callable(alive):

        def check() -> tuple[bool, str]:
            if alive():
                return True, ""
            reason = getattr(source, "reason", "")
            return False, str(reason() if callable(reason) else reason)

        return check
    if callable(source):
        return source  # type: ignore[no-any-return]
    raise TypeError(f"as_check: {source!r} is neither a callable returning (ok, reason) nor has alive()")


def run_checks(checks: Mapping[str, Check]) -> tuple[bool, list[str]]:
    """Run every check (all of them, even after a failure, so the answer names each problem);
    returns whether all passed and one `[+]`/`[-]` line per check."""
    ok, lines = True, []
    for name, check in checks.items():
        try:
            passed, reason = check()
        except Exception as err:  # a failing check must fail the probe, never the server
            passed, reason = False, f"check raised {type(err).__name__}: {err}"
        if passed:
            lines.append(f"[+]{name} ok")
        else:
            ok = False
            lines.append(f"[-]{name} failed: {reason or 'no reason given'}")
    return ok, lines


class HealthServer:
    """Serves `/healthz` (liveness checks), `/readyz` (readiness checks) and `/metrics`
    (`registry`) on `host:port`; port 0 picks a free one (read `port` after `start`)."""

    def __init__(
        self,
        *,
        liveness: Mapping[str, Any] | None = None,
        readiness: Mapping[str, Any] | None = None,
        registry: CollectorRegistry | None = None,
        host: str = "0.0.0.0",
        port: int = 8080,
    ) -> None:
        """`liveness` / `readiness`: named checks (anything `as_check` takes). `host` 0.0.0.0 by
        default: the kubelet probes the Pod's IP, not its loopback."""
        self.liveness: dict[str, Check] = {name: as_check(c) for name, c in (liveness or {}).items()}
        self.readiness: dict[str, Check] = {name: as_check(c) for name, c in (readiness or {}).items()}
        self.registry = registry
        self._address = (host, port)
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The port it listens on (the chosen one when started with port 0)."""
        if self._server is None:
            raise RuntimeError("HealthServer.port: not started; call start() first")
        return int(self._server.server_address[1])

    def start(self) -> HealthServer:
        """Bind and serve in a daemon thread; returns self. Fails at once if the port is taken."""
        owner = self

        class Handler(_Handler):
            server_owner = owner

        self._server = http.server.ThreadingHTTPServer(self._address, Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="health-server", daemon=True)
        self._thread.start()
        log.info("serving /healthz, /readyz and /metrics on %s:%d", self._address[0], self.port)
        return self

    def stop(self) -> None:
        """Stop serving and close the socket (waits for the serving thread, bounded)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> HealthServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Handler(http.server.BaseHTTPRequestHandler):
    server_owner: HealthServer
    protocol_version = "HTTP/1.1"  # keep-alive: Prometheus reuses its connection

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        owner = self.server_owner
        if url.path == "/metrics":
            if owner.registry is None:
                self._answer(404, b"no metrics registry\n")
                return
            # The scraper's Accept header picks the text format or OpenMetrics.
            encoder, content_type = choose_encoder(self.headers.get("Accept") or "")
            self._answer(200, encoder(owner.registry), content_type)
        elif url.path in ("/healthz", "/livez"):
            self._probe("healthz", owner.liveness, url.query, failed_code=500)
        elif url.path == "/readyz":
            self._probe("readyz", owner.readiness, url.query, failed_code=503)
        else:
            self._answer(404, b"not found: use /healthz, /readyz or /metrics\n")

    def _probe(self, probe: str, checks: Mapping[str, Check], query: str, *, failed_code: int) -> None:
        ok, lines = run_checks(checks)
        verbose = "verbose" in parse_qs(query, keep_blank_values=True)
        if ok and not verbose:
            self._answer(200, b"ok\n")
            return
        text = "\n".join([*lines, f"{probe} check {'passed' if ok else 'failed'}"]) + "\n"
        self._answer(200 if ok else failed_code, text.encode())

    def _answer(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        # Probes arrive every few seconds: access lines would drown the controller's log.
        log.debug("%s " + format, self.address_string(), *args)
