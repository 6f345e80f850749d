"""The chart rendered with a user's values, without helm (issue 29): scripts/render-manifests.py
with -f, --set and --out, run as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "render-manifests.py"


def _render(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO)


def _objects(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _told(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip() and " INFO " not in line]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[-1]


def test_values_files_and_sets_render_into_a_folder_of_ones_own(tmp_path: Path) -> None:
    values = tmp_path / "my-values.yaml"
    values.write_text(yaml.safe_dump({
        "image": {"repository": "registry.example.com/elasticgpu", "tag": "from-file"},
        "agent": {"nodeHook": "cri-proxy",
                  "installer": {"nodeSelector": {"elasticgpu.io/agent": None, "pool": "gpu"}}},
        "defaultClass": {"name": "shared-a100"},
    }))
    out = tmp_path / "manifests"
    result = _render("-f", str(values), "--set", "image.tag=0.1.0,controller.replicas=1",
                     "--set", "controller.leaderElect=false", "--set", "image.tga=x", "--out", str(out))
    assert result.returncode == 0, result.stderr
    # A key the chart does not know is told, with the one meant (Helm would ignore it silently).
    assert "note: image.tga: the chart's values.yaml has no image.tga; did you mean image.tag?" in result.stderr

    deployment = next(o for o in _objects(out / "controller.yaml") if o["kind"] == "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example.com/elasticgpu:0.1.0"  # --set wins over -f
    assert deployment["spec"]["replicas"] == 1 and "--leader-elect=false" in container["args"]
    installer = next(o for o in _objects(out / "agent-installer.yaml") if o["kind"] == "DaemonSet")
    assert installer["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "gpu"}
    [klass] = _objects(out / "default-class.yaml")
    assert klass["metadata"]["name"] == "shared-a100"
    # The same files as deploy/ but the other node hook's (deploy/ carries both: PLAIN_VARIANTS; the
    # user's values chose one), the CRDs beside them; deploy/ itself untouched.
    deploy = {p.relative_to(REPO / "deploy") for p in [*(REPO / "deploy").glob("*.yaml"),
                                                         *(REPO / "deploy" / "policies").glob("*.yaml")]}
    rendered = {p.relative_to(out) for p in out.rglob("*.yaml")}
    assert deploy - {Path("agent-daemonset.yaml")} <= rendered
    assert Path("agent-daemonset.yaml") not in rendered
    assert {p.name for p in (out / "crds").glob("*.yaml")} == {p.name for p in (REPO / "crds").glob("*.yaml")}
    assert _render("--check").returncode == 0


def test_a_set_without_a_value_is_told_in_one_line(tmp_path: Path) -> None:
    assert _told(_render("--set", "image.tag", "--out", str(tmp_path))) == (
        "render-manifests.py: error: --set 'image.tag': 'image.tag' is not key=value; e.g. --set image.tag=0.1.0"
    )


def test_values_never_overwrite_deploy() -> None:
    assert _told(_render("--set", "image.tag=0.1.0")).endswith(
        "error: -f, --set and --api-versions need --out DIR: deploy/ holds the chart's defaults (tests check it)"
    )


def test_a_values_file_that_is_missing(tmp_path: Path) -> None:
    assert _told(_render("-f", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "o"))) == (
        f"render-manifests.py: error: -f {tmp_path / 'nope.yaml'}: cannot be read (No such file or directory)"
    )


def test_api_versions_reach_the_chart_s_auto_switches_and_the_run_prints_no_go_log_lines(tmp_path: Path) -> None:
    """Issue 50: `serviceMonitor.enabled: auto` rendered nothing, silently, since the script could not
    be given `--api-versions`; and every run printed three `INFO found symbolic link` lines of Go's logger."""
    without, given = tmp_path / "without", tmp_path / "given"
    result = _render("--set", "metrics.serviceMonitor.enabled=auto,prometheusRule.enabled=auto", "--out", str(without))
    assert result.returncode == 0, result.stderr
    assert not [o for o in _objects(without / "metrics.yaml") if o["kind"] == "ServiceMonitor"]
    notes = [line for line in result.stderr.splitlines() if line.strip()]
    assert notes == [
        "note: metrics.serviceMonitor.enabled: auto renders nothing without --api-versions"
        " monitoring.coreos.com/v1/ServiceMonitor (pass it when your cluster runs the Prometheus Operator)",
        "note: prometheusRule.enabled: auto renders nothing without --api-versions"
        " monitoring.coreos.com/v1/PrometheusRule (pass it when your cluster runs the Prometheus Operator)",
    ], result.stderr  # nothing else: no Go log line
    result = _render("--set", "metrics.serviceMonitor.enabled=auto,prometheusRule.enabled=auto", "--out", str(given),
                     "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor",
                     "-a", "monitoring.coreos.com/v1/PrometheusRule,example.com/v1")
    assert result.returncode == 0 and result.stderr == "", result.stderr
    [monitor] = [o for o in _objects(given / "metrics.yaml") if o["kind"] == "ServiceMonitor"]
    assert monitor["metadata"]["name"] == "elasticgpu"
    assert [o["kind"] for o in _objects(given / "monitoring.yaml")] == ["PrometheusRule"]


def test_api_versions_need_out() -> None:
    assert "--api-versions need --out DIR" in _told(_render("--api-versions", "monitoring.coreos.com/v1"))


def test_the_managed_cluster_sample_renders_with_keys_the_chart_has(tmp_path: Path) -> None:
    """deploy/chart/values-managed-cluster.yaml (issue 50): every key is the chart's, and it renders the
    agent as the NRI DaemonSet with no installer, and the monitoring objects where the API is served."""
    sample = REPO / "deploy" / "chart" / "values-managed-cluster.yaml"
    result = _render("-f", str(sample), "--out", str(tmp_path / "m"), "--api-versions",
                     "monitoring.coreos.com/v1/ServiceMonitor,monitoring.coreos.com/v1/PrometheusRule")
    assert result.returncode == 0 and result.stderr == "", result.stderr  # no unknown key, no note
    daemonset = next(o for o in _objects(tmp_path / "m" / "agent-daemonset.yaml") if o["kind"] == "DaemonSet")
    assert daemonset["spec"]["template"]["spec"]["nodeSelector"] == {"elasticgpu.io/agent": "true"}  # nodes opt in
    assert not (tmp_path / "m" / "agent-installer.yaml").exists()
    assert [o for o in _objects(tmp_path / "m" / "metrics.yaml") if o["kind"] == "ServiceMonitor"]
