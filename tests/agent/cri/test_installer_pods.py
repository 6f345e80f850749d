"""The chart's own agent installer gets through the agent it installed (issue 23.2).

The installer DaemonSet (deploy/chart/templates/agent-installer.yaml) runs a privileged container
without a claim in the install namespace. Once kubelet talks to the agent's CRI socket, every
`helm upgrade`, node reboot or installer restart re-creates that container through the agent,
which refuses privileged containers without a claim on a GPU node outside kube-system and the
labelled namespaces. The chart passes the agent `ELASTICGPU_AGENT_PRIVILEGED_PODS=<install
namespace>/app.kubernetes.io/component=agent-installer` through the agent.env its installer
writes: privileged containers of pods of that namespace with that label pass, no other.

The pure decision first, with the agent's settings built from the chart's agent.env as the agent
builds them from its environment, and the installer pod as the chart renders it; then the real
chain: the installer's script writes agent.env on a scratch node, the real agent runs with it in
front of the real containerd, and the installer pod is created, restarted and replaced (an
upgrade's rolling update) through the agent's socket, as kubelet does.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import helm_python
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from elasticgpu.agent import running
from elasticgpu.agent import settings as agent_settings
from elasticgpu.agent.discovery import simulated
from elasticgpu.agent.injecting import hooks, injection
from elasticgpu.agent.injecting.injection import ContainerRequest, PodRef
from elasticgpu.api import names
from tests.agent.cri.kubelet import Kubelet
from tests.agent.cri.node import View
from tests.agent.cri.test_agent_run import AgentProcess, agent_factory, wait_until_serving, world_gpus
from tests.containerd_runtime import TestRuntime
from tests.deploy.test_agent_installer import Node as ScratchNode
from tests.pods.claim_world import World, kube, world
from tests.pods.conftest import pod_update_policies

__all__ = ["agent_factory", "kube", "pod_update_policies", "world", "world_gpus"]  # fixtures

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "deploy" / "chart"
DAEMONSET_LABELS = {"controller-revision-hash": "5d8f7b9c4", "pod-template-generation": "1"}
"""What the DaemonSet controller adds to its pods' labels (they change with each rollout)."""


def _chart(namespace: str, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The installer's objects as `helm install -n NAMESPACE` renders them (the CRI proxy's node hook)."""
    values = dict(values or {})
    values["agent"] = {**values.get("agent", {}), "nodeHook": "cri-proxy"}
    chart = helm_python.Chart.load(CHART)
    try:
        rendered = chart.render(values, name="elasticgpu", namespace=namespace)
    finally:
        chart.close()
    text = next(text for template, text in rendered.items() if template.endswith("/agent-installer.yaml"))
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _plain() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((REPO / "deploy" / "agent-installer.yaml").read_text()) if doc]


def environment_file(text: str) -> dict[str, str]:
    """KEY=VALUE lines of a systemd EnvironmentFile (comments and blank lines skipped; the last one wins)."""
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line and not line.lstrip().startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


def installer_pod(objects: list[dict[str, Any]]) -> tuple[str, dict[str, str], str, bool]:
    """(namespace, labels, container, privileged) of a pod of the installer DaemonSet, as kubelet gets it."""
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    template = daemonset["spec"]["template"]
    (container,) = template["spec"]["containers"]
    labels = {**template["metadata"]["labels"], **DAEMONSET_LABELS}
    return (daemonset["metadata"]["namespace"], labels, container["name"],
            bool(container["securityContext"]["privileged"]))  # fmt: skip


def _injection(agent_env: str) -> injection.InjectionSettings:
    """The agent's injection settings from the installer's agent.env, built as the agent builds them."""
    environ = environment_file(agent_env)
    return running.hook_settings(agent_settings.from_sources(None, environ).cri).injection


def _request(namespace: str, labels: dict[str, str], container: str, privileged: bool) -> ContainerRequest:
    return ContainerRequest(pod=PodRef(namespace, "elasticgpu-agent-installer-x7k2p", "uid-1"), pod_annotations={},
                            pod_labels=labels, container=container, envs=[], cdi_devices=[], annotations={},
                            privileged=privileged)  # fmt: skip


@pytest.mark.parametrize("namespace", ["elasticgpu-system", "gpu-infra"])
def test_the_installer_pod_passes_the_decision_with_the_settings_the_chart_gives(namespace: str) -> None:
    objects = _chart(namespace)
    (config,) = [o for o in objects if o["kind"] == "ConfigMap"]
    settings = _injection(config["data"]["agent.env"])
    pod_namespace, labels, container, privileged = installer_pod(objects)
    assert pod_namespace == namespace and privileged
    view = View()  # a GPU node, the install namespace not labelled
    edit = injection.decide(_request(pod_namespace, labels, container, privileged), view, settings=settings)
    assert edit.claim is None and view.warnings == []

    # By default privileged containers without a claim pass (issue 33.4); where the admin turns the refusal on
    # (--refuse-privileged), the entry is narrow: the same pod in another namespace, or another privileged pod
    # of the install namespace, is refused.
    strict = dataclasses.replace(settings, refuse_privileged=True)
    edit = injection.decide(_request(pod_namespace, labels, container, privileged), View(), settings=strict)
    assert edit.claim is None
    for other_namespace, other_labels in ((f"{namespace}-x", labels), (namespace, {"app": "debug"})):
        injection.decide(_request(other_namespace, other_labels, container, True), View(), settings=settings)
        other = View()
        with pytest.raises(hooks.Refused) as refused:
            injection.decide(_request(other_namespace, other_labels, container, True), other, settings=strict)
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert [reason for _, reason, _ in other.warnings] == [injection.PRIVILEGED_REASON]


def test_the_chart_keeps_the_installer_entry_beside_the_users_own() -> None:
    users = "team-infra/app=node-tuner"
    objects = _chart("elasticgpu-system", {"agent": {"env": {"ELASTICGPU_AGENT_PRIVILEGED_PODS": users,
                                                             "ELASTICGPU_AGENT_CDI_FORM": "both"}}})  # fmt: skip
    (config,) = [o for o in objects if o["kind"] == "ConfigMap"]
    env = environment_file(config["data"]["agent.env"])
    assert env["ELASTICGPU_AGENT_CDI_FORM"] == "both"
    settings = _injection(config["data"]["agent.env"])
    assert settings.privileged_pods == (
        injection.PrivilegedPods("elasticgpu-system", "app.kubernetes.io/component", "agent-installer"),
        injection.PrivilegedPods("team-infra", "app", "node-tuner"),
    )
    # The plain manifest is the chart rendered in elasticgpu-system.
    (plain,) = [o for o in _plain() if o["kind"] == "ConfigMap"]
    assert environment_file(plain["data"]["agent.env"]) == {
        "ELASTICGPU_AGENT_PRIVILEGED_PODS": "elasticgpu-system/app.kubernetes.io/component=agent-installer"}


_NAMESPACES = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?\Z")
_KEYS = st.from_regex(r"\A([a-z0-9.-]{1,12}/)?[A-Za-z0-9][-A-Za-z0-9_.]{0,10}\Z")
_VALUES = st.from_regex(r"\A([A-Za-z0-9][-A-Za-z0-9_.]{0,10})?\Z")


@given(entries=st.lists(st.tuples(_NAMESPACES, _KEYS, _VALUES), max_size=4), other=_NAMESPACES)
def test_entries_read_back_and_match_only_their_namespace_and_label(
    entries: list[tuple[str, str, str]], other: str
) -> None:
    written = tuple(injection.PrivilegedPods(*entry) for entry in entries)
    assert injection.parse_privileged_pods(",".join(map(str, written))) == written
    for pods in written:
        pod = PodRef(pods.namespace, "p", "u")
        assert pods.matches(pod, {pods.key: pods.value, "other": "x"})
        assert not pods.matches(pod, {pods.key: pods.value + "x"}) and not pods.matches(pod, {})
        assert pods.matches(PodRef(other, "p", "u"), {pods.key: pods.value}) == (other == pods.namespace)


@pytest.mark.parametrize("text", ["ns", "ns/", "ns/key", "/k=v", "Bad_NS/k=v"])
def test_an_unreadable_privileged_pods_entry_names_the_setting_and_the_form(text: str) -> None:
    with pytest.raises(ValueError, match="ELASTICGPU_AGENT_PRIVILEGED_PODS") as error:
        injection.parse_privileged_pods(text)
    assert "<namespace>/<label>=<value>" in str(error.value)


@pytest.mark.skipif(
    not Path("/usr/lib/python3.11/os.py").exists() or not Path("/lib64/ld-linux-x86-64.so.2").exists(),
    reason="needs Debian's python3.11 on x86-64 (the installer's image Python)",
)
def test_install_then_upgrade_through_the_agents_socket(
    world: World, world_gpus: list[str], containerd: TestRuntime, proxy_socket: Path, tmp_path: Path,
    agent_factory: Callable[..., AgentProcess],
) -> None:  # fmt: skip
    # The installer's program writes /etc/elasticgpu/agent.env on the node, from the plain manifest.
    (tmp_path / "node").mkdir()
    scratch = ScratchNode(tmp_path / "node")
    scratch.install()
    agent_env = environment_file((scratch.root / "etc" / "elasticgpu" / "agent.env").read_text())
    assert "ELASTICGPU_AGENT_PRIVILEGED_PODS" in agent_env, agent_env

    # The agent it installed runs with that environment, on a GPU node (its simulated card discovered).
    node, model = world.node(f"{world.prefix}-a"), f"T{world.prefix}"
    card = simulated.simulated_uuid(node, 0)
    world_gpus.append(names.gpu_object_name(card))
    # With the admin's opt-in refusal of privileged containers without a claim (issue 33.4: off by default), which
    # is what the installer's entry is for.
    env = {k: v for k, v in agent_env.items() if k != "ELASTICGPU_AGENT_NODE_NAME"}
    agent = agent_factory(node, model, env={**env, "ELASTICGPU_AGENT_REFUSE_PRIVILEGED": "true"})
    wait_until_serving(world, agent, card, proxy_socket)

    namespace, labels, container, privileged = installer_pod(_plain())
    with Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
        # Install: kubelet creates the installer's pod through the agent's socket.
        first = k.run_pod("elasticgpu-agent-installer-x7k2p", namespace, labels=labels, privileged=privileged)
        k.start(k.create_container(first, container, privileged=privileged))
        # The installer restarts (a crash, a node reboot): its container is made again in its pod.
        k.remove_container(first.containers.pop(container))
        k.start(k.create_container(first, container, privileged=privileged))
        # helm upgrade: the rolling update replaces the pod (new uid, new revision hash).
        k.remove_pod(first)
        upgraded = {**labels, "controller-revision-hash": "7f9d6c8b5", "pod-template-generation": "2"}
        second = k.run_pod("elasticgpu-agent-installer-q4m8z", namespace, labels=upgraded, uid=str(uuid.uuid4()),
                           privileged=privileged)  # fmt: skip
        k.start(k.create_container(second, container, privileged=privileged))

        # No wider than that: a privileged pod of the install namespace without the label is refused.
        debug = k.run_pod("debug", namespace, labels={"app": "debug"}, privileged=True)
        with pytest.raises(grpc.RpcError) as refused:
            k.create_container(debug, "shell", privileged=True)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "privileged" in str(refused.value.details())
        for pod in (second, debug):
            k.remove_pod(pod)
    assert agent.alive() and "Traceback" not in agent.log()
