"""A key the agent sets, named by the image's ENV and the pod's env too, on the CRI proxy's path, real containerd.

The runtime builds a container's environment from the image's ENV, then the CRI config's envs (the pod's, after
the proxy's changes); a process's getenv (CUDA's, HAMi-core's, MPS's) takes the first entry of a key, the NVIDIA
hook the last. So for every key the agent sets (the card list, the MPS pipe folder and limits, HAMi-core's
limits), every entry of the container's spec must be the agent's value: a tenant's image or pod env that names it
too (an MPS client at 100% instead of its 30%, its own pipe folder) never wins, in either reading."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.agent.cri.images import import_variant
from tests.agent.cri.kubelet import Kubelet
from tests.agent.cri.node import CARDS, slice_claim
from tests.agent.cri.test_isolation import NS, Node, make_node, uses
from tests.containerd_runtime import TestRuntime

TENANT = {
    "NVIDIA_VISIBLE_DEVICES": "all",
    "CUDA_MPS_PIPE_DIRECTORY": "/tmp/tenant-mps",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=81920M",
    "CUDA_DEVICE_MEMORY_LIMIT_0": "81920m",
    "CUDA_DEVICE_SM_LIMIT": "100",
    "CUDA_DEVICE_SM_LIMIT_0": "100",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/tmp/tenant.cache",
}
"""What a tenant's image and pod both say (the pod's values differ by a suffix, to tell them apart)."""

AGENT = {
    "MPS": {"NVIDIA_VISIBLE_DEVICES": CARDS[0].uuid, "CUDA_MPS_PIPE_DIRECTORY": "/run/nvidia-mps",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10240M"},
    "HAMiCore": {"NVIDIA_VISIBLE_DEVICES": CARDS[0].uuid, "CUDA_DEVICE_MEMORY_LIMIT_0": "10240m",
                 "CUDA_DEVICE_SM_LIMIT": "30", "CUDA_DEVICE_SM_LIMIT_0": "30",
                 "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/tmp/vgpu/vgpu.cache"},
    "None": {"NVIDIA_VISIBLE_DEVICES": CARDS[0].uuid, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
             "CUDA_DEVICE_MEMORY_LIMIT_0": "10240m"},
}
"""Keys the agent sets for a slice of 30% and 10 GiB of the first card, per mode, with its values."""


@pytest.fixture
def node(containerd: TestRuntime, proxy_socket: Path, tmp_path: Path) -> Iterator[Node]:
    yield from make_node(containerd, proxy_socket, tmp_path)


def spec_env(kubelet: Kubelet, container_id: str) -> list[tuple[str, str]]:
    """The container's OCI spec env, in order."""
    status = kubelet.runtime.ContainerStatus(
        kubelet.pb.ContainerStatusRequest(container_id=container_id, verbose=True), timeout=10)
    env: list[str] = json.loads(status.info["info"])["runtimeSpec"]["process"]["env"]
    return [(entry.split("=", 1)[0], entry.split("=", 1)[1]) for entry in env]


def _first(env: list[tuple[str, str]], key: str) -> list[str]:
    return [v for k, v in env if k == key]


@pytest.mark.parametrize("mode", sorted(AGENT))
def test_an_image_that_sets_a_key_the_agent_sets_is_refused(node: Node, containerd: TestRuntime, mode: str) -> None:
    """Before, the image's entry came first: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 (the image's) for a 30% slice."""
    image = import_variant(containerd, name="elasticgpu.local/busybox-tenant-env:test", env=TENANT)
    claim = f"c-{mode.lower()}"
    node.view.add(slice_claim(NS, claim, user=f"pod-{mode.lower()}", isolation=mode))
    pod = node.kubelet.run_pod(f"pod-{mode.lower()}", NS, annotations=uses(claim))
    with pytest.raises(grpc.RpcError) as refused:
        node.kubelet.create_container(pod, "main", image=image, envs={k: f"{v}-pod" for k, v in TENANT.items()})
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = refused.value.details() or ""
    limit_keys = [k for k in AGENT[mode] if k != "NVIDIA_VISIBLE_DEVICES"]
    for key in limit_keys:
        assert f"{key}={TENANT[key]} (the agent's {AGENT[mode][key]})" in details, details
    assert "use an image that does not set these variables" in details
    assert node.kubelet.container_ids() == set()  # the runtime's container was removed again


@pytest.mark.parametrize("mode", sorted(AGENT))
def test_the_agent_s_value_is_the_entry_each_reader_takes(node: Node, containerd: TestRuntime, mode: str) -> None:
    """A CUDA image (NVIDIA_VISIBLE_DEVICES=all in its ENV) and a pod env that names every key: getenv reads the
    first entry of a limit key, the NVIDIA hook the last of NVIDIA_VISIBLE_DEVICES; both are the agent's."""
    image = import_variant(containerd)
    claim = f"c-{mode.lower()}"
    node.view.add(slice_claim(NS, claim, user=f"pod-{mode.lower()}", isolation=mode))
    pod = node.kubelet.run_pod(f"pod-{mode.lower()}", NS, annotations=uses(claim))
    container_id = node.kubelet.create_container(pod, "main", image=image, envs=TENANT)
    env = spec_env(node.kubelet, container_id)
    for key, value in AGENT[mode].items():
        entries = _first(env, key)
        read = entries[-1] if key == "NVIDIA_VISIBLE_DEVICES" else entries[0]
        assert read == value, f"{mode}: {key} entries {entries}, the agent's {value!r}"
        assert TENANT[key] not in entries[1:] if key == "NVIDIA_VISIBLE_DEVICES" else TENANT[key] not in entries
    node.kubelet.start(container_id)
    seen = node.kubelet.env(container_id)
    assert {k: seen.get(k) for k in AGENT[mode]} == AGENT[mode]
