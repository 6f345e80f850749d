"""The webhook listens only once it can answer (issue 28.2): before its certificate is loaded a
connection is refused (the API server then reports "connection refused", which says what is
wrong), never accepted and closed unanswered (EOF, which looks like a broken webhook); once it is
loaded, a proper TLS handshake and an answer. The port is taken at start all the same: a taken
port still fails at once.

Over real sockets and real TLS: the HTTPS server with the load held back by the test (a slow
certificate source), and the whole webhook with cert-manager's mounted files arriving late.
"""

from __future__ import annotations

import datetime
import socket
import ssl
from pathlib import Path

import pytest

from elasticgpu.controller.admission import Webhook, WebhookSettings, certificates
from elasticgpu.controller.admission.serving import HttpsServer

HOST = "127.0.0.1"


def _material() -> certificates.Material:
    return certificates.generate(hosts=[HOST], now=datetime.datetime.now(datetime.UTC), validity_s=3600)


def _refused(port: int) -> bool:
    """True when a connection to the port is refused (nothing listens), False when it is accepted."""
    try:
        with socket.create_connection((HOST, port), timeout=5):
            return False
    except ConnectionRefusedError:
        return True


def _healthz_over_tls(port: int, material: certificates.Material) -> bytes:
    context = ssl.create_default_context(cadata=material.ca_cert.decode())
    with socket.create_connection((HOST, port), timeout=5) as raw, context.wrap_socket(
        raw, server_hostname=HOST
    ) as tls:
        tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return tls.recv(64)


def test_a_connection_before_the_certificate_is_refused_then_served() -> None:
    server = HttpsServer(host=HOST, port=0, path="/mutate-pods", reviewer=lambda review: review)
    try:
        port = server.port  # taken at construction
        server.start()
        # The certificate is not loaded yet (its source is slow): nothing listens.
        for _ in range(3):
            assert _refused(port), "a connection was accepted before the certificate was loaded (EOF)"
        material = _material()
        server.use(material)
        assert _healthz_over_tls(port, material).startswith(b"HTTP/1.1 200")
    finally:
        server.stop()
    assert _refused(port)  # stopped: closed again


def test_a_taken_port_still_fails_at_construction() -> None:
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        with pytest.raises(OSError):
            HttpsServer(host=HOST, port=taken.getsockname()[1], path="/mutate-pods", reviewer=lambda r: r)


def test_the_webhook_listens_once_the_mounted_certificate_arrives(tmp_path: Path) -> None:
    webhook = Webhook(api=None, settings=WebhookSettings(listen_host=HOST, port=0, cert_dir=str(tmp_path)))
    webhook.start()
    try:
        assert _refused(webhook.port), "the webhook accepted a connection with no certificate (EOF)"
        assert webhook._accepting() is None, "waiting for the certificate is alive, not dead (liveness)"
        material = _material()
        (tmp_path / "tls.crt").write_bytes(material.cert)
        (tmp_path / "tls.key").write_bytes(material.key)
        assert webhook.wait_ready(10), "the mounted certificate was not loaded"
        assert _healthz_over_tls(webhook.port, material).startswith(b"HTTP/1.1 200")
    finally:
        webhook.stop()
