"""Issue 46: the agent takes no node's GPUs while another GPU allocator is live there.

The signs, on real things: unix sockets in a device-plugin folder (a listener is live, a file left
behind is not), the Node's allocatable on the local API server, the container toolkit's config file;
then the agent itself (a subprocess, simulated cards) standing by and taking over.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from elasticgpu.agent import node_checks
from elasticgpu.api import node_handover
from tests.agent.conftest import RunningAgent, wait_for
from tests.agent.objects import DESCRIPTION, condition, node_gpus


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    # Short: a unix socket path must fit 107 bytes. A fresh folder, not one named after the test:
    # the same test in another session on the machine (or a killed run's leftover socket) shared
    # the name, and binding its socket failed with "Address already in use".
    folder = Path(tempfile.mkdtemp(prefix="egpu-dp-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _listen(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)
    return server


def test_only_a_listening_gpu_plugin_socket_is_live(plugin_dir: Path) -> None:
    kubelet = _listen(plugin_dir / "kubelet.sock")
    nvidia = _listen(plugin_dir / "nvidia-gpu.sock")
    rdma = _listen(plugin_dir / "rdma-shared.sock")
    stale = _listen(plugin_dir / "nvidia-mig-1g.10gb.sock")
    stale.close()  # its file stays: a plugin that ended
    (plugin_dir / "hami.sock").write_text("")  # not a socket at all
    try:
        live = node_checks.live_device_plugin_sockets(plugin_dir)
        assert live == ["kubelet.sock", "nvidia-gpu.sock", "rdma-shared.sock"]
        found = node_handover.from_sockets(live)
        assert [s.what for s in found] == [f"device plugin socket {node_handover.DEVICE_PLUGIN_DIR}/nvidia-gpu.sock"]
    finally:
        for server in (kubelet, nvidia, rdma):
            server.close()
    assert node_checks.live_device_plugin_sockets(plugin_dir / "missing") == []


@pytest.mark.parametrize(("allocatable", "expected"), [
    ({"nvidia.com/gpu": "8", "cpu": "16"}, ["nvidia.com/gpu: 8 allocatable"]),
    ({"nvidia.com/gpu": "0"}, []),  # kubelet's answer once the plugin is gone (its capacity stays a while)
    ({"nvidia.com/gpu.shared": "32"}, ["nvidia.com/gpu.shared: 32 allocatable"]),
    ({"nvidia.com/mig-1g.10gb": "7"}, ["nvidia.com/mig-1g.10gb: 7 allocatable"]),
    ({"nvidia.com/gpumem": "81920", "nvidia.com/gpucores": "100"},
     ["nvidia.com/gpucores: 100 allocatable", "nvidia.com/gpumem: 81920 allocatable"]),
    ({"nvidia.com/hostdev": "4", "rdma/hca": "1"}, []),  # NICs of the network operator: no GPU
])
def test_the_nodes_allocatable_names_the_gpu_plugins(allocatable: dict[str, str], expected: list[str]) -> None:
    found = node_handover.from_node({"status": {"allocatable": allocatable}})
    assert [s.what for s in found] == expected
    assert [s.hami for s in found] == ["nvidia.com/gpumem" in allocatable] * len(found)


@pytest.mark.parametrize(("text", "exposed"), [
    ("accept-nvidia-visible-devices-envvar-when-unprivileged = false\n", False),
    ("accept-nvidia-visible-devices-envvar-when-unprivileged = true\n", True),
    ("#accept-nvidia-visible-devices-envvar-when-unprivileged = false\n[nvidia-container-cli]\nload-kmods = true\n",
     True),  # commented out: the toolkit's default, true
    ("not = [toml", None),
])
def test_the_toolkit_setting_is_read_from_its_config(tmp_path: Path, text: str, exposed: bool | None) -> None:
    config = tmp_path / "etc/nvidia-container-runtime/config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(text)
    operator = "/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml"
    answer = node_checks.toolkit_exposure(str(tmp_path), f"/etc/nvidia-container-runtime/config.toml,{operator}")
    assert answer.exposed is exposed, answer
    assert answer.config == "/etc/nvidia-container-runtime/config.toml"
    # The GPU Operator's toolkit writes its own file; the first that exists answers.
    config.unlink()
    assert node_checks.toolkit_exposure(str(tmp_path), f"/etc/x.toml,{operator}").exposed is None
    (tmp_path / operator.lstrip("/")).parent.mkdir(parents=True)
    (tmp_path / operator.lstrip("/")).write_text("accept-nvidia-visible-devices-envvar-when-unprivileged = false\n")
    assert node_checks.toolkit_exposure(str(tmp_path), f"/etc/x.toml,{operator}").exposed is False


def _offer(api_client: client.ApiClient, node: str, count: str) -> None:
    """The Node's status as kubelet writes it for a device plugin's nvidia.com/gpu."""
    client.CoreV1Api(api_client).patch_node_status(node, {"status": {
        "capacity": {"nvidia.com/gpu": "2", "cpu": "8"}, "allocatable": {"nvidia.com/gpu": count, "cpu": "8"}}})


def _node_events(api_client: client.ApiClient, node: str, reason: str) -> list[Any]:
    events = client.CoreV1Api(api_client).list_namespaced_event("default").items
    return [e for e in events if e.involved_object.kind == "Node" and e.involved_object.name == node
            and e.reason == reason]


def _start(start_agent: Callable[..., RunningAgent], node: str, plugin_dir: Path, *extra: str) -> RunningAgent:
    return start_agent(node, DESCRIPTION, "--device-plugin-dir", str(plugin_dir),
                       "--allocator-check-interval-s", "0.5", "--toolkit-configs", str(plugin_dir / "none.toml"),
                       *extra)  # fmt: skip


def test_the_agent_stands_by_while_the_node_offers_nvidia_gpu_and_takes_over_when_it_is_gone(
    api_client: client.ApiClient, node_name: str, start_agent: Callable[..., RunningAgent], plugin_dir: Path
) -> None:
    _offer(api_client, node_name, "2")
    agent = _start(start_agent, node_name, plugin_dir)
    events = wait_for("the Warning Event on the Node",
                      lambda: _node_events(api_client, node_name, node_handover.EVENT_ALLOCATOR_LIVE), timeout=60)
    assert events[0].type == "Warning"
    assert "nvidia.com/gpu: 2 allocatable" in events[0].message
    assert f"kubectl egpu handover {node_name} --to elasticgpu" in events[0].message
    time.sleep(3)  # several checks and rediscoveries later: still nothing of ours on the node
    assert agent.process.poll() is None, agent.log()  # up, not a crash loop
    assert node_gpus(api_client, node_name) == {}
    labels = client.CoreV1Api(api_client).read_node(node_name).metadata.labels or {}
    assert not [k for k in labels if k.startswith("nvidia.com/gpu.")], labels
    assert agent.log().count("another GPU allocator is live here") == 1, "said once, not at every check"

    _offer(api_client, node_name, "0")  # the plugin went: kubelet keeps the capacity, allocatable drops to 0
    gpus = wait_for("both GPU objects", lambda: len(node_gpus(api_client, node_name)) == 2
                    and node_gpus(api_client, node_name), timeout=60)
    for gpu in gpus.values():
        conflict = wait_for("the conflict condition", lambda g=gpu: condition(
            node_gpus(api_client, node_name)[g["metadata"]["name"]], node_handover.CONDITION_ALLOCATOR_CONFLICT))
        assert conflict["status"] == "False"
    assert _node_events(api_client, node_name, node_handover.EVENT_TAKING_OVER)


def test_a_live_device_plugin_socket_holds_the_agent_and_the_override_takes_over_beside_it(
    api_client: client.ApiClient, node_name: str, start_agent: Callable[..., RunningAgent], plugin_dir: Path
) -> None:
    server = _listen(plugin_dir / "nvidia-gpu.sock")
    try:
        agent = _start(start_agent, node_name, plugin_dir)
        wait_for("the agent to say it stands by", lambda: "another GPU allocator is live here" in agent.log(),
                 timeout=60)
        assert "nvidia-gpu.sock" in agent.log()
        time.sleep(2)
        assert node_gpus(api_client, node_name) == {} and agent.process.poll() is None
        agent.process.terminate()
        agent.process.wait(timeout=30)

        # The override, for a migration: the agent takes over beside the plugin and says so on each card.
        ignoring = _start(start_agent, node_name, plugin_dir, "--other-allocators", "ignore")

        def conflicts() -> list[dict[str, Any]] | None:
            assert ignoring.process.poll() is None, ignoring.log()
            gpus = node_gpus(api_client, node_name)
            found = [condition(g, node_handover.CONDITION_ALLOCATOR_CONFLICT) for g in gpus.values()]
            return found if len(found) == 2 and all(c and c["status"] == "True" for c in found) else None

        found = wait_for("GpuAllocatorConflict=True on both cards", conflicts, timeout=60)
        assert "nvidia-gpu.sock" in found[0]["message"]
    finally:
        server.close()


def test_a_mode_that_does_not_exist_is_refused_by_name(
    node_name: str, start_agent: Callable[..., RunningAgent], plugin_dir: Path
) -> None:
    agent = _start(start_agent, node_name, plugin_dir, "--other-allocators", "sometimes")
    assert agent.process.wait(timeout=60) == 2
    assert "ELASTICGPU_AGENT_OTHER_ALLOCATORS='sometimes' is not a mode; use one of wait, ignore" in agent.log()
