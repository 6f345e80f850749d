"""What a new user types first, run as they type it (the real `elasticgpu` command in a
subprocess), with the exact one line each mistake gets (issue 29)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "plan"
NODES = SAMPLE / "nodes.yaml"
CLASSES = SAMPLE / "classes.yaml"


def _elasticgpu(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "elasticgpu", *args], capture_output=True, text=True, timeout=120)


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and "pydantic" not in result.stderr, result.stderr
    return lines[0]


def _claim(tmp_path: Path, spec: str, name: str = "my-claim.yaml") -> Path:
    path = tmp_path / name
    path.write_text(
        "apiVersion: elasticgpu.io/v1alpha1\nkind: ElasticGPUClaim\nmetadata: {name: notebook, namespace: ml}\n"
        f"spec:\n{spec}"
    )
    return path


def test_a_misspelt_field_is_refused_with_what_was_meant(tmp_path: Path) -> None:
    claim = _claim(tmp_path, "  resouces:\n    requests: {elasticgpu.io/gpu-core: 30}\n")
    assert _one_line(_elasticgpu("plan", "-f", str(NODES), "-f", str(claim))) == (
        f"elasticgpu plan: error: {claim} document 1 (ElasticGPUClaim notebook):"
        " unknown field spec.resouces; did you mean spec.resources?"
    )


def test_a_field_in_the_wrong_case_does_not_bind_to_the_default_class(tmp_path: Path) -> None:
    claim = _claim(tmp_path, "  elasticGpuClassName: h100-only\n  resources:\n    requests: {nvidia.com/gpu: 1}\n")
    assert _one_line(_elasticgpu("plan", "-f", str(SAMPLE), "-f", str(claim))) == (
        f"elasticgpu plan: error: {claim} document 1 (ElasticGPUClaim notebook):"
        " unknown field spec.elasticGpuClassName; did you mean spec.elasticGPUClassName?"
    )


def test_an_unknown_field_of_a_class_and_of_metadata(tmp_path: Path) -> None:
    klass = tmp_path / "class.yaml"
    klass.write_text(
        "apiVersion: elasticgpu.io/v1alpha1\nkind: ElasticGPUClass\nmetadata: {name: fast, labelz: {a: b}}\n"
        "provisioner: elasticgpu.io/gpushare\nreclaimpolicy: Delete\n"
    )
    assert _one_line(_elasticgpu("plan", "-f", str(NODES), "-f", str(klass))) == (
        f"elasticgpu plan: error: {klass} document 1 (ElasticGPUClass fast): unknown field metadata.labelz;"
        " did you mean metadata.labels?, unknown field reclaimpolicy; did you mean reclaimPolicy?"
    )


def test_a_wrong_value_names_the_field_without_pydantic_text(tmp_path: Path) -> None:
    klass = tmp_path / "class.yaml"
    klass.write_text(
        "apiVersion: elasticgpu.io/v1alpha1\nkind: ElasticGPUClass\nmetadata: {name: fast}\n"
        "provisioner: elasticgpu.io/gpushare\nreclaimPolicy: delete\n"
    )
    assert _one_line(_elasticgpu("plan", "-f", str(NODES), "-f", str(klass))) == (
        f"elasticgpu plan: error: {klass} document 1 (ElasticGPUClass fast):"
        " reclaimPolicy: must be 'Delete' or 'Retain' (got 'delete')"
    )


def test_a_claim_without_resources_names_the_field(tmp_path: Path) -> None:
    claim = _claim(tmp_path, "  elasticGPUClassName: gpushare\n")
    assert _one_line(_elasticgpu("plan", "-f", str(NODES), "-f", str(claim))) == (
        f"elasticgpu plan: error: {claim} document 1 (ElasticGPUClaim notebook): spec.resources: required"
    )


def test_a_class_that_does_not_exist_stays_pending_naming_the_classes_there_are(tmp_path: Path) -> None:
    # As on a cluster: the claim is accepted and stays Pending with ClassNotFound; --strict fails.
    claim = _claim(tmp_path, "  elasticGPUClassName: h100-only\n  resources:\n    requests: {nvidia.com/gpu: 1}\n")
    result = _elasticgpu("plan", "--strict", "-f", str(NODES), "-f", str(CLASSES), "-f", str(claim))
    assert result.returncode == 1, result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("ml "))
    assert row.split("   ")[-1].strip() == (
        "ClassNotFound: spec.elasticGPUClassName: ElasticGPUClass h100-only does not exist (the classes are"
        " a100-whole, gpushare, h100); create it or name an existing class"
    )


def test_claims_without_cards_show_the_node_list_format(tmp_path: Path) -> None:
    claim = _claim(tmp_path, "  resources:\n    requests: {elasticgpu.io/gpu-core: 30}\n")
    assert _one_line(_elasticgpu("plan", "-f", str(claim))) == (
        f"elasticgpu plan: error: no GPU objects and no node list in {claim}: add one; a node list is a YAML"
        " document `nodes: [{name: node-a, cards: 8, model: NVIDIA A100-SXM4-80GB, memory: 80Gi, cpu: 96}]`"
        " (example: examples/plan/nodes.yaml), or pass the output of `kubectl get pgpu -o yaml` with -f"
    )


def test_a_misspelt_key_of_the_node_list(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text("nodes:\n  - {name: a, card: 2, memory: 80Gi}\n")
    assert _one_line(_elasticgpu("plan", "-f", str(nodes), "-f", str(CLASSES))) == (
        f"elasticgpu plan: error: {nodes} document 1: unknown field nodes[0].card; did you mean nodes[0].cards?"
    )


def test_plan_help_shows_the_node_list_format() -> None:
    result = _elasticgpu("plan", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "nodes: [{name: node-a, cards: 8, model: NVIDIA A100-SXM4-80GB, memory: 80Gi, cpu: 96}]" in text
    assert "examples/plan/nodes.yaml" in text


def test_the_sample_default_class_is_the_charts() -> None:
    result = _elasticgpu("plan")
    assert result.returncode == 0, result.stderr
    assert " gpushare " in result.stdout and " shared " not in result.stdout


def test_demo_with_a_missing_kubeconfig(tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent"
    assert _one_line(_elasticgpu("demo", "--kubeconfig", str(missing))) == (
        f"elasticgpu demo: error: no kubeconfig at {missing} and not running in a cluster:"
        " pass --kubeconfig PATH or set KUBECONFIG"
    )


@pytest.mark.parametrize("command", ["demo", "plan"])
def test_help_has_a_description(command: str) -> None:
    result = _elasticgpu(command, "--help")
    assert result.returncode == 0
    # argparse prints the description between the usage and the options.
    between = result.stdout.split("\n\n")[1]
    assert not between.startswith("options:") and len(between.split()) >= 5, result.stdout


def test_the_output_of_kubectl_get_is_plan_input(tmp_path: Path) -> None:
    """`kubectl get pgpu -o yaml` writes a `kind: List`; plan reads its items (the user guide says so)."""
    gpu = {
        "apiVersion": "elasticgpu.io/v1alpha1", "kind": "GPU",
        "metadata": {"name": "gpu-node-x-0", "resourceVersion": "7", "managedFields": [{"manager": "agent"}]},
        "spec": {"index": 0, "uuid": "GPU-node-x-0", "model": "NVIDIA A100-SXM4-80GB", "memory": 81920,
                 "nodeName": "node-x"},
    }
    listed = tmp_path / "gpus.yaml"
    listed.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [gpu], "metadata": {}}))
    claim = _claim(tmp_path, "  resources:\n    requests: {elasticgpu.io/gpu-core: 30}\n")
    result = _elasticgpu("plan", "--strict", "-f", str(listed), "-f", str(CLASSES), "-f", str(claim))
    assert result.returncode == 0, result.stderr
    assert re.search(r"^ml\s+notebook\s+Bound\s+gpushare\s+.*node-x\s+GPU-node-x-0", result.stdout, re.M), result.stdout


def test_render_manifests_without_helm_s_engine_says_how_to_get_it_in_one_line(tmp_path: Path) -> None:
    """Issue 36: in the .venv scripts/run.sh makes (no extras) the README's render command died with
    `ModuleNotFoundError: helm_python`. The module is hidden here as it is missing there."""
    hidden = tmp_path / "helm_python"
    hidden.mkdir()
    (hidden / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'helm_python'\", name='helm_python')\n")
    script = ROOT / "scripts" / "render-manifests.py"
    result = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "o")], capture_output=True,
                            text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert result.returncode == 1, result
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "helm-python-sdk" in lines[0] and "pip install -e '.[manifests]'" in lines[0], lines[0]
    assert not (tmp_path / "o").exists()


def test_the_readme_installs_what_its_commands_need_beyond_what_run_sh_installs() -> None:
    """Every README command must work in the .venv of the README's first command (scripts/run.sh,
    which installs the package without extras): the render command comes after the install of the
    `manifests` extra, and that extra holds Helm's engine."""
    run_sh = (ROOT / "scripts" / "run.sh").read_text()
    assert re.search(r"pip install [^\n]*-e \.(\s|$)", run_sh), "scripts/run.sh installs extras now: update this test"
    readme = (ROOT / "README.md").read_text()
    install, render = readme.find("pip install -q -e '.[manifests]'"), readme.find("scripts/render-manifests.py")
    assert 0 <= install < render, "README.md: install the manifests extra before scripts/render-manifests.py"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(req.startswith("helm-python-sdk") for req in extras["manifests"]), extras["manifests"]


def test_kubectl_egpu_runs_without_activating_the_venv_through_the_link_the_readme_gives(tmp_path: Path) -> None:
    """README: `ln -s "$PWD/.venv/bin/kubectl-egpu" ~/.local/bin/` puts the plugin on PATH; the
    script must then run with no venv on PATH (it once worked only after `source .venv/bin/activate`)."""
    script = Path(sys.executable).parent / "kubectl-egpu"
    assert script.exists(), f"{script} is missing: reinstall the package (pip install -e .)"
    assert "ln -s \"$PWD/.venv/bin/kubectl-egpu\" ~/.local/bin/" in (ROOT / "README.md").read_text()
    link_dir = tmp_path / "bin"
    link_dir.mkdir()
    (link_dir / "kubectl-egpu").symlink_to(script)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = f"{link_dir}{os.pathsep}/usr/bin{os.pathsep}/bin"
    result = subprocess.run(["kubectl-egpu", "plan", "-f", str(SAMPLE)], capture_output=True, text=True,
                            timeout=120, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[:3] == ["NAMESPACE", "NAME", "STATUS"], result.stdout


@pytest.mark.timeout(60)
def test_run_sh_installs_only_when_pyproject_changed(tmp_path: Path) -> None:
    """Issue 36: scripts/run.sh reinstalled the package on every run (~5 s). Run here on a copy of
    the repository's script and pyproject.toml whose .venv/bin/python records each call."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "run.sh", tmp_path / "scripts" / "run.sh")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    calls = tmp_path / "calls"
    for name in ("python", "elasticgpu"):
        (venv / name).write_text(f"#!/bin/sh\necho {name} \"$@\" >> {calls}\n")
        (venv / name).chmod(0o755)

    def run() -> list[str]:
        calls.write_text("")
        done = subprocess.run(["bash", str(tmp_path / "scripts" / "run.sh"), "plan"], capture_output=True, text=True,
                              timeout=30)
        assert done.returncode == 0, done.stderr
        return calls.read_text().splitlines()

    assert run()[0].startswith("python -m pip install"), "the first run installs"
    assert run() == ["elasticgpu plan"], "nothing changed: no reinstall"
    with (tmp_path / "pyproject.toml").open("a") as changed:
        changed.write("\n# a new dependency\n")
    assert run()[0].startswith("python -m pip install"), "pyproject.toml changed: reinstall"


@pytest.mark.timeout(60)
def test_run_sh_says_what_it_does_on_the_first_run_and_how_to_get_elasticgpu_on_path(tmp_path: Path) -> None:
    """Issue 50: the first run was silent for ~44 s (venv, a quiet pip), and the README's next
    command `elasticgpu demo ...` then failed with `command not found`. Run on a copy of the script
    with a python3 on PATH whose venv's pip prints what pip prints, and no elasticgpu on PATH."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "run.sh", tmp_path / "scripts" / "run.sh")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    tools = tmp_path / "tools"
    tools.mkdir()
    fake_pip = ("#!/bin/sh\n[ \"$2\" = pip ] || exit 0\n"
                "printf 'Obtaining file:///x\\nCollecting pydantic>=2\\n  Downloading p.whl\\nCollecting kopf\\n"
                "Installing collected packages: kopf, pydantic\\nSuccessfully installed kopf-1 pydantic-2\\n'\n")
    (tools / "python3").write_text(
        "#!/bin/sh\n[ \"$1 $2\" = \"-m venv\" ] || exit 3\nmkdir -p \"$3/bin\"\n"
        f"cat > \"$3/bin/python\" <<'EOF'\n{fake_pip}EOF\n"
        "printf '#!/bin/sh\\necho demo ran\\necho \"$ELASTICGPU_EXIT_NOTE\" >&2\\n' > \"$3/bin/elasticgpu\"\n"
        "chmod +x \"$3/bin/python\" \"$3/bin/elasticgpu\"\n")
    (tools / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{tools}{os.pathsep}/usr/bin{os.pathsep}/bin"}
    done = subprocess.run(["bash", str(tmp_path / "scripts" / "run.sh")], capture_output=True, text=True,
                          timeout=30, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "demo ran\n"
    told = done.stderr.splitlines()
    assert told[0].startswith("run.sh: first run: making a virtual environment in .venv"), told
    assert told[1].startswith("run.sh: installing elasticgpu and its dependencies into .venv"), told
    assert "run.sh:   1 pydantic>=2" in told and "run.sh:   2 kopf" in told, told  # progress, a line a package
    assert "run.sh: installed 2 packages" in told, told
    assert f'export PATH="{tmp_path}/.venv/bin:$PATH"' in done.stderr, done.stderr
    # With .venv/bin on PATH, no hint.
    env["PATH"] = f"{tmp_path / '.venv' / 'bin'}{os.pathsep}{env['PATH']}"
    again = subprocess.run(["bash", str(tmp_path / "scripts" / "run.sh")], capture_output=True, text=True,
                           timeout=30, env=env)
    assert again.returncode == 0 and again.stderr.strip() == "", again.stderr


def test_elasticgpu_prints_run_sh_s_note_last_and_hands_it_to_no_child(tmp_path: Path) -> None:
    """run.sh execs elasticgpu (Ctrl-C and SIGTERM reach it directly) and so leaves its PATH note to it."""
    env = {**os.environ, "ELASTICGPU_EXIT_NOTE": "run.sh: the note"}
    done = subprocess.run([sys.executable, "-m", "elasticgpu", "plan", "-f", str(SAMPLE)], capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 0 and done.stderr.rstrip().splitlines()[-1] == "run.sh: the note", done.stderr
    mistaken = subprocess.run([sys.executable, "-m", "elasticgpu", "plan", "-f", str(tmp_path / "none.yaml")],
                              capture_output=True, text=True, timeout=120, env=env)
    assert mistaken.returncode == 2 and mistaken.stderr.rstrip().splitlines()[-1] == "run.sh: the note"
    probe = ("import os, sys; from elasticgpu import cli; sys.argv = ['elasticgpu']; "
             "cli.main(['crds']); print('child sees', os.environ.get('ELASTICGPU_EXIT_NOTE'))")
    seen = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert "child sees None" in seen.stdout, seen.stdout[-300:] + seen.stderr
