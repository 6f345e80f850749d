"""The real helm for the tests (issue 35): elasticgpu/testbed/helm.py (the demo installs the chart with it,
and the product never imports tests/), re-exported under its old import path, and `helm_or_skip()`,
what a test calls: the binary, or a skip that names testhelm/build.sh and its reason."""

from __future__ import annotations

import pytest

from elasticgpu.testbed.helm import (
    BIN_ENV,
    BUILD,
    BUILD_TIMEOUT_S,
    GO_MOD,
    MODULE,
    REPO,
    UNAVAILABLE_ENV,
    Helm,
    HelmFailed,
    find_helm,
    pinned_version,
)

__all__ = [
    "BIN_ENV", "BUILD", "BUILD_TIMEOUT_S", "GO_MOD", "MODULE", "REPO", "UNAVAILABLE_ENV", "Helm", "HelmFailed",
    "find_helm", "helm_or_skip", "pinned_version",
]  # fmt: skip


def helm_or_skip() -> Helm:
    """The real helm, or a skip naming testhelm/build.sh and why it gave none."""
    found = find_helm()
    if isinstance(found, str):
        pytest.skip(f"no helm binary: {found}")
    return found
