"""`elasticgpu demo --cluster real`: the demo starts Kubernetes' own control plane
(elasticgpu/testbed/real_cluster.py) and runs on it; without the binary it says which command builds it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from elasticgpu.testbed import real_cluster

DEMO_TIMEOUT_S = 420


def _demo(*flags: str, env: dict[str, str] | None = None, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "elasticgpu", "demo", *flags], capture_output=True, text=True,
                          timeout=timeout_s, env={**os.environ, **(env or {})})  # fmt: skip


def test_without_the_binary_the_demo_names_the_build_command(tmp_path: Path) -> None:
    done = _demo("--cluster", "real", env={"ELASTICGPU_K8S_BIN": str(tmp_path / "missing"),
                                           "ELASTICGPU_CACHE": str(tmp_path / "cache")})  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "bash testcluster/build.sh" in done.stdout, done.stdout


def test_a_kubeconfig_and_the_real_cluster_are_refused_together(tmp_path: Path) -> None:
    done = _demo("--cluster", "real", "--kubeconfig", str(tmp_path / "kubeconfig"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--cluster real" in done.stderr


@pytest.mark.realcluster
def test_the_demo_runs_on_the_real_control_plane() -> None:
    try:
        real_cluster.find_k8s_binary()
        real_cluster.find_etcd()
    except real_cluster.ControlPlaneUnavailable as e:
        pytest.skip(str(e))
    done = _demo("--cluster", "real", timeout_s=DEMO_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "Kubernetes' own control plane" in done.stdout
    assert "every claim reached its container" in done.stdout or "injection decision" in done.stdout, done.stdout
