"""One pod through everything: the real API server, the admission webhook (its own process), the
controller, and the test acting as kubelet through the CRI proxy on a real containerd.

pod created (inline request) -> webhook gates it -> controller makes and binds its claim, names
the pod in status.users and lifts the gate -> kubelet (this test) runs the sandbox and the
containers through the proxy -> the claim's container sees its card and limits, the sidecar none
-> pod deleted -> kubelet removes the containers -> ledger released -> controller deletes the
inline claim -> the card's capacity is free again.

The agent's view is the agent's own (cri/claim_view.ClaimView over agent/kube.AgentKube): claims and
their ElasticGPUs read by name from the API server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from elasticgpu.agent import kube as agent_api
from elasticgpu.agent.cri.proxy import CriProxy, ProxySettings
from elasticgpu.agent.discovery import Card
from elasticgpu.agent.injecting import cdi, claim_hooks, claim_view
from elasticgpu.agent.ledger import store
from elasticgpu.api import names, pod_claims
from tests.agent.cri.kubelet import Kubelet, Pod
from tests.agent.cri.node import stand_ins
from tests.binding import objects as o
from tests.containerd_runtime import TestRuntime, sandbox_config
from tests.kube_cluster import TestCluster
from tests.pods.claim_world import World, controller_for, kube, settle, wait_for, world
from tests.pods.conftest import WebhookProcess, pod_update_policies, webhook_factory

__all__ = ["kube", "pod_update_policies", "webhook_factory", "world"]  # fixtures


@pytest.fixture
def webhook(world: World, webhook_factory: Callable[..., WebhookProcess]) -> WebhookProcess:
    return webhook_factory(world.namespace)


@pytest.fixture
def node_agent(world: World, containerd: TestRuntime, proxy_socket: Path, tmp_path: Path,
               kube_cluster: TestCluster) -> Iterator[Any]:
    """A node with one card: its GPU object, its CDI spec (stand-in device), the proxy with claim hooks."""
    node = world.node(f"{world.prefix}-a")
    model = f"T{world.prefix}"
    gpu = world.gpu(o.gpu(f"gpu-{world.prefix}-0", node=node, model=model))
    world.klass(o.klass(f"{world.prefix}-now", parameters={"gpuModel": model}))
    cards, control = stand_ins(containerd.directory / "dev")
    card = cdi.CardDevice(uuid=gpu["spec"]["uuid"], minor=0, host_path=cards[0].host_path)
    cdi.write_spec(containerd.cdi_dir, [card], control)
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    agent_kube = agent_api.AgentKube(agent_api.load_api_client(str(kube_cluster.kubeconfig), None),
                                     node_name=node, field_manager="test-agent")
    discovered = Card(index=0, uuid=card.uuid, model=model, memory_mib=gpu["spec"]["memory"], minor=0,
                      device_path=str(card.host_path))
    view = claim_view.ClaimView(kube=agent_kube, node_name=node, cards=lambda: [discovered])
    hooks = claim_hooks.ClaimHooks(view=view, ledger=ledger)
    settings = ProxySettings(listen=proxy_socket, upstream=str(containerd.socket))
    with CriProxy(settings, container_hooks=hooks) as proxy:
        assert proxy.reconciled.wait(10)
        yield node, gpu, ledger, hooks
    hooks.close()
    ledger.close()
    agent_kube.close()


def gates(pod: dict[str, Any]) -> list[str]:
    return [g["name"] for g in pod["spec"].get("schedulingGates") or []]


def test_a_pod_from_creation_to_deletion(
    world: World, webhook: WebhookProcess, node_agent: Any, containerd: TestRuntime, proxy_socket: Path
) -> None:
    node, gpu, ledger, hooks = node_agent
    uuid = gpu["spec"]["uuid"]
    request = f"gpu-core=30,gpu-memory=10Gi,class={world.prefix}-now"
    # Created without our gate: the webhook must add it.
    world.pod("trainer", inline={"main": request}, gated=False, containers=("main", "side"))
    assert names.SCHEDULING_GATE in gates(world.get_pod("trainer")), "the webhook did not gate the pod"

    controller = controller_for(world)
    claim_name = pod_claims.inline_claim_name("trainer", "main")
    wait_for(lambda: (settle(controller), names.SCHEDULING_GATE not in gates(world.get_pod("trainer")))[1],
             "the controller to bind the inline claim and lift the gate")  # fmt: skip
    pod = world.get_pod("trainer")
    claim = world.get_claim(claim_name)
    assert claim["status"]["phase"] == "Bound" and claim["status"]["gpus"] == [uuid]
    assert claim["status"]["users"] == [{"name": "trainer", "uid": pod["metadata"]["uid"]}]
    required = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert node in str(required), f"the pod is not pinned to {node}: {required}"

    # kubelet on the node the gate pinned: sandbox and containers through the proxy.
    with Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
        config = sandbox_config(name="trainer", namespace=world.namespace, uid=pod["metadata"]["uid"],
                                annotations=pod["metadata"]["annotations"])  # fmt: skip
        sandbox = k.runtime.RunPodSandbox(k.pb.RunPodSandboxRequest(config=config), timeout=30).pod_sandbox_id
        running = Pod(id=sandbox, config=config)
        main = k.create_container(running, "main", envs={"NVIDIA_VISIBLE_DEVICES": "all"})
        side = k.create_container(running, "side", envs={"NVIDIA_VISIBLE_DEVICES": "all"})
        for container_id in (main, side):
            k.start(container_id)
        env = k.env(main)
        assert env["NVIDIA_VISIBLE_DEVICES"] == uuid
        assert env["CUDA_DEVICE_SM_LIMIT"] == "30" and env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "10240m"
        assert k.exec(main, "sh", "-c", "test -c /dev/nvidia0 && test -c /dev/nvidiactl")[0] == 0
        assert k.env(side)["NVIDIA_VISIBLE_DEVICES"] == "void"
        assert k.exec(side, "sh", "-c", "test -e /dev/nvidia0")[0] != 0
        hooks.flush()
        assert [(a.state, a.container_id, a.claim_name) for a in ledger.open_allocations()] == [
            ("created", main, claim_name)
        ]

        # The pod is deleted; kubelet stops and removes its containers and sandbox.
        world.delete_pod("trainer")
        k.remove_pod(running)
    hooks.flush()
    assert ledger.open_allocations() == []
    released = ledger.allocation_for_container(main)
    assert released is not None and released.state == "released"

    # The controller deletes the inline claim of the gone pod; the card's capacity is free.
    def freed() -> bool:
        settle(controller)
        claims = [c["metadata"]["name"] for c in world.kube.list_claims(world.namespace)]
        allocations = (world.kube.get_gpu(gpu["metadata"]["name"]).get("status") or {}).get("allocations") or []
        return claim_name not in claims and not allocations

    wait_for(freed, "the inline claim deleted and the card's allocation freed")
