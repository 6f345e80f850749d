"""The chart's translation values (issue 45, docs/translation.md): off by default; on, the webhook runs with the
table as its flags say, reads what it needs through a ClusterRole of its own, the cert-manager configuration is
the one the webhook publishes, and the chart refuses translation beside DRA's extended-resource DeviceClass."""

from __future__ import annotations

import json
import re

import helm_python
import pytest

from elasticgpu.api import translation
from elasticgpu.cli import build_parser
from elasticgpu.controller.admission.commands import settings_from
from elasticgpu.controller.admission.configuration import webhook_configuration
from tests.deploy.test_chart import CERT_MANAGER, CHART, _objects, _one

ON = {"translation": {"enabled": True}}


def _webhook_args(values: dict[str, object]) -> list[str]:
    deployment = _one(_objects(values), "Deployment", "elasticgpu-webhook")
    return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])


def test_off_by_default_nothing_of_it_is_rendered() -> None:
    assert "--translate" not in _webhook_args({})
    assert not [o for o in _objects({}) if o["metadata"]["name"] == "elasticgpu-webhook-translation"]


def test_on_the_webhook_gets_the_table_and_its_read_rights() -> None:
    settings = settings_from(build_parser().parse_args(_webhook_args(ON)))
    assert settings.translate
    assert settings.translation_table() == translation.default_table()
    rules = _one(_objects(ON), "ClusterRole", "elasticgpu-webhook-translation")["rules"]
    assert all(set(rule["verbs"]) <= {"get", "list"} for rule in rules)  # it writes nothing
    vendor = {"translation": {"enabled": True, "resources": {"amd.com/gpu": {"meaning": "cards"}}}}
    table = settings_from(build_parser().parse_args(_webhook_args(vendor))).translation_table()
    assert set(table.resources) == {*translation.DEFAULT_TABLE, "amd.com/gpu"}  # helm merges maps


def test_a_bad_table_stops_the_webhook_at_start_with_the_entry() -> None:
    bad = json.dumps({"nvidia.com/gpu": {"meaning": "gpus"}})
    with pytest.raises(SystemExit):
        build_parser().parse_args(["webhook", "--translate", "--translate-resources", bad])


def test_cert_manager_renders_the_configuration_the_webhook_publishes() -> None:
    values = {**CERT_MANAGER, **ON}
    args = _webhook_args(values)
    settings = settings_from(build_parser().parse_args(args))
    configuration = _one(_objects(values), "MutatingWebhookConfiguration", settings.configuration_name)
    published = webhook_configuration(settings, b"")
    for hook in published["webhooks"]:
        del hook["clientConfig"]["caBundle"]
    assert [h["name"] for h in configuration["webhooks"]] == ["pods.elasticgpu.io", "translate.pods.elasticgpu.io"]
    assert configuration["webhooks"] == published["webhooks"]


def test_translation_and_dra_s_extended_resource_device_class_are_refused_together() -> None:
    values = {**ON, "dra": {"extendedResourceDeviceClass": {"enabled": True}}}
    chart = helm_python.Chart.load(CHART)
    try:
        both = re.escape("translation.enabled and dra.extendedResourceDeviceClass.enabled")
        with pytest.raises(Exception, match=both):
            chart.render(values, name="elasticgpu", namespace="elasticgpu-system")
    finally:
        chart.close()
