"""The dashboard and the rules against a real Prometheus scraping the demo's controller, webhook
and agents (issue 38 item 4): every series an expression names is one a component exports, every
dashboard query and recording rule returns something where the demo's claims should show, and
every rule evaluates without error. One demo run serves every check (about a minute)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elasticgpu.kubectl_plugin import command
from elasticgpu.testbed import local_runtime
from tests.observability import prometheus


@pytest.fixture(scope="module")
def observed(prometheus_binaries: prometheus.Binaries, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[Any, prometheus.Prometheus, set[str]]]:
    reason = local_runtime.unavailable_reason()
    if reason is not None:
        # Without containers no claim reaches an agent's ledger: the per-claim series the
        # dashboard shows would be empty for want of a runtime, not for a fault of ours.
        pytest.skip(f"the demo needs the test containerd here: {reason}")
    directory: Path = tmp_path_factory.mktemp("prometheus")
    with prometheus.observed_demo(prometheus_binaries, directory) as (demo, server):
        exported = {"up"} | {r["record"] for r in prometheus.rules() if "record" in r}
        for addresses in demo.metrics_targets.values():
            for address in addresses:
                exported |= prometheus.exported_names(address)
        yield demo, server, exported


EXPRESSIONS = [*prometheus.dashboard_expressions(),
               *((rule.get("alert") or rule["record"], rule["expr"]) for rule in prometheus.rules())]


@pytest.mark.timeout(300)
def test_every_expression_names_only_series_a_component_exports(
        observed: tuple[Any, prometheus.Prometheus, set[str]]) -> None:
    _, _, exported = observed
    unknown = {f"{title}: {name}" for title, expr in EXPRESSIONS
               for name in prometheus.METRIC.findall(expr) if name not in exported}
    assert not unknown, f"expressions name series no component exports: {sorted(unknown)}"


@pytest.mark.timeout(300)
def test_every_dashboard_query_shows_the_demo(observed: tuple[Any, prometheus.Prometheus, set[str]]) -> None:
    demo, server, _ = observed
    empty, nan = [], []
    for title, expr in prometheus.dashboard_expressions():
        result = server.query(prometheus.for_prometheus(expr))
        if not result:
            empty.append(f"{title}: {expr}")
        elif not any(math.isfinite(float(sample["value"][1])) for sample in result):
            nan.append(f"{title}: {expr}")
    assert not empty, f"dashboard queries that return nothing while the demo runs: {empty}"
    assert not nan, f"dashboard queries with no finite value while the demo runs: {nan}"
    # The demo's namespace shows in the accounting panels, with what its claims reserve.
    namespace = demo.scenario.namespace
    reserved = server.query("sum by (namespace) (rate(elasticgpu_reserved_core_seconds_total[1m]))")
    assert {s["metric"]["namespace"] for s in reserved} == {namespace}, reserved
    # The namespace totals (every class; what the panels read) reserve what the per-claim series do.
    totals = server.query("sum by (namespace) (rate(elasticgpu_namespace_reserved_core_seconds_total[1m]))")
    assert {s["metric"]["namespace"] for s in totals} == {namespace}, totals


@pytest.mark.timeout(300)
def test_every_rule_evaluates_and_the_recording_rules_have_values(
        observed: tuple[Any, prometheus.Prometheus, set[str]]) -> None:
    demo, server, _ = observed
    groups = server.api("rules")["groups"]
    evaluated = {rule["name"]: rule for group in groups for rule in group["rules"]}
    assert set(evaluated) == {r.get("alert") or r["record"] for r in prometheus.rules()}
    broken = {name: rule.get("lastError") for name, rule in evaluated.items() if rule.get("health") != "ok"}
    assert not broken, f"rules Prometheus could not evaluate: {broken}"
    for rule in prometheus.rules():
        if "record" in rule:
            assert server.query(rule["record"]), f"recording rule {rule['record']} has no value while the demo runs"
    # The demo's containers run simulated GPU processes (`make_containers_busy`): what the agents
    # measured reaches each class through the claim join, below what the class reserved.
    reserved = {s["metric"]["class"]: float(s["value"][1])
                for s in server.query("namespace_class:elasticgpu_reserved_cores:rate5m")}
    used = {s["metric"]["class"]: float(s["value"][1])
            for s in server.query("namespace_class:elasticgpu_used_cores:rate5m")}
    assert set(used) == set(reserved), (used, reserved)
    assert all(0 < used[c] < reserved[c] for c in used), (used, reserved)
    # Healthy demo: nothing an operator must act on fires, except the one alert the demo's claim
    # that can never fit may raise after 15 minutes (it does not run that long).
    firing = [a["labels"]["alertname"] for a in server.api("alerts")["alerts"] if a["state"] == "firing"]
    assert not firing, f"alerts firing on a healthy demo: {firing}"
    # The accounting counter of each Bound claim grows at its size: the demo's 30% slice reserves 30 cores.
    namespace = demo.scenario.namespace
    slice_rate = server.query(f'sum(rate(elasticgpu_reserved_core_seconds_total{{namespace="{namespace}"}}[1m]))')
    assert slice_rate and float(slice_rate[0]["value"][1]) > 0


@pytest.mark.timeout(300)
def test_kubectl_egpu_usage_agrees_from_prometheus_and_from_the_objects(
        observed: tuple[Any, prometheus.Prometheus, set[str]], capsys: pytest.CaptureFixture[str]) -> None:
    demo, server, _ = observed
    namespace = demo.scenario.namespace
    connection = ["--kubeconfig", str(demo.kubeconfig), "-n", namespace]
    deadline = time.monotonic() + 45  # the agents write a claim's usage rate-limited (usage_write_interval_s)
    while True:
        assert command.main(["usage", *connection, "-o", "json"]) == 0
        now = json.loads(capsys.readouterr().out)
        if all(row.get("used_cores_now") for row in now["rows"]) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert now["source"] == "objects" and now["rows"], now
    cores_now = sum(row["reserved_cores_now"] for row in now["rows"])
    assert cores_now >= 130, now  # the demo's 30% slice and its whole card at least
    assert all(row["namespace"] == namespace and row["claims"] >= 1 for row in now["rows"])

    assert command.main(["usage", *connection, "--prometheus", server.url, "--since", "1m", "-o", "json"]) == 0
    window = json.loads(capsys.readouterr().out)
    assert window["source"] == "prometheus" and window["window"] == "1m"
    by_class = {row["class_name"]: row for row in window["rows"]}
    assert set(by_class) == {row["class_name"] for row in now["rows"]}
    for row in now["rows"]:
        # Over the last minute each class reserved its cores now x (at most) 60 s: the two sources agree.
        reserved = by_class[row["class_name"]]["reserved_core_seconds"]
        assert 0 < reserved <= row["reserved_cores_now"] * 61, (row, by_class)
        assert by_class[row["class_name"]]["used_core_seconds"] > 0  # the agents' counters, joined by claim
        assert 0 < by_class[row["class_name"]]["waste"] < 1
        assert row["used_cores_now"] > 0  # the agents' last measurement, in the claims' status.usage

    assert command.main(["usage", *connection, "--prometheus", server.url]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].split() == ["NAMESPACE", "CLASS", "RESERVED-CARD-H", "USED-CARD-H", "WASTE",
                                            "RESERVED-GIB-H", "USED-GIB-H"]
    assert namespace in text and "over the last 24h" in text
    # A window without Prometheus is refused, saying what to do.
    assert command.main(["usage", *connection, "--since", "1h"]) != 0
    assert "--since 1h needs --prometheus URL" in capsys.readouterr().err
