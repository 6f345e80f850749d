"""A server without the Lease API (coordination.k8s.io answers 404, as an API server that does
not serve Leases does): the controller says so once, with the fix, and /readyz fails, instead of
logging "404 page not found" every retry period while looking like a healthy standby."""

from __future__ import annotations

import http.server
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from kubernetes import client

from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.edge.leader import LeaderSettings
from elasticgpu.controller.process.operability import Operability
from elasticgpu.controller.process.reconciling import Controller


class _NoLeases(http.server.BaseHTTPRequestHandler):
    """Answers every request as a server without that API does: 404, text/plain."""

    def _not_found(self) -> None:
        body = b"404 page not found\n"
        self.send_response(404)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = _not_found

    def log_message(self, format: str, *args: object) -> None:  # quiet: the test reads the log
        pass


@pytest.fixture
def no_leases() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NoLeases)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz?verbose", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_missing_lease_api_is_said_once_with_the_fix_and_fails_readyz(
        no_leases: str, caplog: pytest.LogCaptureFixture) -> None:
    configuration = client.Configuration()
    configuration.host = no_leases
    kube = KubeApi(client.ApiClient(configuration))
    leader = LeaderSettings(namespace="kube-system", name="elasticgpu-test", lease_duration_s=3.0,
                            renew_deadline_s=2.0, retry_period_s=0.2)
    operability = Operability(Controller(kube), kube, leader=leader, health_port=0, health_host="127.0.0.1")
    assert operability.server is not None
    operability.start()
    stop = threading.Event()
    leading: list[bool] = []
    caplog.set_level(logging.INFO, logger="elasticgpu.controller.edge.leader")
    thread = threading.Thread(target=lambda: leading.append(operability.lead(stop)), daemon=True)
    thread.start()
    try:
        stop.wait(1.5)  # about 7 attempts
        status, text = _readyz(operability.server.port)
        assert status != 200, text
        assert "--leader-elect=false" in text and "coordination.k8s.io" in text, text
    finally:
        stop.set()
        thread.join(5)
        operability.close()
    assert leading == [False]
    said = [r for r in caplog.records if r.name == "elasticgpu.controller.edge.leader" and r.levelno >= logging.INFO]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert said[0].levelno == logging.ERROR
    assert "Lease kube-system/elasticgpu-test" in said[0].getMessage()
    assert "--leader-elect=false" in said[0].getMessage()
