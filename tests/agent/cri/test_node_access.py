"""Containers without a claim on a GPU node: the image's NVIDIA_VISIBLE_DEVICES (19.2), the node's own
GPU pods in a labelled namespace (19.3) and privileged containers (15.7).

Decisions first (injection.decide with a plain view), then the same on the real containerd through
the proxy with the claim hooks, with an image that sets NVIDIA_VISIBLE_DEVICES=all as NVIDIA's CUDA
images do.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from elasticgpu.agent.cri.proxy import CriProxy, ProxySettings
from elasticgpu.agent.injecting import claim_hooks, hooks, injection
from elasticgpu.agent.injecting.injection import ContainerRequest, InjectionSettings, PodRef
from elasticgpu.agent.ledger import store
from tests.agent.cri import images
from tests.agent.cri.kubelet import Kubelet
from tests.agent.cri.node import CARDS, View, publish_cards, slice_claim, whole_claim
from tests.containerd_runtime import TestRuntime

LABEL = injection.NODE_GPU_ACCESS_LABEL
VISIBLE = injection.ENV_VISIBLE_DEVICES


def request(namespace: str = "team", *, privileged: bool = False, claim: str | None = None) -> ContainerRequest:
    return ContainerRequest(
        pod=PodRef(namespace, "pod", "uid-1"),
        pod_annotations={"egpuc.elasticgpu.io/main": claim} if claim else {},
        container="main",
        envs=[(VISIBLE, "all"), ("A", "1")],
        cdi_devices=[injection.cdi_device(CARDS[0].uuid)],
        annotations={injection.CLAIM_ANNOTATION: "team/forged"},
        privileged=privileged,
    )


# --- decisions -----------------------------------------------------------------------------------


def test_unclaimed_container_of_a_plain_namespace_gets_void() -> None:
    edit = injection.decide(request(), View())
    assert edit.envs == (("A", "1"), (VISIBLE, "void")) and edit.cdi_devices == ()


def test_labelled_namespace_passes_untouched_except_the_claim_annotation() -> None:
    edit = injection.decide(request("gpu-operator"), View(gpu_access={"gpu-operator": True}))
    assert edit.envs == ((VISIBLE, "all"), ("A", "1"))
    assert edit.cdi_devices == (injection.cdi_device(CARDS[0].uuid),)
    assert edit.annotations == {}  # only the agent says which claim a container uses


def test_namespace_that_cannot_be_read_counts_as_unlabelled() -> None:
    edit = injection.decide(request("gpu-operator"), View(gpu_access={"gpu-operator": None}))
    assert (VISIBLE, "void") in edit.envs


STRICT = InjectionSettings(refuse_privileged=True)
"""The admin's opt-in (--refuse-privileged true): privileged containers without a claim refused on GPU nodes."""


def test_privileged_without_claim_passes_by_default_with_no_event() -> None:
    """Issue 33.4: a privileged container is root on its node; no hook confines it, Pod Security Admission decides
    who may run one. The node's own DaemonSets (CNI, CSI, the GPU Operator's) run privileged in any namespace."""
    view = View()
    edit = injection.decide(request("calico-system", privileged=True), view)
    assert edit.claim is None and view.warnings == []
    assert edit.cdi_devices == () and (VISIBLE, "void") in edit.envs  # nothing of ours given


def test_privileged_without_claim_is_refused_with_what_to_do_and_an_event_when_the_admin_asks() -> None:
    view = View()
    with pytest.raises(hooks.Refused) as refused:
        injection.decide(request(privileged=True), view, settings=STRICT)
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    message = refused.value.message
    assert "privileged" in message and "egpuc.elasticgpu.io/main" in message and f"{LABEL}=true" in message
    assert [(pod.name, reason) for pod, reason, _ in view.warnings] == [("pod", injection.PRIVILEGED_REASON)]


@pytest.mark.parametrize(
    ("namespace", "view", "settings"),
    [
        pytest.param("gpu-operator", View(gpu_access={"gpu-operator": True}), STRICT, id="labelled"),
        pytest.param("kube-system", View(), STRICT, id="kube-system"),
        pytest.param("team", View(), InjectionSettings(), id="default"),
        pytest.param("team", View(cards={}), STRICT, id="node-without-cards"),
    ],
)
def test_privileged_without_claim_passes(namespace: str, view: View, settings: InjectionSettings) -> None:
    injection.decide(request(namespace, privileged=True), view, settings=settings)
    assert view.warnings == []


def test_privileged_when_the_label_cannot_be_read_is_retryable() -> None:
    with pytest.raises(hooks.Refused) as refused:
        injection.decide(request(privileged=True), View(gpu_access={"team": None}), settings=STRICT)
    assert refused.value.code == grpc.StatusCode.UNAVAILABLE and "kubelet retries" in refused.value.message


def test_privileged_with_a_slice_claim_is_refused_naming_the_claim_the_container_and_the_fix() -> None:
    """Issue 33.4: privileged, the container gets every device of the node, so a 30% slice would reach the
    other tenants' cards; the claim cannot hold there, and the container is refused unless its class allows it."""
    view = View()
    view.add(slice_claim("team", "slice", user="pod"))
    with pytest.raises(hooks.Refused) as refused:
        injection.decide(request(privileged=True, claim="slice"), view)
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    message = refused.value.message
    assert "ElasticGPUClaim team/slice" in message and "container 'main'" in message and "privileged" in message
    assert "allowPrivileged" in message and "securityContext" in message  # the two fixes
    assert [(pod.name, reason) for pod, reason, _ in view.warnings] == [("pod", injection.PRIVILEGED_CLAIM_REASON)]


def test_privileged_with_a_whole_card_claim_is_refused_too() -> None:
    """Whole cards too: privileged, the container sees the node's other cards, which other claims hold."""
    view = View()
    view.add(whole_claim("team", "whole", user="pod"))
    with pytest.raises(hooks.Refused) as refused:
        injection.decide(request(privileged=True, claim="whole"), view)
    assert "ElasticGPUClaim team/whole" in refused.value.message


def test_privileged_with_a_claim_of_a_class_that_allows_it_gets_its_claim() -> None:
    """The admin's class said allowPrivileged (the controller copied it into the claim's status)."""
    view = View()
    view.add(slice_claim("team", "slice", user="pod", allow_privileged=True))
    edit = injection.decide(request(privileged=True, claim="slice"), view)
    assert edit.claim is not None and (VISIBLE, CARDS[0].uuid) in edit.envs
    assert view.warnings == []


def test_an_unprivileged_container_of_an_allowing_class_is_as_any_other() -> None:
    view = View()
    view.add(slice_claim("team", "slice", user="pod", allow_privileged=True))
    edit = injection.decide(request(claim="slice"), view)
    assert (VISIBLE, CARDS[0].uuid) in edit.envs


# --- on the real containerd --------------------------------------------------------------------------


@dataclass
class Node:
    view: View
    kubelet: Kubelet
    cuda_image: str

    def process_env(self, container_id: str) -> list[str]:
        """The NVIDIA_VISIBLE_DEVICES entries of the container's main process (read from the host)."""
        status = self.kubelet.runtime.ContainerStatus(
            self.kubelet.pb.ContainerStatusRequest(container_id=container_id, verbose=True), timeout=10
        )
        pid = json.loads(status.info["info"])["pid"]
        # StartContainer may answer before runc's init has exec'd the process (its env is empty until then).
        deadline = time.monotonic() + 5
        while True:
            environ = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
            if "PATH=/bin" in environ or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        return [entry for entry in environ if entry.startswith(f"{VISIBLE}=")]

    def spec_env(self, container_id: str) -> list[str]:
        """The NVIDIA_VISIBLE_DEVICES entries of the container's OCI spec, in order."""
        status = self.kubelet.runtime.ContainerStatus(
            self.kubelet.pb.ContainerStatusRequest(container_id=container_id, verbose=True), timeout=10
        )
        env: list[str] = json.loads(status.info["info"])["runtimeSpec"]["process"]["env"]
        return [entry for entry in env if entry.startswith(f"{VISIBLE}=")]

    def run(self, namespace: str, container: str = "main", **options: Any) -> str:
        annotations = options.pop("pod_annotations", None)
        privileged = options.get("privileged", False)
        pod = self.kubelet.run_pod(f"pod-{container}", namespace, annotations=annotations, privileged=privileged)
        container_id = self.kubelet.create_container(pod, container, image=self.cuda_image, **options)
        self.kubelet.start(container_id)
        return container_id


def _node(containerd: TestRuntime, proxy_socket: Path, tmp_path: Path,
          settings: InjectionSettings) -> Iterator[Node]:  # fmt: skip
    publish_cards(containerd.cdi_dir, containerd.directory / "dev")
    cuda_image = images.import_variant(containerd)
    view = View()
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    claim_hooks_ = claim_hooks.ClaimHooks(view=view, ledger=ledger, settings=settings)
    proxy_settings = ProxySettings(listen=proxy_socket, upstream=str(containerd.socket))
    with CriProxy(proxy_settings, container_hooks=claim_hooks_) as proxy, Kubelet(f"unix://{proxy_socket}",
                                                                                  containerd.image) as k:
        assert proxy.reconciled.wait(10)
        yield Node(view=view, kubelet=k, cuda_image=cuda_image)
    claim_hooks_.close()
    ledger.close()


@pytest.fixture
def node(containerd: TestRuntime, proxy_socket: Path, tmp_path: Path) -> Iterator[Node]:
    yield from _node(containerd, proxy_socket, tmp_path, InjectionSettings())


@pytest.fixture
def strict_node(containerd: TestRuntime, proxy_socket: Path, tmp_path: Path) -> Iterator[Node]:
    """A node whose admin turned the refusal of privileged containers without a claim on."""
    yield from _node(containerd, proxy_socket, tmp_path, STRICT)


def test_image_all_is_not_what_an_unclaimed_or_claimed_container_sees(node: Node) -> None:
    """The image says `all`; the container's processes see one entry, ours; the OCI spec's last entry
    (the one the NVIDIA runtime hook reads) is ours. containerd 1.7 keeps the image's entry in the
    spec before ours and no CRI or CDI edit can remove it (a CDI env edit appends a third): runc
    sets the spec's env one by one, so a duplicated name ends with its last value."""
    unclaimed = node.run("team", "plain")
    assert node.process_env(unclaimed) == [f"{VISIBLE}=void"]
    assert node.kubelet.env(unclaimed)[VISIBLE] == "void"
    assert node.spec_env(unclaimed)[-1] == f"{VISIBLE}=void"

    node.view.add(slice_claim("team", "slice", user="pod-main"))
    claimed = node.run("team", pod_annotations={"egpuc.elasticgpu.io/main": "slice"})
    assert node.process_env(claimed) == [f"{VISIBLE}={CARDS[0].uuid}"]
    assert node.spec_env(claimed)[-1] == f"{VISIBLE}={CARDS[0].uuid}"


def test_labelled_namespace_keeps_its_image_env_and_named_devices(node: Node) -> None:
    """dcgm-exporter style: a pod of a labelled namespace asks for a card by CDI name and keeps `all`."""
    node.view.gpu_access["gpu-operator"] = True
    container_id = node.run("gpu-operator", "dcgm", cdi_devices=[injection.cdi_device(CARDS[1].uuid)])
    assert node.process_env(container_id) == [f"{VISIBLE}=all"]
    code, out = node.kubelet.exec(container_id, "ls", "/dev")
    assert code == 0 and "nvidia1" in out.split(), out

    # The same pod in a namespace without the label: void, and no card.
    other = node.run("team", "dcgm", cdi_devices=[injection.cdi_device(CARDS[1].uuid)])
    assert node.process_env(other) == [f"{VISIBLE}=void"]
    code, out = node.kubelet.exec(other, "ls", "/dev")
    assert "nvidia1" not in out.split(), out


def test_privileged_container_with_a_slice_claim_is_refused_and_one_without_a_claim_passes(node: Node) -> None:
    """Issue 33.4 on the real runtime: a 30% slice in a privileged container would get every device of the node
    (runc gives a privileged container the host's /dev), other tenants' cards included: refused. A privileged
    container without a claim (a CNI or CSI agent of any namespace) starts, untouched but for our devices."""
    node.view.add(slice_claim("team", "slice", user="pod-main"))
    with pytest.raises(grpc.RpcError) as refused:
        node.run("team", pod_annotations={"egpuc.elasticgpu.io/main": "slice"}, privileged=True)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = str(refused.value.details())
    assert "ElasticGPUClaim team/slice" in details and "privileged" in details and "allowPrivileged" in details
    assert [reason for _, reason, _ in node.view.warnings] == [injection.PRIVILEGED_CLAIM_REASON]

    cni = node.run("calico-system", "calico-node", privileged=True)
    assert node.process_env(cni) == [f"{VISIBLE}=void"]


def test_privileged_container_of_an_allowing_class_gets_its_claim(node: Node) -> None:
    node.view.add(slice_claim("team", "slice", user="pod-main", allow_privileged=True))
    claimed = node.run("team", pod_annotations={"egpuc.elasticgpu.io/main": "slice"}, privileged=True)
    assert node.process_env(claimed) == [f"{VISIBLE}={CARDS[0].uuid}"]


def test_privileged_container_without_claim_is_refused_unless_labelled_when_the_admin_asks(
    strict_node: Node,
) -> None:
    node = strict_node
    with pytest.raises(grpc.RpcError) as refused:
        node.run("team", "tool", privileged=True)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "privileged" in str(refused.value.details()) and LABEL in str(refused.value.details())
    assert [reason for _, reason, _ in node.view.warnings] == [injection.PRIVILEGED_REASON]

    node.view.gpu_access["gpu-operator"] = True
    labelled = node.run("gpu-operator", "validator", privileged=True)
    assert node.process_env(labelled) == [f"{VISIBLE}=all"]
    system = node.run("kube-system", "kube-proxy", privileged=True)
    assert node.process_env(system) == [f"{VISIBLE}=void"]
