"""The webhook's plain-HTTP endpoints beside its HTTPS server, controller-runtime's flags:

    /healthz   200 `ok` while the HTTPS server's accept thread is alive, else 500 (liveness)
    /readyz    200 `ok` once the HTTPS listener is up and a certificate is loaded, else 503
    /metrics   Prometheus text (`metrics.WebhookMetrics`)

on `--health-probe-bind-address` (the two probes) and `--metrics-bind-address` (/metrics); one
server when both name the same address; every other path is a 404. Both are off by default, so
an install that probes `/healthz` over HTTPS on the webhook's port keeps working unchanged.
Answers are the API server's format: `ok`, or one `[-]name failed: reason` line per failing check.
stdlib `http.server`, one daemon thread per request (probes and scrapes are rare and small).
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

logger = logging.getLogger(__name__)

Check = Callable[[], str | None]
"""A probe's check: None when fine, else why not."""


def _answer(checks: Mapping[str, Check]) -> tuple[bool, str]:
    lines = []
    for name, check in checks.items():
        try:
            problem = check()
        except Exception as e:  # a broken check fails the probe, never the server
            problem = f"check raised {type(e).__name__}: {e}"
        if problem is not None:
            lines.append(f"[-]{name} failed: {problem}")
    return not lines, ("\n".join(lines) if lines else "ok") + "\n"


class ProbeServer:
    """One plain-HTTP server with some of the paths above."""

    def __init__(
        self,
        address: flags.BindAddress,
        *,
        registry: CollectorRegistry | None = None,
        healthz: Mapping[str, Check] | None = None,
        readyz: Mapping[str, Check] | None = None,
    ) -> None:
        """Bind at once (a taken port fails here, before the webhook starts); serve after `start`."""
        self._registry = registry
        self._probes = {path: checks for path, checks in (("/healthz", healthz), ("/readyz", readyz)) if checks}
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer._get(self)

            def log_message(self, format: str, *args: Any) -> None:
                logger.debug("%s %s", self.address_string(), format % args)

        self._server = http.server.ThreadingHTTPServer((address.host, address.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook-probes", daemon=True)

    @property
    def port(self) -> int:
        """The bound port (the one asked for, or the free one port 0 found)."""
        return int(self._server.server_address[1])

    @property
    def paths(self) -> list[str]:
        """The paths this server answers."""
        return (["/metrics"] if self._registry is not None else []) + list(self._probes)

    def start(self) -> None:
        """Serve on a daemon thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and release the port."""
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
            ok, body = _answer(self._probes[path])
            self._send(request, 200 if ok else (500 if path == "/healthz" else 503),
                       "text/plain; charset=utf-8", body.encode())  # fmt: skip
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
) -> list[ProbeServer]:
    """The servers the two addresses ask for (none, one shared, or two), bound, not yet started."""
    made: list[ProbeServer] = []
    try:
        if health is not None and health == metrics:
            return [ProbeServer(health, registry=registry, healthz=healthz, readyz=readyz)]
        if health is not None:
            made.append(ProbeServer(health, healthz=healthz, readyz=readyz))
        if metrics is not None:
            made.append(ProbeServer(metrics, registry=registry))
    except BaseException:
        for server in made:  # the first bound, the second's port taken: release the first
            server.stop()
        raise
    return made
