"""Kubernetes' own kubelet for the tier: elasticgpu/testbed/kubelet.py (moved there so that the demo's box
can start it without importing tests/), re-exported under its old import path."""

from __future__ import annotations

from elasticgpu.testbed.kubelet import (
    CGROUP_MOUNT,
    CGROUP_REMOVE_TIMEOUT_S,
    HOST_NETWORK_ONLY,
    START_TIMEOUT_S,
    Kubelet,
    give_network_config,
    kubelet_config,
    make_cgroup_root,
    remove_cgroup_root,
    running_kubelet,
    start,
)

__all__ = [
    "CGROUP_MOUNT", "CGROUP_REMOVE_TIMEOUT_S", "HOST_NETWORK_ONLY", "START_TIMEOUT_S", "Kubelet",
    "give_network_config", "kubelet_config", "make_cgroup_root", "remove_cgroup_root", "running_kubelet", "start",
]  # fmt: skip
