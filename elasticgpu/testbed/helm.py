"""The real helm (issue 35): helm.sh/helm/v4 itself, built from the Go module proxy at the version
testhelm/go.mod pins by testhelm/build.sh (cached under ~/.cache/elasticgpu/testhelm); what
`elasticgpu demo --cluster real --install chart` installs the chart with, and the tests' helm
(tests/helm_binary.py re-exports this module and adds `helm_or_skip`).

`find_helm()` gives the binary, or why there is none: scripts/test.sh built it already and exported
ELASTICGPU_HELM_BIN (or ELASTICGPU_HELM_UNAVAILABLE, the reason, when the build failed with nothing
cached); otherwise the build script runs here once per process (a no-op when its build is cached).

Every run gets helm folders of its own (config, cache, data under one temporary folder): nothing
is read from or written to the user's ~/.config/helm, and no repository the user added is used.
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "testhelm" / "build.sh"
GO_MOD = REPO / "testhelm" / "go.mod"
MODULE = "helm.sh/helm/v4"
BIN_ENV = "ELASTICGPU_HELM_BIN"
UNAVAILABLE_ENV = "ELASTICGPU_HELM_UNAVAILABLE"
"""Set by scripts/test.sh to the reason when testhelm/build.sh failed with nothing cached."""
BUILD_TIMEOUT_S = 840
"""A cold build is about 5 minutes of compiling plus 2 of downloading on 2 shared cores
(testhelm/README.md); below pytest's 900 s per test, so a stuck download fails as a skip, not a hang."""


class HelmFailed(RuntimeError):
    """helm exited non-zero where the caller asked for `check`: its command and its own stderr."""


def pinned_version() -> str:
    """The helm version testhelm/go.mod requires (e.g. v4.3.2): what the binary must say it is."""
    found = re.search(rf"^\s*(?:require\s+)?{re.escape(MODULE)}\s+(v\S+)", GO_MOD.read_text(), re.MULTILINE)
    assert found, f"{GO_MOD} requires no {MODULE}"
    return found.group(1)


@dataclass(frozen=True)
class Helm:
    """One helm binary; `run` calls it with helm folders of its own."""

    path: Path
    home: Path
    """Root of HELM_CONFIG_HOME, HELM_CACHE_HOME and HELM_DATA_HOME for every run."""

    def run(
        self,
        *args: str,
        stdin: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 120,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """`helm ARGS`; with `check`, a non-zero exit fails with helm's own stderr."""
        own = {
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        done = subprocess.run(
            [str(self.path), *args], input=stdin, capture_output=True, text=True, timeout=timeout,
            env={**os.environ, **own, **(env or {})}, check=False,
        )
        if check and done.returncode != 0:
            raise HelmFailed(f"helm {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
        return done

    def version(self) -> str:
        """What the binary says it is (`helm version`'s Version: v4.3.2)."""
        return self.run("version", "--template", "{{.Version}}").stdout.strip()


def _built() -> Path | str:
    """The binary testhelm/build.sh names (building it when nothing is cached), or why there is none."""
    try:
        done = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                              check=False)
    except subprocess.TimeoutExpired:
        return f"bash testhelm/build.sh ran past {BUILD_TIMEOUT_S}s (a cold build: run it on its own first)"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"bash testhelm/build.sh could not build helm and none is cached: {last}"
    found = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    return Path(found[BIN_ENV])


@functools.cache
def find_helm() -> Helm | str:
    """The real helm, or the reason there is none (a test skips with it, the demo says it)."""
    if reason := os.environ.get(UNAVAILABLE_ENV):  # scripts/test.sh tried already, and said why
        return reason
    path: Path | str = Path(os.environ[BIN_ENV]) if os.environ.get(BIN_ENV) else _built()
    if isinstance(path, str):
        return path
    if not os.access(path, os.X_OK):
        return f"{BIN_ENV}={path} is no executable file (run bash testhelm/build.sh)"
    # One folder for the session, never the user's; removed when the session's process ends.
    home = Path(tempfile.mkdtemp(prefix="elasticgpu-helm-"))
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    return Helm(path=path, home=home)
