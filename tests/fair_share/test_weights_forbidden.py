"""An install whose RBAC does not grant namespaces: the controller's first list still completes
(every weight 1), the 403 is said once at WARNING with the fix, and the namespace watch keeps
backing off quietly instead of failing start-up or saying it again.

The test API server authorizes everything, so a small proxy in front of it answers 403 to the
namespace collection (list and watch) and forwards every other request.
"""

from __future__ import annotations

import http.client
import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.machinery import informer
from elasticgpu.controller.process import starting
from tests.binding.conftest import new_controller

FORBIDDEN_PATH = "/api/v1/namespaces"


def _forbidding_proxy(cluster: Any) -> http.server.ThreadingHTTPServer:
    """Plain HTTP on loopback: 403 for the namespace collection, the rest forwarded (whole
    answers only: the test starts no watch but the namespace one)."""
    upstream = urlsplit(cluster.server)
    context = cluster.ssl_context()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            del format, args

        def _handle(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
            if self.path.split("?")[0].rstrip("/") == FORBIDDEN_PATH:
                status, data, kind = 403, json.dumps({
                    "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
                    "message": 'namespaces is forbidden: User "system:serviceaccount:x:elasticgpu-controller"'
                               ' cannot list resource "namespaces" in API group "" at the cluster scope'}).encode(), \
                    "application/json"
            else:
                connection = http.client.HTTPSConnection(upstream.hostname or "", upstream.port, context=context,
                                                         timeout=30)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "accept")}
                    connection.request(self.command, self.path, body=body, headers=headers)
                    answer = connection.getresponse()
                    status, data = answer.status, answer.read()
                    kind = answer.getheader("Content-Type") or "application/json"
                finally:
                    connection.close()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def forbidden_kube(kube_cluster: Any, crds_installed: list[str], tmp_path: Path) -> Iterator[KubeApi]:
    """A KubeApi that may not list or watch namespaces."""
    server = _forbidding_proxy(kube_cluster)
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "forbidden",
              "clusters": [{"name": "proxy", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}],
              "users": [{"name": "nobody", "user": {}}],
              "contexts": [{"name": "forbidden", "context": {"cluster": "proxy", "user": "nobody"}}]}
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    api = KubeApi.from_kubeconfig(str(path))
    try:
        yield api
    finally:
        api.close()
        server.shutdown()
        server.server_close()


def test_forbidden_namespaces_are_weight_one_said_once(forbidden_kube: KubeApi,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG", logger=informer.__name__)
    controller = new_controller(forbidden_kube, None)
    stop = threading.Event()
    watch = threading.Thread(target=controller.informer.watch_kind, args=("namespace", stop), daemon=True)
    try:
        listed = starting.first_list(controller, stop)  # returns at once: namespaces are optional
        assert listed is not None and listed["namespace"] == ""
        assert dict(controller.picture.weights.live()) == {}
        watch.start()
        deadline = time.monotonic() + 10
        while sum("namespace" in r.getMessage() and "403" in r.getMessage() for r in caplog.records) < 3:
            assert time.monotonic() < deadline, "the namespace watch did not try again within 10 s"
            time.sleep(0.05)
        controller.rebuild()  # a relist: not said again either
    finally:
        stop.set()
        if watch.is_alive():
            watch.join(5)
        controller.close()
    said = [r for r in caplog.records if r.getMessage().startswith(informer.NAMESPACES_FORBIDDEN)]
    assert [r.levelname for r in said if r.levelname != "DEBUG"] == ["WARNING"], [r.getMessage() for r in said]
    assert "list and watch on namespaces" in said[0].getMessage()
