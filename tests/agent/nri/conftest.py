"""Fixtures of the NRI tests: a real containerd with NRI on (1.7, where the config switches it on, and
2.x, where it is on by default: every test runs on both), and the agent's NRI plugin.

The plugin is nri-plugin/build.sh's (cached); scripts/test.sh builds it and, when that fails with
nothing cached, sets ELASTICGPU_NRI_PLUGIN_UNAVAILABLE so that these tests skip with its reason.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from elasticgpu.testbed.local_cluster import read_env_file
from elasticgpu.testbed.local_runtime import cache_dir
from tests.containerd_runtime import (
    CONTAINERD_VERSIONS,
    REPO_ROOT,
    RuntimeUnavailable,
    TestRuntime,
    remove_all_pods,
    running_containerd,
)

PLUGIN_UNAVAILABLE_ENV = "ELASTICGPU_NRI_PLUGIN_UNAVAILABLE"
"""Set by scripts/test.sh to the reason when nri-plugin/build.sh failed with nothing cached."""


BINARY_ENV = "ELASTICGPU_NRI_PLUGIN_BIN"
"""A plugin binary to test instead of the cached build (another version of main.go, built by hand)."""


def plugin_binary() -> str:
    """$ELASTICGPU_NRI_PLUGIN_BIN, or the cached build (nri-plugin/build.sh, run once here when none is)."""
    if named := os.environ.get(BINARY_ENV):
        return named
    env_file = cache_dir().parent / "nriplugin" / "current.env"
    values = read_env_file(env_file) if env_file.exists() else {}
    if not Path(values.get("ELASTICGPU_NRI_PLUGIN_BIN", "")).is_file():
        built = subprocess.run(["bash", str(REPO_ROOT / "nri-plugin" / "build.sh")], capture_output=True, timeout=600)
        if built.returncode != 0:
            raise RuntimeUnavailable(f"nri-plugin/build.sh failed: {built.stderr.decode(errors='replace')[-400:]}")
        values = read_env_file(env_file)
    return values["ELASTICGPU_NRI_PLUGIN_BIN"]


@pytest.fixture(scope="session")
def nri_plugin() -> str:
    """The plugin's binary (skips with the reason when it cannot be had)."""
    if reason := os.environ.get(PLUGIN_UNAVAILABLE_ENV):
        pytest.skip(f"no NRI plugin: {reason}")
    try:
        return plugin_binary()
    except RuntimeUnavailable as e:
        pytest.skip(f"no NRI plugin: {e}")


@pytest.fixture(scope="session", params=CONTAINERD_VERSIONS, ids=[f"containerd{v}" for v in CONTAINERD_VERSIONS])
def nri_containerd_session(request: pytest.FixtureRequest) -> Iterator[TestRuntime]:
    """A private containerd with NRI on, for the whole session, once per containerd version (skips with
    the reason if that one cannot run: not built, ELASTICGPU_TESTRUNTIME[2]_UNAVAILABLE, not root)."""
    version: str = request.param
    with contextlib.ExitStack() as stack:
        try:
            runtime = stack.enter_context(running_containerd(nri=True, containerd=version))
        except RuntimeUnavailable as e:
            pytest.skip(f"no test container runtime (containerd {version}): {e}")
        yield runtime


@pytest.fixture
def nri_containerd(nri_containerd_session: TestRuntime) -> Iterator[TestRuntime]:
    """The session's NRI containerd, emptied of pods and CDI specs after the test."""
    yield nri_containerd_session
    remove_all_pods(nri_containerd_session)
    for spec in nri_containerd_session.cdi_dir.iterdir():
        spec.unlink()
