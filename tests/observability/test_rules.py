"""The chart's rules and dashboard as files and as chart objects: promtool accepts the rules and
their unit tests pass (one firing and one quiet case per alert); the chart renders them only when
asked, and "auto" only where the Prometheus Operator's CRDs are served (issue 38 items 2 and 3)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import helm_python
import pytest
import yaml

from tests.observability import prometheus

RULES_TEST = prometheus.REPO / "tests" / "observability" / "rules_test.yaml"
CHART = prometheus.REPO / "deploy" / "chart"


def _promtool(binaries: prometheus.Binaries, *args: str) -> str:
    done = subprocess.run([str(binaries.promtool), *args], capture_output=True, text=True, timeout=120,
                          check=False, cwd=prometheus.REPO)
    assert done.returncode == 0, f"promtool {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.timeout(120)
def test_promtool_checks_the_rules(prometheus_binaries: prometheus.Binaries) -> None:
    out = _promtool(prometheus_binaries, "check", "rules", str(prometheus.RULES))
    assert f"SUCCESS: {len(prometheus.rules())} rules found" in out


@pytest.mark.timeout(120)
def test_every_alert_fires_and_stays_quiet_in_promtool_unit_tests(prometheus_binaries: prometheus.Binaries) -> None:
    alerts = {rule["alert"] for rule in prometheus.rules() if "alert" in rule}
    cases = yaml.safe_load(RULES_TEST.read_text())["tests"]
    firing = {t["alertname"] for case in cases for t in case.get("alert_rule_test", []) if t["exp_alerts"]}
    quiet = {t["alertname"] for case in cases for t in case.get("alert_rule_test", []) if not t["exp_alerts"]}
    assert alerts - firing == set(), f"alerts with no firing unit test in {RULES_TEST.name}"
    assert alerts - quiet == set(), f"alerts with no quiet unit test in {RULES_TEST.name}"
    _promtool(prometheus_binaries, "test", "rules", str(RULES_TEST))


def _render(values: dict[str, Any]) -> list[dict[str, Any]]:
    chart = helm_python.Chart.load(CHART)
    try:
        rendered = chart.render(values, name="elasticgpu", namespace="elasticgpu-system")
    finally:
        chart.close()
    return [doc for template, text in rendered.items() if template.endswith(".yaml")
            for doc in yaml.safe_load_all(text) if doc]


@pytest.mark.timeout(60)
def test_the_chart_renders_rules_and_dashboard_only_when_asked() -> None:
    kinds = {"PrometheusRule", "ServiceMonitor"}
    assert not [d for d in _render({}) if d["kind"] in kinds or d["metadata"]["name"] == "elasticgpu-dashboard"]
    objects = _render({"prometheusRule": {"enabled": True, "labels": {"release": "prom"}},
                       "grafana": {"dashboard": {"enabled": True, "annotations": {"grafana_folder": "GPUs"}}},
                       "metrics": {"serviceMonitor": {"enabled": True}}})
    (rule,) = [d for d in objects if d["kind"] == "PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["spec"] == yaml.safe_load(prometheus.RULES.read_text())
    (board,) = [d for d in objects if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "elasticgpu-dashboard"]
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"  # what Grafana's sidecar looks for
    assert board["metadata"]["annotations"] == {"grafana_folder": "GPUs"}
    assert json.loads(board["data"]["elasticgpu.json"]) == json.loads(prometheus.DASHBOARD.read_text())
    (monitor,) = [d for d in objects if d["kind"] == "ServiceMonitor"]
    assert all(endpoint["honorLabels"] for endpoint in monitor["spec"]["endpoints"])  # the claims' namespace label


@pytest.mark.timeout(60)
def test_auto_renders_nothing_where_the_operator_crds_are_not_served() -> None:
    objects = _render({"prometheusRule": {"enabled": "auto"}, "metrics": {"serviceMonitor": {"enabled": "auto"}}})
    assert not [d for d in objects if d["kind"] in ("PrometheusRule", "ServiceMonitor")]
    with pytest.raises(helm_python.HelmError, match="enabled must be true, false or auto"):
        _render({"prometheusRule": {"enabled": "yes"}})


@pytest.mark.timeout(30)
def test_every_dashboard_query_and_rule_names_our_metrics_only_in_documented_form() -> None:
    """Offline half of the check (the live half is test_against_prometheus): each expression names
    at least one of our series, and each series it names is in docs/metrics.md or a recording rule."""
    documented = (prometheus.REPO / "docs" / "metrics.md").read_text()
    recorded = {rule["record"] for rule in prometheus.rules() if "record" in rule}
    expressions = [*prometheus.dashboard_expressions(), *((r.get("alert") or r["record"], r["expr"])
                                                         for r in prometheus.rules())]
    for title, expr in expressions:
        named = set(prometheus.METRIC.findall(expr))
        assert named or "up{" in expr, f"{title}: {expr} names none of our metrics"
        for name in named - recorded:
            base = name.removesuffix("_bucket")
            assert f"`{base}`" in documented, f"{title}: {name} is not in docs/metrics.md"
