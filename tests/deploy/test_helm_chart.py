"""The chart under the real helm (issue 35): the helm binary a platform team runs (helm v4, built from
the Go module proxy by testhelm/build.sh; tests/helm_binary.py finds it), not Helm's engine as a
library. No cluster: `helm lint --strict`, `helm template` and `helm package`.

scripts/render-manifests.py renders the plain manifests of deploy/ (and a user's own, with -f/--set)
through helm-python-sdk, Helm's engine compiled into a library of its own release cycle; the checks
here hold it to what `helm template` renders for the same values, file by file. Documents are
compared as sets of their significant lines (comment lines aside, as test_chart.py compares deploy/):
helm prints a template's documents in its install order (ServiceAccount before Role ...), the
library in the template's own, and neither order reaches the API server.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import tarfile
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

import elasticgpu
from tests.helm_binary import Helm, helm_or_skip, pinned_version

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "chart"
DEPLOY = REPO / "deploy"
SCRIPT = REPO / "scripts" / "render-manifests.py"
RELEASE, NAMESPACE = "elasticgpu", "elasticgpu-system"
PLAIN = {"namespace": {"create": True}}
"""What render-manifests.py adds under the user's values (its PLAIN_VALUES): each file carries its Namespace."""
CERT_MANAGER = {"webhook": {"certificates": "cert-manager"}}
CRI_PROXY = {"agent": {"nodeHook": "cri-proxy"}}

# The value sets tests/deploy/test_chart.py and test_render_values.py render through the library.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "cert-manager": CERT_MANAGER,
    "own-issuer": {"webhook": {"certificates": "cert-manager",
                               "certManager": {"issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}}},
    "service-monitor": {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}},
    "cri-proxy": CRI_PROXY,
    "image-namespace-replicas": {
        "image": {"repository": "registry.example/egpu", "tag": "9.9.9", "pullPolicy": "Always"},
        "namespace": {"name": "gpu-infra"}, "controller": {"replicas": 3}, "webhook": {"replicas": 4},
    },
    "one-controller": {"controller": {"replicas": 1, "leaderElect": False}},
    "no-default-class": {"defaultClass": {"enabled": False}},
    "no-aggregation": {"rbac": {"aggregateToDefaultRoles": False, "classesReadableByAll": False}},
    "monitoring": {"prometheusRule": {"enabled": True, "labels": {"release": "prom"}},
                   "grafana": {"dashboard": {"enabled": True, "namespace": "grafana"}}},
    "monitoring-auto": {"prometheusRule": {"enabled": "auto"}, "metrics": {"serviceMonitor": {"enabled": "auto"}}},
    # null drops a default map key: both must drop it the same way.
    "installer-null-label": {"agent": {"nodeHook": "cri-proxy",
                                       "installer": {"nodeSelector": {"pool": "gpu", "elasticgpu.io/agent": None}},
                                       "env": {"ELASTICGPU_AGENT_CRI_UPSTREAM": "unix:///run/crio/crio.sock"}}},
}


@pytest.fixture(scope="module")
def helm() -> Helm:
    return helm_or_skip()


def _significant(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#"))


def _documents(text: str) -> list[str]:
    """The documents of a YAML stream, each as its significant lines, sorted; empty ones dropped."""
    docs = (_significant(doc) for doc in re.split(r"^---[ \t]*$", text, flags=re.MULTILINE))
    return sorted(doc for doc in docs if doc)


def _values_file(folder: Path, name: str, values: dict[str, Any]) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(json.dumps(values))  # JSON is YAML: null stays null, "true" stays text
    return path


def _helm_template(
    helm: Helm, files: list[Path], sets: list[str], *, chart: Path = CHART, extra: Sequence[str] = ()
) -> dict[str, list[str]]:
    """`helm template` as a user runs it, CRDs included: the file each document would land in under
    render-manifests.py's layout (templates/X.yaml -> X.yaml, policies.yaml -> policies/, crds/F),
    without Helm's hooks (render-manifests.py leaves them out: helm-*.yaml)."""
    args = ["template", RELEASE, str(chart), "--namespace", NAMESPACE, "--include-crds"]
    args += [a for f in files for a in ("-f", str(f))] + [a for s in sets for a in ("--set", s)] + [*extra]
    out = helm.run(*args).stdout
    # split() with a group: [before, source1, doc1, source2, doc2, ...]
    parts = re.split(rf"^---\n# Source: {RELEASE}/(\S+)\n", out, flags=re.MULTILINE)
    assert not parts[0].strip(), parts[0][:200]
    found: dict[str, list[str]] = defaultdict(list)
    for source, text in zip(parts[1::2], parts[2::2], strict=True):
        name = source.removeprefix("templates/")
        if name.startswith("helm-"):
            continue
        found["policies/" if name == "policies.yaml" else name] += _documents(text)
    # A template whose switch is off leaves only its comments, which render-manifests.py writes no file for.
    return {name: sorted(docs) for name, docs in found.items() if docs}


def _render_manifests(files: list[Path], sets: list[str], out: Path) -> dict[str, list[str]]:
    """scripts/render-manifests.py -f ... --set ... --out DIR, as a user runs it: the same layout."""
    args = [a for f in files for a in ("-f", str(f))] + [a for s in sets for a in ("--set", s)]
    done = subprocess.run([sys.executable, str(SCRIPT), *args, "--out", str(out)], capture_output=True, text=True,
                          timeout=120, cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr
    return _folder(out)


def _folder(root: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.yaml")):
        relative = path.relative_to(root)
        found["policies/" if relative.parts[0] == "policies" else str(relative)] += _documents(path.read_text())
    return {name: sorted(docs) for name, docs in found.items() if docs}


def _differences(helm: dict[str, list[str]], ours: dict[str, list[str]]) -> list[str]:
    """Which files differ, and the first document that does in each (for the assertion message)."""
    out = [f"{name}: only helm renders it" for name in sorted(set(helm) - set(ours))]
    out += [f"{name}: only render-manifests.py renders it" for name in sorted(set(ours) - set(helm))]
    for name in sorted(set(helm) & set(ours)):
        if helm[name] != ours[name]:
            extra = [d for d in helm[name] if d not in ours[name]] or [d for d in ours[name] if d not in helm[name]]
            out.append(f"{name}: differs; e.g.\n{(extra or ['(a document twice)'])[0][:1500]}")
    return out


def test_the_binary_is_the_pinned_helm(helm: Helm) -> None:
    assert pinned_version().startswith("v4.")
    assert helm.version() == pinned_version()


@pytest.mark.parametrize("name", ["defaults", "cert-manager", "service-monitor", "cri-proxy", "one-controller"])
def test_helm_lints_the_chart_strictly(helm: Helm, tmp_path: Path, name: str) -> None:
    """`helm lint --strict` (warnings fail too) at the chart's oldest Kubernetes, as test_chart.py's library lint."""
    values = _values_file(tmp_path, name, VALUE_SETS[name])
    done = helm.run("lint", "--strict", str(CHART), "--namespace", NAMESPACE, "--kube-version", "v1.31.0",
                    "-f", str(values), check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout
    assert not re.search(r"^\[(WARNING|ERROR)\]", done.stdout, re.MULTILINE), done.stdout


def test_helm_lint_fails_a_broken_copy_of_the_chart(helm: Helm, tmp_path: Path) -> None:
    """The lint above can fail: a copy with one template that does not render, and one whose Chart.yaml
    has no version, are refused (symlinks followed: files/policies and crds/ are the repository's)."""
    broken = tmp_path / "chart"
    shutil.copytree(CHART, broken, symlinks=False)
    (broken / "templates" / "broken.yaml").write_text("kind: ConfigMap\nmetadata:\n  name: {{ .Values.nope.nope }}\n")
    done = helm.run("lint", "--strict", str(broken), check=False)
    assert done.returncode != 0 and "1 chart(s) failed" in done.stderr, done.stdout + done.stderr
    assert "[ERROR] templates/: elasticgpu/templates/broken.yaml" in done.stdout, done.stdout
    (broken / "templates" / "broken.yaml").unlink()
    assert helm.run("lint", "--strict", str(broken), check=False).returncode == 0
    chart_yaml = broken / "Chart.yaml"
    chart_yaml.write_text(re.sub(r"^version: .*$", "", chart_yaml.read_text(), flags=re.MULTILINE))
    assert helm.run("lint", "--strict", str(broken), check=False).returncode != 0


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_helm_template_renders_what_render_manifests_renders(helm: Helm, tmp_path: Path, name: str) -> None:
    """The same values through both, as files: the script's layout, file by file, CRDs included."""
    values = _values_file(tmp_path, name, VALUE_SETS[name])
    ours = _render_manifests([values], [], tmp_path / "out")
    theirs = _helm_template(helm, [_values_file(tmp_path, "plain", PLAIN), values], [])
    assert theirs and not _differences(theirs, ours), "\n".join(_differences(theirs, ours))


def test_values_files_and_sets_render_the_same_through_both(helm: Helm, tmp_path: Path) -> None:
    """test_render_values.py's case: -f then --set (later wins), a set list, a key the chart does not have."""
    values = _values_file(tmp_path, "my-values", {
        "image": {"repository": "registry.example.com/elasticgpu", "tag": "from-file"},
        "agent": {"nodeHook": "cri-proxy", "installer": {"nodeSelector": {"elasticgpu.io/agent": None,
                                                                           "pool": "gpu"}}},
        "defaultClass": {"name": "shared-a100"},
    })
    sets = ["image.tag=0.1.0,controller.replicas=1", "controller.leaderElect=false", "image.tga=x"]
    ours = _render_manifests([values], sets, tmp_path / "out")
    theirs = _helm_template(helm, [_values_file(tmp_path, "plain", PLAIN), values], sets)
    assert not _differences(theirs, ours), "\n".join(_differences(theirs, ours))
    # The comparison sees a value: the tag reached both, and one changed --set is a difference.
    assert any("image: registry.example.com/elasticgpu:0.1.0" in doc for doc in ours["controller.yaml"])
    other = _helm_template(helm, [_values_file(tmp_path, "plain", PLAIN), values], [*sets, "webhook.replicas=5"])
    assert [d.split(":")[0] for d in _differences(other, ours)] == ["webhook.yaml"]


def test_the_plain_manifests_of_deploy_are_what_helm_renders(helm: Helm, tmp_path: Path) -> None:
    """deploy/*.yaml and deploy/policies/ (committed, written by render-manifests.py) against helm: the
    defaults plus namespace.create, and agent-installer.yaml from the node hook the defaults did not choose."""
    plain = _values_file(tmp_path, "plain", PLAIN)
    theirs = _helm_template(helm, [plain], [])
    theirs["agent-installer.yaml"] = _helm_template(
        helm, [plain, _values_file(tmp_path, "cri-proxy", CRI_PROXY)], [])["agent-installer.yaml"]
    committed = _folder(DEPLOY)
    # deploy/ keeps the chart's own folder (deploy/chart) and the CRDs beside it (crds/ of the repository).
    committed = {name: docs for name, docs in committed.items() if not name.startswith("chart/")}
    assert {name for name in theirs if name.startswith("crds/")} == {f"crds/{p.name}" for p in CHART.glob("crds/*")}
    theirs = {name: docs for name, docs in theirs.items() if not name.startswith("crds/")}
    assert not _differences(theirs, committed), "\n".join(_differences(theirs, committed))


def test_auto_monitoring_renders_where_helm_is_told_the_operators_kinds_are_served(helm: Helm) -> None:
    """values.yaml's word for "auto": `helm template` renders the PrometheusRule and the ServiceMonitor only
    with --api-versions naming them (helm install asks the cluster), each on its own."""
    auto = ["prometheusRule.enabled=auto,metrics.serviceMonitor.enabled=auto"]

    def kinds(*api_versions: str) -> set[str]:
        rendered = _helm_template(helm, [], auto, extra=[a for v in api_versions for a in ("--api-versions", v)])
        return {line.removeprefix("kind: ") for docs in rendered.values() for doc in docs
                if "apiVersion: monitoring.coreos.com/v1" in doc for line in doc.splitlines()
                if line.startswith("kind: ")}

    assert kinds() == set()
    assert kinds("monitoring.coreos.com/v1/PrometheusRule") == {"PrometheusRule"}
    assert kinds("monitoring.coreos.com/v1/PrometheusRule", "monitoring.coreos.com/v1/ServiceMonitor") == {
        "PrometheusRule", "ServiceMonitor"}


def test_a_value_the_chart_refuses_is_refused_in_the_same_words(helm: Helm, tmp_path: Path) -> None:
    done = helm.run("template", RELEASE, str(CHART), "--set", "webhook.certificates=vault", check=False)
    words = 'webhook.certificates is "vault": use self-signed or cert-manager'
    assert done.returncode != 0 and words in done.stderr, done.stderr
    ours = subprocess.run([sys.executable, str(SCRIPT), "--set", "webhook.certificates=vault", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=REPO, check=False)
    assert ours.returncode == 2 and words in ours.stderr, ours.stderr


def test_helm_package_makes_the_chart_of_elasticgpus_version(helm: Helm, tmp_path: Path) -> None:
    """`helm package`: one archive named for the version, its Chart.yaml at elasticgpu's version and
    appVersion, the linked files (crds/, files/) inside as they are, and it renders as the folder does."""
    done = helm.run("package", str(CHART), "--destination", str(tmp_path))
    version = importlib.metadata.version("elasticgpu")
    assert version == elasticgpu.__version__
    archive = tmp_path / f"elasticgpu-{version}.tgz"
    assert [p.name for p in tmp_path.iterdir()] == [archive.name], done.stdout
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        chart = yaml.safe_load(_read(tar, "elasticgpu/Chart.yaml"))
        crds = {Path(n).name: _read(tar, n) for n in names if n.startswith("elasticgpu/crds/")}
        policies = {Path(n).name: _read(tar, n) for n in names if n.startswith("elasticgpu/files/policies/")}
    assert (chart["name"], chart["version"], chart["appVersion"]) == ("elasticgpu", version, version)
    assert crds == {p.name: p.read_text() for p in (REPO / "crds").glob("*.yaml")}
    assert policies and policies == {p.name: p.read_text() for p in (DEPLOY / "policies").glob("*.yaml")}
    lint = helm.run("lint", "--strict", str(archive), check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    plain = _values_file(tmp_path, "plain", PLAIN)
    assert _helm_template(helm, [plain], [], chart=archive) == _helm_template(helm, [plain], [])


def _read(tar: tarfile.TarFile, name: str) -> str:
    member = tar.extractfile(name)
    assert member is not None, f"{name} is no file in the archive"
    return member.read().decode()
