"""A HAMiCore container's cache folder is a tmpfs of a fixed size (issue 44's audit: a host path the agent
mounts writable into a tenant's container must not grow without bound): kubelet (our CRI client) -> proxy with
claim hooks -> real containerd. Before, the folder lay on the node's disk under the agent's state folder, and a
container could fill that disk."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from elasticgpu.agent.isolation import hami_core
from tests.agent.cri.isolation_node import mounts_under, wait_until
from tests.agent.cri.test_isolation import Node, make_node, run, sh
from tests.containerd_runtime import TestRuntime


@pytest.fixture
def node(containerd: TestRuntime, proxy_socket: Path, tmp_path: Path) -> Iterator[Node]:
    yield from make_node(containerd, proxy_socket, tmp_path)


def test_a_hami_core_cache_is_a_bounded_tmpfs_removed_with_its_container(node: Node) -> None:
    container = run(node, "trainer", "train", mode="HAMiCore")
    (cache,) = (node.isolation.state / "hami-core/cache").iterdir()
    assert mounts_under(cache) == [str(cache)], "the cache folder is no mount of its own: it lies on the node's disk"
    stat = os.statvfs(cache)
    assert stat.f_blocks * stat.f_frsize == hami_core.CACHE_SIZE_MIB * 2**20
    # The container fills it: it stops at the size, and HAMi-core's file there still works.
    code, _ = sh(node, container, f"dd if=/dev/zero of=/tmp/vgpu/fill bs=1M count={hami_core.CACHE_SIZE_MIB + 4}")
    assert code != 0
    assert sh(node, container, "rm /tmp/vgpu/fill && echo ok > /tmp/vgpu/vgpu.cache && cat /tmp/vgpu/vgpu.cache") == (
        0, "ok\n")
    # Gone with its container.
    node.kubelet.remove_container(container)
    node.hooks.flush()
    wait_until("the cache unmounted and removed", lambda: not cache.exists())
    assert mounts_under(cache) == []
