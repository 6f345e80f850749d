"""deploy/webhook.yaml agrees with the webhook's defaults (names, port, permissions it uses)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from elasticgpu.cli import build_parser
from elasticgpu.controller.admission import WebhookSettings
from elasticgpu.controller.admission.commands import settings_from
from elasticgpu.flags import BindAddress

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "webhook.yaml"


def _objects() -> dict[tuple[str, str], dict[str, Any]]:
    docs = [doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc]
    return {(doc["kind"], doc["metadata"]["name"]): doc for doc in docs}


def test_names_and_ports_match_the_settings() -> None:
    objects = _objects()
    container = objects["Deployment", "elasticgpu-webhook"]["spec"]["template"]["spec"]["containers"][0]
    settings = settings_from(build_parser().parse_args(container["args"]))
    probes = BindAddress(host="0.0.0.0", port=8081)
    assert settings == WebhookSettings(namespace="elasticgpu-system", service_name="elasticgpu-webhook", port=8443,
                                       health_probe_bind_address=probes, metrics_bind_address=probes)
    assert container["ports"] == [{"name": "https", "containerPort": settings.port},
                                  {"name": "http-metrics", "containerPort": probes.port}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http-metrics"}
    service = objects["Service", settings.service_name]
    assert service["metadata"]["namespace"] == settings.namespace
    assert service["spec"]["ports"][0]["port"] == settings.service_port


def test_permissions_cover_the_calls_of_publishing() -> None:
    objects = _objects()
    settings = WebhookSettings()
    role_rules = objects["Role", "elasticgpu-webhook"]["rules"]
    assert {"get", "update"} <= {
        verb for rule in role_rules if rule.get("resourceNames") == [settings.secret_name] for verb in rule["verbs"]
    }
    assert any(rule["verbs"] == ["create"] and "resourceNames" not in rule for rule in role_rules)
    cluster_rules = objects["ClusterRole", "elasticgpu-webhook"]["rules"]
    assert {"get", "patch"} <= {
        verb
        for rule in cluster_rules
        if rule.get("resourceNames") == [settings.configuration_name]
        for verb in rule["verbs"]
    }
