"""The agent as a real process carves MIG instances for MIG claims (issue 26): the simulated backend
describes an A100-80GB in MIG mode; claims of a `partitioning: MIG` class bind there, and through the
agent's proxy (real containerd with CDI) a claim's container gets its instance's device and
NVIDIA_VISIBLE_DEVICES=<MIG uuid>, the instance created on the card (the simulated card keeps its
instances in `<device dir>/mig-instances.json`, as a real card keeps them across agent restarts).
Removing the last holder destroys the instance; after a kill -9 of the agent, a restart converges:
the instance whose container went meanwhile is destroyed, the one a running container holds is kept."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

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


def instances(containerd: TestRuntime, uuid: str) -> dict[tuple[str, int], str]:
    """The simulated card's MIG instances, (profile, start) -> MIG uuid (what NVML would list)."""
    state = containerd.directory / "simdev" / "mig-instances.json"
    held = json.loads(state.read_text()).get(uuid, []) if state.exists() else []
    return {(str(i["profile"]), int(i["start"])): str(i["uuid"]) for i in held}


def partition(world: World, pod: str) -> tuple[str, int]:
    status = world.get_claim(pod_claims.inline_claim_name(pod, "main"))["status"]
    return str(status["partition"]["profile"]), int(status["partition"].get("start") or 0)


def two_mig_pods(world: World, world_gpus: list[str], proxy_socket: Path,
                 agent_factory: Callable[..., AgentProcess]) -> tuple[AgentProcess, str]:
    """An agent serving one simulated A100-80GB in MIG mode, a `partitioning: MIG` class on it, and
    two pods ("kept", "gone") whose inline claims (30% cores, 10 GiB) are bound and gates lifted:
    the agent and the card's uuid."""
    node = world.node(f"{world.prefix}-mig")
    model = f"NVIDIA A100-SXM4-80GB-{world.prefix}"  # unique per test, still an A100-80GB to the MIG tables
    uuid = simulated.simulated_uuid(node, 0)
    world_gpus.append(names.gpu_object_name(uuid))
    agent = agent_factory(node, model, card={"mig": True})
    wait_until_serving(world, agent, uuid, proxy_socket)
    wait_for("the card published in MIG mode",
             lambda: world.kube.get_gpu(names.gpu_object_name(uuid))["spec"].get("mig") is True, timeout=30)
    body = o.klass(f"{world.prefix}-mig", parameters={"gpuModel": model})
    body["partitioning"] = "MIG"
    world.klass(body)
    for pod in ("kept", "gone"):
        world.pod(pod, inline={"main": f"gpu-core=30,gpu-memory=10Gi,class={world.prefix}-mig"})
    controller = controller_for(world)

    def gated(pod: str) -> bool:
        return names.SCHEDULING_GATE in [g["name"] for g in world.get_pod(pod)["spec"].get("schedulingGates") or []]

    wait_for("the claims bound and the gates lifted",
             lambda: (settle(controller), not gated("kept") and not gated("gone"))[1])  # fmt: skip
    return agent, uuid


def run_pod(k: Kubelet, world: World, name: str) -> tuple[Pod, str]:
    """The pod's sandbox and its started container `main`, as kubelet makes them."""
    pod = world.get_pod(name)
    config = sandbox_config(name=name, namespace=world.namespace, uid=pod["metadata"]["uid"],
                            annotations=pod["metadata"]["annotations"])  # fmt: skip
    sandbox = k.runtime.RunPodSandbox(k.pb.RunPodSandboxRequest(config=config), timeout=30).pod_sandbox_id
    running = Pod(id=sandbox, config=config)
    main = create_as_kubelet(k, running, "main")
    k.start(main)
    return running, main


def test_the_agent_gives_mig_claims_their_instance_and_converges_after_a_kill(
    world: World, world_gpus: list[str], containerd: TestRuntime, proxy_socket: Path, tmp_path: Path,
    agent_factory: Callable[..., AgentProcess],
) -> None:  # fmt: skip
    agent, uuid = two_mig_pods(world, world_gpus, proxy_socket, agent_factory)
    kept, gone = partition(world, "kept"), partition(world, "gone")
    assert kept[0] == gone[0] == "3g.40gb" and kept != gone

    with Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
        running, main = run_pod(k, world, "kept")
        assert set(instances(containerd, uuid)) == {kept}  # created before the container
        mig_uuid = instances(containerd, uuid)[kept]
        env = k.env(main)
        assert env["NVIDIA_VISIBLE_DEVICES"] == mig_uuid
        assert not {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_DEVICE_SM_LIMIT"} & set(env)
        code, out = k.exec(main, "sh", "-c", "ls /dev/nvidia-caps")
        assert code == 0 and out.split(), out  # the instance's access devices, through its CDI device

        k.remove_pod(running)  # the claim's last holder: its instance goes
        wait_for("the instance destroyed", lambda: instances(containerd, uuid) == {}, timeout=15)

        kept_pod, kept_main = run_pod(k, world, "kept")
        gone_pod, _ = run_pod(k, world, "gone")
        assert set(instances(containerd, uuid)) == {kept, gone}

    agent.kill()  # kill -9: no RemoveContainer reaches it while it is down
    with Kubelet(f"unix://{containerd.socket}", containerd.image) as direct:
        direct.remove_pod(gone_pod)
    assert set(instances(containerd, uuid)) == {kept, gone}  # nobody destroyed it yet

    agent.start()  # the same command: same node, card and ledger
    wait_until_serving(world, agent, uuid, proxy_socket)
    wait_for("the restarted agent converged: the unheld instance destroyed, the held one kept",
             lambda: set(instances(containerd, uuid)) == {kept}, timeout=30)
    with Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
        assert k.env(kept_main)["NVIDIA_VISIBLE_DEVICES"] == instances(containerd, uuid)[kept]
        k.remove_pod(kept_pod)
        wait_for("the last instance destroyed", lambda: instances(containerd, uuid) == {}, timeout=15)
    assert agent.alive()
