"""A starting agent does not yet know whether its node has cards (issue 23.6): where the admin turned the
refusal of privileged containers without a claim on (--refuse-privileged; off by default since issue 33.4),
until discovery has run, a privileged container without a claim is refused as on a GPU node (it would see every card),
retryably; everything else passes as always, and the exemptions of a GPU node (kube-system, the
labelled namespace) hold in that window too.

Decisions first (injection.decide through the agent's own `GatedView` and `ClaimView`, whose
inventory is unknown until discovery's first snapshot), then the real agent process in front of
the real containerd, its device backend not open yet (no device description), its API server
reachable.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc
import pytest
import yaml

from elasticgpu.agent.discovery import Card, simulated
from elasticgpu.agent.injecting import claim_view, gated, hooks, injection
from elasticgpu.agent.injecting.injection import ContainerRequest, InjectionSettings, PodRef
from elasticgpu.api import names
from tests.agent.conftest import wait_for
from tests.agent.cri.kubelet import Kubelet
from tests.agent.cri.node import View
from tests.agent.cri.test_agent_run import AgentProcess, agent_factory, serving, wait_until_serving, world_gpus
from tests.containerd_runtime import TestRuntime
from tests.pods.claim_world import World, kube, world
from tests.pods.conftest import pod_update_policies

__all__ = ["agent_factory", "kube", "pod_update_policies", "world", "world_gpus"]  # fixtures


STRICT = InjectionSettings(refuse_privileged=True)
"""The admin's opt-in refusal of privileged containers without a claim (off by default: issue 33.4)."""


def _privileged(namespace: str = "team") -> ContainerRequest:
    return ContainerRequest(pod=PodRef(namespace, "tool", "uid-1"), pod_annotations={}, container="main",
                            envs=[("NVIDIA_VISIBLE_DEVICES", "all")], cdi_devices=[], annotations={},
                            privileged=True)  # fmt: skip


class _Reader:
    """claim_view.ClaimReader of an API server that answers (the namespace unlabelled)."""

    answered_at: float | None = None
    last_failure: str | None = None

    def __init__(self) -> None:
        self.answered_at = time.monotonic()

    def probe(self) -> None:
        self.answered_at = time.monotonic()

    def read_claim(self, namespace: str, name: str) -> dict[str, object]:
        raise AssertionError("no claim is read for a container without one")

    def read_elastic_gpu(self, name: str) -> dict[str, object]:
        raise AssertionError("no claim is read for a container without one")

    def read_namespace(self, name: str) -> dict[str, object]:
        labels = {injection.NODE_GPU_ACCESS_LABEL: "true"} if name == "gpu-operator" else {}
        return {"metadata": {"name": name, "labels": labels}}

    def create_event(self, **_: object) -> None:
        pass


def _api_view(cards: Callable[[], Sequence[Card] | None]) -> claim_view.ClaimView:
    return claim_view.ClaimView(kube=_Reader(), node_name="node-a", cards=cards)


def _gated(view: injection.AgentView | None) -> gated.GatedView:
    return gated.GatedView(node_name="node-a", view=lambda: view, not_ready=lambda: "the device backend: not opened")


# Views are made in the test, not at collection: the API view's "answered recently" is a clock.
@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: _gated(None), id="no-api-client-yet"),
        pytest.param(lambda: _gated(_api_view(lambda: None)), id="api-client-open-discovery-not-run"),
        pytest.param(lambda: View(inventory_known=False), id="plain-view"),
    ],
)
def test_a_privileged_container_is_refused_while_the_cards_are_unknown(
    make: Callable[[], injection.AgentView],
) -> None:
    view = make()
    assert view.has_cards() is None  # unknown, not "no cards"
    with pytest.raises(hooks.Refused) as refused:
        injection.decide(_privileged(), view, settings=STRICT)
    assert refused.value.code == grpc.StatusCode.UNAVAILABLE  # kubelet retries; once discovered, the policy says
    assert "privileged" in refused.value.message and "kubelet retries" in refused.value.message


@pytest.mark.parametrize(
    ("namespace", "make", "settings"),
    [
        pytest.param("kube-system", lambda: _gated(None), STRICT, id="kube-system"),
        pytest.param("gpu-operator", lambda: _gated(_api_view(lambda: None)), STRICT, id="labelled"),
        pytest.param("team", lambda: _gated(None), InjectionSettings(), id="option-off-by-default"),
        pytest.param("team", lambda: _gated(_api_view(lambda: ())), STRICT, id="discovered-no-cards"),
    ],
)
def test_what_a_gpu_node_lets_through_passes_while_the_cards_are_unknown(
    namespace: str, make: Callable[[], injection.AgentView], settings: InjectionSettings
) -> None:
    edit = injection.decide(_privileged(namespace), make(), settings=settings)
    assert edit.claim is None


def test_an_unprivileged_container_passes_while_the_cards_are_unknown() -> None:
    request = ContainerRequest(pod=PodRef("team", "web", "uid-2"), pod_annotations={}, container="main",
                               envs=[("NVIDIA_VISIBLE_DEVICES", "all")], cdi_devices=[], annotations={})  # fmt: skip
    edit = injection.decide(request, _gated(None))
    assert ("NVIDIA_VISIBLE_DEVICES", "void") in edit.envs


def test_the_real_agent_refuses_a_privileged_container_until_it_knows_its_cards(
    world: World, world_gpus: list[str], containerd: TestRuntime, proxy_socket: Path, tmp_path: Path,
    agent_factory: Callable[..., AgentProcess],
) -> None:  # fmt: skip
    node, model = world.node(f"{world.prefix}-a"), f"T{world.prefix}"
    uuid = simulated.simulated_uuid(node, 0)
    world_gpus.append(names.gpu_object_name(uuid))
    description = tmp_path / "later.yaml"  # no device description yet: discovery cannot run
    agent = agent_factory(node, model, "--simulation", str(description), "--refuse-privileged", "true")
    wait_for("the proxy serving", lambda: agent.alive() and serving(proxy_socket), timeout=15)
    with Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
        tool = k.run_pod("tool", world.namespace, privileged=True)
        with pytest.raises(grpc.RpcError) as refused:
            k.create_container(tool, "main", privileged=True)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value.details()
        assert "privileged" in str(refused.value.details())
        # Unprivileged, and privileged in kube-system: as always.
        plain = k.run_pod("plain", world.namespace)
        k.start(k.create_container(plain, "app", envs={"NVIDIA_VISIBLE_DEVICES": "all"}))
        system = k.run_pod("kube-proxy", "kube-system", privileged=True)
        k.start(k.create_container(system, "main", privileged=True))
        for pod in (tool, plain, system):
            k.remove_pod(pod)

    # Discovery runs: the node has a card, the same container is refused for good (the policy's answer).
    description.write_text(yaml.safe_dump({"cards": [{"model": model, "memory": "80Gi", "numa": 0}]}))
    wait_until_serving(world, agent, uuid, proxy_socket)
    with Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
        tool = k.run_pod("tool", world.namespace, privileged=True)
        with pytest.raises(grpc.RpcError) as refused:
            k.create_container(tool, "main", privileged=True)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.value.details()
        k.remove_pod(tool)
    assert "Traceback" not in agent.log()
