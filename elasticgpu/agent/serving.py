"""The agent's HTTP endpoints: `/metrics`, `/healthz`, `/readyz`; every other path is a 404.

    /metrics   Prometheus text (metrics.py's collector), on --metrics-bind-address
    /healthz   200 `ok` while every loop of the agent is alive and none is stuck, else 500 with
               the one that is not (a kubelet liveness probe restarts the agent)
    /readyz    200 `ok` once kubelet's socket serves and the device backend, the ledger and the
               API server are ready, else 503 with what is not (the parts opened in the
               background, starting.py: the agent serves pods without claims meanwhile)

The probes are on --health-probe-bind-address, or on the metrics server when that flag is not
given (one port, as before the flag). The answers are the API server's format: `ok`, or one
`[-]name failed: reason` line per failing check. Each server is stdlib `http.server`, one
daemon thread per request (probes and scrapes are rare and small).
"""

from __future__ import annotations

import http.server
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

log = logging.getLogger(__name__)

Check = Callable[[], str | None]
"""A probe's check: None when fine, else why not."""


def answer(checks: Mapping[str, Check]) -> tuple[bool, str]:
    """Run every check (a failure does not hide the next); (all passed, the body)."""
    lines = []
    for name, check in checks.items():
        try:
            problem = check()
        except Exception as e:  # a broken check fails the probe, never the server
            problem = f"check raised {type(e).__name__}: {e}"
        if problem is not None:
            lines.append(f"[-]{name} failed: {problem}")
    return not lines, ("\n".join(lines) if lines else "ok") + "\n"


class Endpoints:
    """One HTTP server with some of the agent's paths (see the module docstring)."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        registry: CollectorRegistry | None = None,
        healthz: Mapping[str, Check] | None = None,
        readyz: Mapping[str, Check] | None = None,
    ) -> None:
        """`registry`: serve /metrics from it; `healthz` / `readyz`: serve that probe with these checks."""
        self._registry = registry
        self._probes = {path: checks for path, checks in (("/healthz", healthz), ("/readyz", readyz)) if checks}
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer._get(self)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("%s %s", self.address_string(), format % args)

        self._server = http.server.ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)

    @property
    def port(self) -> int:
        """The bound port (the one asked for, or the free one port 0 found)."""
        return int(self._server.server_address[1])

    @property
    def paths(self) -> list[str]:
        """The paths this server answers."""
        return (["/metrics"] if self._registry is not None else []) + list(self._probes)

    def start(self) -> Endpoints:
        """Serve on a daemon thread."""
        self._thread.start()
        return self

    def shutdown(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()

    def _get(self, request: http.server.BaseHTTPRequestHandler) -> None:
        path = urlsplit(request.path).path.rstrip("/") or "/"
        if path == "/metrics" and self._registry is not None:
            encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
            self._send(request, 200, content_type, encoder(self._registry))
        elif path in self._probes:
            ok, body = answer(self._probes[path])
            failed = 500 if path == "/healthz" else 503
            self._send(request, 200 if ok else failed, "text/plain; charset=utf-8", body.encode())
        else:
            body = f"404 page not found: {path}; this server answers {', '.join(self.paths)}\n"
            self._send(request, 404, "text/plain; charset=utf-8", body.encode())

    @staticmethod
    def _send(request: http.server.BaseHTTPRequestHandler, status: int, content_type: str, body: bytes) -> None:
        request.send_response(status)
        request.send_header("Content-Type", content_type)
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)
