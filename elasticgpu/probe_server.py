"""Plain-HTTP `/metrics`, `/healthz` and `/readyz` of the agent and the webhook (controller-runtime's
`--metrics-bind-address` and `--health-probe-bind-address`); every other path is a 404.

    /metrics   Prometheus text from the given registry
    /healthz   200 `ok` when every check passes, else 500 with the ones that fail (liveness)
    /readyz    200 `ok` when every check passes, else 503 with the ones that fail (readiness)

Answers are the API server's format: `ok`, or one `[-]name failed: reason` line per failing
check. Each server is stdlib `http.server`, one daemon thread per request (probes and scrapes
are rare and small). `servers` makes one server when both flags name the same address.
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

from elasticgpu import flags

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
    """One HTTP server with some of the paths (see the module docstring); bound when made."""

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
    def host(self) -> str:
        """The bound address."""
        return str(self._server.server_address[0])

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
        """Stop serving (if started) and release the port."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=5)
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


def servers(
    *,
    health: flags.BindAddress | None,
    metrics: flags.BindAddress | None,
    registry: CollectorRegistry,
    healthz: Mapping[str, Check],
    readyz: Mapping[str, Check],
) -> list[Endpoints]:
    """The servers the two addresses ask for (none, one shared, or two), bound, not yet started;
    raises OSError (having released what it bound) when a port is taken."""
    wanted: dict[flags.BindAddress, dict[str, Any]] = {}  # the probes' server first
    if health is not None:
        wanted[health] = {"healthz": healthz, "readyz": readyz}
    if metrics is not None:
        wanted.setdefault(metrics, {})["registry"] = registry
    made: list[Endpoints] = []
    try:
        for address, paths in wanted.items():
            made.append(Endpoints(host=address.host, port=address.port, **paths))
    except BaseException:
        for server in made:  # the first bound, the second's port taken: release the first
            server.shutdown()
        raise
    return made
