"""`elasticgpu webhook --webhook-cert-path DIR` (issue 18): real HTTPS serving the tls.crt/tls.key
that cert-manager mounts, a new connection seeing a replaced certificate at once, a broken
replacement never taking the webhook down, and no API access at all (the caBundle is cert-manager's)."""

from __future__ import annotations

import datetime
import os
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509

from elasticgpu.cli import build_parser
from elasticgpu.controller.admission import Webhook, WebhookSettings, certificates
from elasticgpu.controller.admission.commands import settings_from

HOST = "127.0.0.1"


def _material() -> certificates.Material:
    now = datetime.datetime.now(datetime.UTC)
    return certificates.generate(hosts=[HOST], now=now, validity_s=3600)


def _mount(directory: Path, cert: bytes, key: bytes) -> None:
    """Swap both files in at once, as kubelet updates a Secret volume (write aside, rename)."""
    for name, data in (("tls.crt", cert), ("tls.key", key)):
        aside = directory / f".{name}.new"
        aside.write_bytes(data)
        os.replace(aside, directory / name)


def _served_serial(port: int, material: certificates.Material) -> int:
    """Serial of the certificate a new connection gets, verified against `material`'s CA."""
    context = ssl.create_default_context(cadata=material.ca_cert.decode())
    with socket.create_connection((HOST, port), timeout=5) as raw, context.wrap_socket(
        raw, server_hostname=HOST
    ) as tls:
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert tls.recv(64).startswith(b"HTTP/1.1 200"), "the webhook answers on the mounted certificate"
    return int(x509.load_der_x509_certificate(der).serial_number)


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[tuple[Webhook, Path, certificates.Material]]:
    first = _material()
    _mount(tmp_path, first.cert, first.key)
    # api=None: in this mode the webhook must not need (or write to) the API server.
    webhook = Webhook(api=None, settings=WebhookSettings(listen_host=HOST, port=0, cert_dir=str(tmp_path)))
    webhook.start()
    try:
        assert webhook.wait_ready(5), "the mounted certificate was not served"
        yield webhook, tmp_path, first
    finally:
        webhook.stop()


def test_serves_the_mounted_certificate_and_a_new_connection_sees_its_replacement(
    mounted: tuple[Webhook, Path, certificates.Material],
) -> None:
    webhook, directory, first = mounted
    assert _served_serial(webhook.port, first) == first.serial()
    second = _material()  # a new CA too: what a rotation with a fresh issuer looks like
    _mount(directory, second.cert, second.key)
    assert _served_serial(webhook.port, second) == second.serial()
    with pytest.raises(ssl.SSLCertVerificationError):
        _served_serial(webhook.port, first)  # the old certificate is gone from new connections


def test_a_half_written_replacement_keeps_the_current_certificate(
    mounted: tuple[Webhook, Path, certificates.Material],
) -> None:
    webhook, directory, first = mounted
    second = _material()
    _mount(directory, second.cert, first.key)  # the new certificate beside the old key
    assert _served_serial(webhook.port, first) == first.serial()
    _mount(directory, second.cert, second.key)  # the key follows
    assert _served_serial(webhook.port, second) == second.serial()


def test_the_flag_has_controller_runtimes_name() -> None:
    args = build_parser().parse_args(["webhook", "--webhook-cert-path", "/etc/elasticgpu/webhook-tls"])
    assert settings_from(args).cert_dir == "/etc/elasticgpu/webhook-tls"
    assert settings_from(build_parser().parse_args(["webhook"])).cert_dir == ""
