"""The artifact, not the source tree: the wheel that `deploy/Containerfile` installs, installed
outside the repository, runs what the manifests and the README run. A file the package needs at
run time but does not ship (the Alembic migrations, the CRI proto, a template) fails here, where
every other test would still find it in the checkout."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "deploy" / "Containerfile"


@dataclass(frozen=True)
class Built:
    wheel: Path
    site: Path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    """The project's wheel, built from the checkout and installed (without its dependencies,
    which the test's environment has) into a folder of its own."""
    work = tmp_path_factory.mktemp("package")
    wheels, target = work / "wheels", work / "site"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(wheels), str(ROOT)], check=True, cwd=work, timeout=300)
    wheel = next(wheels.glob("elasticgpu-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                    str(wheel)], check=True, cwd=work, timeout=300)
    yield Built(wheel, target)


@pytest.fixture
def installed(built: Built) -> Path:
    return built.site


def _run(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`elasticgpu ARGS` from the installed copy (first on the path: the checkout is not used)."""
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONSAFEPATH": "1"}
    code = ("import sys, elasticgpu, elasticgpu.cli; "
            f"assert elasticgpu.__file__.startswith({str(site)!r}), elasticgpu.__file__; "
            "sys.exit(elasticgpu.cli.main(sys.argv[1:]))")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_installed_cli_prints_the_crds_the_repository_holds(installed: Path, tmp_path: Path) -> None:
    out = tmp_path / "crds"
    result = _run(installed, "crds", "--write", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    written = {p.name: yaml.safe_load(p.read_text()) for p in out.glob("*.yaml")}
    kept = {p.name: yaml.safe_load(p.read_text()) for p in (ROOT / "crds").glob("*.yaml")}
    assert written and written == kept


def test_the_installed_agent_migrates_its_ledger(installed: Path, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade = _run(installed, "agent", "db", "upgrade", "--ledger-url", url, cwd=tmp_path)
    assert upgrade.returncode == 0, upgrade.stderr
    history = _run(installed, "agent", "db", "history", "--ledger-url", url, cwd=tmp_path)
    current = _run(installed, "agent", "db", "current", "--ledger-url", url, cwd=tmp_path)
    assert current.returncode == 0, current.stderr
    revisions = sorted(p.stem.split("_")[0] for p in (ROOT / "migrations" / "versions").glob("[0-9]*.py"))
    assert revisions and revisions[-1] in current.stdout, (current.stdout, history.stdout)


def test_the_installed_package_ships_the_cri_proto_and_the_migrations(installed: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(installed), "PYTHONSAFEPATH": "1"}
    code = ("import elasticgpu.agent.cri.api as api; "
            f"assert api.__file__.startswith({str(installed)!r}), api.__file__; "
            "print(api.pb.CreateContainerRequest.DESCRIPTOR.full_name)")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "runtime.v1.CreateContainerRequest"
    shipped = {p.name for p in (installed / "elasticgpu/agent/ledger/migrations/versions").glob("*.py")}
    assert shipped == {p.name for p in (ROOT / "migrations/versions").glob("*.py")}


def test_the_containerfile_builds_from_what_the_repository_has(built: Built) -> None:
    """No container engine runs here: check that every path it copies exists, that it runs as
    the manifests' user, and that its entry point is the console script the package declares."""
    text = CONTAINERFILE.read_text()
    copies = re.findall(r"^COPY (?!--from)(.+)$", text, flags=re.MULTILINE)
    sources = [word for line in copies for word in line.split()[:-1]]
    assert sources and all((ROOT / s).exists() for s in sources), sources
    with zipfile.ZipFile(built.wheel) as wheel:
        entry_points = next(n for n in wheel.namelist() if n.endswith("entry_points.txt"))
        assert "elasticgpu = elasticgpu.cli:main" in wheel.read(entry_points).decode()
    assert 'ENTRYPOINT ["elasticgpu"]' in text
    users = {doc["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
             for path in (ROOT / "deploy").glob("*.yaml") for doc in yaml.safe_load_all(path.read_text())
             if doc and doc.get("kind") == "Deployment"}
    assert users and all(f"USER {u}:{u}" in text for u in users), users
    image = {c["image"] for path in (ROOT / "deploy").glob("*.yaml") for doc in yaml.safe_load_all(path.read_text())
             if doc and doc.get("kind") == "Deployment" for c in doc["spec"]["template"]["spec"]["containers"]}
    assert all(f"-t {i} ." in text for i in image), image

