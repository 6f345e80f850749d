"""Issue 46 on a real runtime: an agent in NRI mode on a node where a GPU device plugin is live changes
nothing there. It stays up and ready, registers no NRI plugin, so containerd creates a container whose
image says NVIDIA_VISIBLE_DEVICES=all untouched (as the device plugin's pods expect), and publishes no GPU;
once the plugin's socket is gone it takes over: its plugin registers, a new container without a claim
gets `void`, its card is published."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from elasticgpu.agent.discovery import simulated
from elasticgpu.api import names
from tests.agent.conftest import wait_for
from tests.agent.cri.kubelet import Kubelet, Pod
from tests.agent.cri.test_agent_run import create_as_kubelet, world_gpus
from tests.agent.nri.test_agent_run_nri import NriAgent, nri_agent
from tests.agent.objects import node_gpus
from tests.containerd_runtime import TestRuntime, sandbox_config
from tests.pods.claim_world import World, kube, world
from tests.pods.conftest import pod_update_policies

__all__ = ["kube", "nri_agent", "pod_update_policies", "world", "world_gpus"]  # fixtures

pytestmark = pytest.mark.timeout(300)


def test_a_live_device_plugin_keeps_the_nri_agent_off_the_node_until_it_is_gone(
    world: World, world_gpus: list[str], nri_containerd: TestRuntime, nri_agent: Callable[[str, str], NriAgent],
) -> None:
    node, model = world.node(f"{world.prefix}-dp"), f"T{world.prefix}"
    world_gpus.append(names.gpu_object_name(simulated.simulated_uuid(node, 0)))
    agent = nri_agent(node, model)
    plugins = Path(f"/tmp/egpu-dp-{uuid.uuid4().hex[:8]}")
    plugins.mkdir()
    device_plugin = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    device_plugin.bind(str(plugins / "nvidia-gpu.sock"))
    device_plugin.listen(4)
    agent.command += ["--device-plugin-dir", str(plugins), "--allocator-check-interval-s", "0.5"]
    try:
        agent.start()
        wait_for("the agent to stand by", lambda: agent.alive() and "another GPU allocator is live here" in agent.log(),
                 timeout=60)  # fmt: skip
        wait_for("/readyz ok while standing by", lambda: agent.failing() == set(), timeout=60)
        config = sandbox_config(name="cuda", namespace=world.namespace, uid=str(uuid.uuid4()))
        with Kubelet(nri_containerd.endpoint, nri_containerd.image) as k:
            sandbox = k.runtime.RunPodSandbox(k.pb.RunPodSandboxRequest(config=config), timeout=30).pod_sandbox_id
            pod = Pod(id=sandbox, config=config)
            before = create_as_kubelet(k, pod, "before", envs={"NVIDIA_VISIBLE_DEVICES": "all"})
            k.start(before)
            assert k.env(before)["NVIDIA_VISIBLE_DEVICES"] == "all", "created untouched, as the device plugin expects"
            assert node_gpus(world.core.api_client, node) == {} and agent.alive()

            device_plugin.close()
            (plugins / "nvidia-gpu.sock").unlink()
            wait_for("the take-over", lambda: "taking over its GPUs" in agent.log(), timeout=60)
            wait_for("/readyz ok with the NRI plugin registered", lambda: agent.failing() == set(), timeout=60)
            wait_for("the card published", lambda: len(node_gpus(world.core.api_client, node)) == 1, timeout=60)
            after = create_as_kubelet(k, pod, "after", envs={"NVIDIA_VISIBLE_DEVICES": "all"})
            k.start(after)
            assert k.env(after)["NVIDIA_VISIBLE_DEVICES"] == "void"
            assert k.env(before)["NVIDIA_VISIBLE_DEVICES"] == "all", "a running container is never touched"
            k.remove_pod(pod)
    finally:
        device_plugin.close()
        for entry in plugins.iterdir():
            entry.unlink()
        plugins.rmdir()
