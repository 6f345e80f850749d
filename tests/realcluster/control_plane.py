"""The real control plane of the tier: elasticgpu/testbed/real_cluster.py (moved there so that
`elasticgpu demo --cluster real` can start it without importing tests/), re-exported under its old
import path; `running_control_plane` starts the components with the tests' spawn (tests/spawning.py).

Manual use: ``python -m tests.realcluster.control_plane`` prints ``export KUBECONFIG=...`` and waits
for Ctrl-C (as ``python -m elasticgpu.testbed.real_cluster``).
"""

from __future__ import annotations

import contextlib
import runpy
from collections.abc import Iterator

from elasticgpu.testbed import real_cluster
from elasticgpu.testbed.real_cluster import (
    ADMIN,
    APISERVER_KUBELET_CLIENT,
    BUILD_SCRIPT,
    COMPONENTS,
    CONTROLLER_MANAGER,
    REPO_ROOT,
    SCHEDULER,
    SERVICE_CIDR,
    SERVICE_IP,
    START_TIMEOUT_S,
    TMP_PREFIX,
    ControlPlane,
    ControlPlaneUnavailable,
    Identity,
    Pki,
    find_etcd,
    find_k8s_binary,
    k8s_cache_dir,
    node_identity,
    start,
    write_kubeconfig,
)
from tests import spawning

__all__ = [
    "ADMIN", "APISERVER_KUBELET_CLIENT", "BUILD_SCRIPT", "COMPONENTS", "CONTROLLER_MANAGER", "REPO_ROOT",
    "SCHEDULER", "SERVICE_CIDR", "SERVICE_IP", "START_TIMEOUT_S", "TMP_PREFIX", "ControlPlane",
    "ControlPlaneUnavailable", "Identity", "Pki", "find_etcd", "find_k8s_binary", "k8s_cache_dir",
    "node_identity", "running_control_plane", "start", "write_kubeconfig",
]  # fmt: skip


@contextlib.contextmanager
def running_control_plane(*, verbosity: str | None = None,
                          placement: real_cluster.Placement | None = None) -> Iterator[ControlPlane]:  # fmt: skip
    """real_cluster.running_control_plane, its components started with tests/spawning.py's spawn."""
    with real_cluster.running_control_plane(verbosity=verbosity, spawn=spawning.spawn, placement=placement) as plane:
        yield plane


if __name__ == "__main__":
    runpy.run_module("elasticgpu.testbed.real_cluster", run_name="__main__")
