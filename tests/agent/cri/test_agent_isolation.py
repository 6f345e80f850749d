"""The agent as a real process offers the isolation modes its node provides (issue 25): with
`--hami-core-library` pointing at a file, its card's GPU object lists HAMiCore; a claim of a HAMiCore
class binds there, and through the agent's proxy its container gets the preloaded library and its
limits. The library gone, the card stops offering the mode."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from elasticgpu.agent.discovery import simulated
from elasticgpu.api import names, pod_claims
from tests.agent.conftest import wait_for
from tests.agent.cri.kubelet import Kubelet, Pod
from tests.agent.cri.test_agent_run import (
    AgentProcess,
    agent_factory,
    create_as_kubelet,
    wait_until_serving,
    world_gpus,
)
from tests.binding import objects as o
from tests.containerd_runtime import TestRuntime, sandbox_config
from tests.pods.claim_world import World, controller_for, kube, settle, world
from tests.pods.conftest import pod_update_policies

__all__ = ["agent_factory", "kube", "pod_update_policies", "world", "world_gpus"]  # fixtures


def offered(world: World, uuid: str) -> list[Any]:
    return list((world.kube.get_gpu(names.gpu_object_name(uuid)).get("status") or {}).get("isolation") or [])


def test_the_agent_offers_hami_core_where_the_library_is_and_its_claims_get_it(
    world: World, world_gpus: list[str], containerd: TestRuntime, proxy_socket: Path, tmp_path: Path,
    agent_factory: Callable[..., AgentProcess],
) -> None:  # fmt: skip
    library = tmp_path / "vgpu/libvgpu.so"
    library.parent.mkdir()
    library.write_text("stand-in for HAMi-core's libvgpu.so\n")
    node, model = world.node(f"{world.prefix}-h"), f"H{world.prefix}"
    uuid = simulated.simulated_uuid(node, 0)
    world_gpus.append(names.gpu_object_name(uuid))
    agent = agent_factory(node, model, "--hami-core-library", str(library), "--isolation-dir",
                          str(tmp_path / "isolation"), "--isolation-idle-grace-s", "0")
    wait_until_serving(world, agent, uuid, proxy_socket)
    wait_for("HAMiCore offered", lambda: offered(world, uuid) == ["HAMiCore"], timeout=30)

    body = o.klass(f"{world.prefix}-hami", parameters={"gpuModel": model})
    body["isolation"] = "HAMiCore"
    world.klass(body)
    world.pod("trainer", inline={"main": f"gpu-core=30,gpu-memory=10Gi,class={world.prefix}-hami"})
    controller = controller_for(world)
    wait_for("the claim bound and the gate lifted", lambda: (settle(controller), names.SCHEDULING_GATE not in [
        g["name"] for g in world.get_pod("trainer")["spec"].get("schedulingGates") or []])[1])  # fmt: skip
    claim = world.get_claim(pod_claims.inline_claim_name("trainer", "main"))
    assert claim["status"]["isolation"] == "HAMiCore"
    pod = world.get_pod("trainer")
    with Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
        config = sandbox_config(name="trainer", namespace=world.namespace, uid=pod["metadata"]["uid"],
                                annotations=pod["metadata"]["annotations"])  # fmt: skip
        sandbox = k.runtime.RunPodSandbox(k.pb.RunPodSandboxRequest(config=config), timeout=30).pod_sandbox_id
        running = Pod(id=sandbox, config=config)
        main = create_as_kubelet(k, running, "main")
        k.start(main)
        env = k.env(main)
        assert (env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_SM_LIMIT_0"]) == ("10240m", "30")
        assert k.exec(main, "cat", "/etc/ld.so.preload") == (0, "/usr/local/vgpu/libvgpu.so\n")
        k.remove_pod(running)
    # The container's cache (a tmpfs) goes with it.
    caches = tmp_path / "isolation/hami-core/cache"
    wait_for("the cache unmounted and removed", lambda: not any(caches.iterdir()), timeout=30)

    library.unlink()  # the admin removed it: the node no longer provides the mode
    wait_for("HAMiCore no longer offered", lambda: offered(world, uuid) == [], timeout=30)
    assert agent.alive()
