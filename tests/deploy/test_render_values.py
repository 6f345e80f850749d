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
        "error: -f and --set need --out DIR: deploy/ holds the chart's defaults (tests check it)"
    )


def test_a_values_file_that_is_missing(tmp_path: Path) -> None:
    assert _told(_render("-f", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "o"))) == (
        f"render-manifests.py: error: -f {tmp_path / 'nope.yaml'}: cannot be read (No such file or directory)"
    )
