"""`elasticgpu webhook --health-probe-bind-address / --metrics-bind-address` (issue 18, conventions):
plain-HTTP /healthz, /readyz and /metrics beside the HTTPS server, over real HTTP and HTTPS, with a
mounted certificate (no API server needed). Off by default."""

from __future__ import annotations

import datetime
import http.client
import json
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elasticgpu.api import names
from elasticgpu.cli import build_parser
from elasticgpu.controller.admission import Webhook, certificates
from elasticgpu.controller.admission.commands import settings_from

HOST = "127.0.0.1"


def _get(port: int, path: str, host: str = HOST) -> tuple[int, str]:
    connection = http.client.HTTPConnection(host, port, timeout=5)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def _post(port: int, material: certificates.Material, body: bytes) -> int:
    context = ssl.create_default_context(cadata=material.ca_cert.decode())
    connection = http.client.HTTPSConnection(HOST, port, context=context, timeout=5)
    try:
        connection.request("POST", "/mutate-pods", body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def _review(pod: dict[str, Any]) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u", "operation": "CREATE", "kind": {"kind": "Pod"}, "object": pod}}).encode()  # fmt: skip


def _pod(annotations: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "annotations": annotations}, "spec": {"containers": [{"name": "main"}], **spec}}


def _webhook(cert_dir: Path, *extra: str) -> Webhook:
    args = build_parser().parse_args(
        ["webhook", "--listen-host", HOST, "--port", "0", "--webhook-cert-path", str(cert_dir), *extra]
    )
    return Webhook(api=None, settings=settings_from(args))


@pytest.fixture
def empty_mount(tmp_path: Path) -> Iterator[tuple[Webhook, Path]]:
    webhook = _webhook(tmp_path, "--health-probe-bind-address", f"{HOST}:0", "--metrics-bind-address", f"{HOST}:0")
    webhook.start()
    try:
        yield webhook, tmp_path
    finally:
        webhook.stop()


def test_one_server_answers_probes_and_metrics_and_counts_reviews_by_outcome(
    empty_mount: tuple[Webhook, Path],
) -> None:
    webhook, directory = empty_mount
    assert len(webhook.probes) == 1, "the same address for both flags: one server"
    port = webhook.probes[0].port
    assert _get(port, "/healthz") == (200, "ok\n")
    status, body = _get(port, "/readyz")
    assert status == 503 and "[-]certificate failed: no serving certificate loaded yet" in body

    material = certificates.generate(hosts=[HOST], now=datetime.datetime.now(datetime.UTC), validity_s=3600)
    (directory / "tls.crt").write_bytes(material.cert)
    (directory / "tls.key").write_bytes(material.key)
    claimed = {f"{names.ANNOTATION_CLAIM_PREFIX}main": "c"}
    # Nothing listens before a certificate (issue 28.2): the webhook loads the files as they come.
    assert webhook.wait_ready(10), "the mounted certificate was not loaded"
    assert _post(webhook.port, material, _review(_pod({}))) == 200
    assert _post(webhook.port, material, _review(_pod(claimed))) == 200
    assert _post(webhook.port, material, _review(_pod(claimed, nodeName="n1"))) == 200
    assert _post(webhook.port, material, b"{not json") == 400
    assert _get(port, "/readyz") == (200, "ok\n")

    status, text = _get(port, "/metrics")
    assert status == 200
    for outcome, count in (("allowed", 1), ("patched", 1), ("denied", 1), ("malformed", 1), ("error", 0)):
        assert f'elasticgpu_webhook_reviews_total{{outcome="{outcome}"}} {count}.0' in text, text
    assert "process_resident_memory_bytes" in text
    status, body = _get(port, "/mutate-pods")
    assert status == 404 and "/metrics, /healthz, /readyz" in body


def test_two_addresses_two_servers_each_with_its_own_paths(tmp_path: Path) -> None:
    # 127.0.0.2 is loopback too on Linux: a different address, so a second server.
    webhook = _webhook(tmp_path, "--health-probe-bind-address", f"{HOST}:0", "--metrics-bind-address", "127.0.0.2:0")
    webhook.start()
    try:
        health, metrics = webhook.probes
        assert _get(health.port, "/healthz")[0] == 200 and _get(health.port, "/metrics")[0] == 404
        assert _get(metrics.port, "/metrics", "127.0.0.2")[0] == 200
        assert _get(metrics.port, "/healthz", "127.0.0.2")[0] == 404
    finally:
        webhook.stop()
    # Stopped: the HTTPS accept thread is gone, so a liveness check made now fails.
    assert webhook._accepting() is not None


def test_off_by_default_and_zero_is_off(tmp_path: Path) -> None:
    assert _webhook(tmp_path).settings.health_probe_bind_address is None
    settings = _webhook(tmp_path, "--health-probe-bind-address", "0", "--metrics-bind-address", "0").settings
    assert settings.health_probe_bind_address is None and settings.metrics_bind_address is None
    webhook = _webhook(tmp_path)
    webhook.start()
    try:
        assert webhook.probes == []
    finally:
        webhook.stop()


def test_a_taken_probe_port_is_one_line_naming_the_flag(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "elasticgpu", "webhook", "--listen-host", HOST, "--port", "0",
             "--webhook-cert-path", str(tmp_path), "--health-probe-bind-address", f"{HOST}:{port}"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"--health-probe-bind-address {HOST}:{port}" in result.stderr and "is already in use" in result.stderr
