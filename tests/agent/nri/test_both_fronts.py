"""A container without a claim on both fronts (issue 44 item 8): every check of the CRI proxy's tests of such
a container (tests/agent/cri/test_claims.py, test_policing.py) holds through the proxy and through NRI, on
containerd 1.7 and 2.x.

Through the proxy kubelet's request is rewritten before the runtime sees it; through NRI the runtime has
built the container (its CDI devices resolved, the image's ENV merged) before the plugin is asked, and NRI
can replace and add but not remove (nri/translating.py). So one row differs in how, not in what: our CDI
devices asked for without a claim are dropped by the proxy and refused by NRI. Either way the container
never runs with a card: `outcome` says which, and every row checks the same thing of what runs.

    front "cri-proxy"  kubelet -> CriProxy(ClaimHooks) -> containerd (NRI on, no plugin registered)
    front "nri"        kubelet -> containerd -> the agent's NRI plugin -> NriFront(GatedHooks)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from elasticgpu.agent.cri.proxy import CriProxy, ProxySettings
from elasticgpu.agent.injecting import claim_hooks, gated, injection
from elasticgpu.agent.ledger import store
from tests.agent.cri.kubelet import Kubelet
from tests.agent.cri.node import CARDS, View, publish_cards, slice_claim
from tests.agent.nri.test_nri_claims import start_agent
from tests.agent.nri.test_nri_safety import imported_cuda_image
from tests.containerd_runtime import TestRuntime

NS = "team"
FRONTS = ("cri-proxy", "nri")
pytestmark = pytest.mark.timeout(180)


@dataclass
class Front:
    name: str
    view: View
    kubelet: Kubelet
    flush: Any
    ledger: store.LedgerStore

    def rows(self) -> list[tuple[str, str | None]]:
        self.flush()
        return [(a.state, a.container_id) for a in self.ledger.open_allocations()]


@pytest.fixture(params=FRONTS)
def front(request: pytest.FixtureRequest, nri_containerd: TestRuntime, nri_plugin: str,
          tmp_path: Path) -> Iterator[Front]:  # fmt: skip
    publish_cards(nri_containerd.cdi_dir, nri_containerd.directory / "dev")
    view = View()
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        if request.param == "cri-proxy":
            core = claim_hooks.ClaimHooks(view=view, ledger=ledger)
            socket = tmp_path / "proxy.sock"
            settings = ProxySettings(listen=socket, upstream=str(nri_containerd.socket))
            with CriProxy(settings, container_hooks=core) as proxy, \
                    Kubelet(f"unix://{socket}", nri_containerd.image) as k:
                assert proxy.reconciled.wait(10)
                yield Front("cri-proxy", view, k, core.flush, ledger)
            core.close()
        else:
            gated_core = gated.GatedHooks(view=view, ledger=lambda: ledger, settings=injection.InjectionSettings())
            agent = start_agent(nri_containerd, nri_plugin, gated_core, view, tmp_path / "agent.sock")
            try:
                with Kubelet(nri_containerd.endpoint, nri_containerd.image) as k:
                    yield Front("nri", view, k, lambda: gated_core.inner and gated_core.inner.flush(), ledger)
            finally:
                agent.close()
                gated_core.close()
    finally:
        ledger.close()


def spec(kubelet: Kubelet, container_id: str) -> dict[str, Any]:
    status = kubelet.runtime.ContainerStatus(
        kubelet.pb.ContainerStatusRequest(container_id=container_id, verbose=True), timeout=10)
    runtime_spec: dict[str, Any] = json.loads(status.info["info"])["runtimeSpec"]
    return runtime_spec


def visible(kubelet: Kubelet, container_id: str) -> str | None:
    """NVIDIA_VISIBLE_DEVICES as the NVIDIA hook reads it: the last entry of the spec."""
    values = [e.split("=", 1)[1] for e in spec(kubelet, container_id)["process"]["env"]
              if e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    return values[-1] if values else None


def card_nodes(kubelet: Kubelet, container_id: str) -> list[str]:
    """The card device nodes of the container, in its /dev and in its spec."""
    code, out = kubelet.exec(container_id, "sh", "-c", "ls /dev | grep nvidia; true")
    assert code == 0, out
    in_spec = [d["path"] for d in spec(kubelet, container_id)["linux"].get("devices") or []
               if d["path"].startswith("/dev/nvidia")]
    return sorted(set(out.split()) | {p.removeprefix("/dev/") for p in in_spec})


OURS_FIELD = f"elasticgpu.io/gpu={CARDS[1].uuid}"
OURS_ANNOTATION = {"cdi.k8s.io/sneaky": f"elasticgpu.io/gpu={CARDS[0].uuid}"}


@pytest.mark.parametrize(
    ("case", "asked", "outcome"),
    [
        # The proxy's test_container_without_claim_gets_no_gpu, in parts.
        ("env all", {"envs": {"NVIDIA_VISIBLE_DEVICES": "all"}}, {"cri-proxy": "void", "nri": "void"}),
        ("our CDI field", {"cdi_devices": [OURS_FIELD]}, {"cri-proxy": "void", "nri": "refused"}),
        ("our CDI annotation", {"annotations": OURS_ANNOTATION}, {"cri-proxy": "void", "nri": "refused"}),
        ("all of it", {"envs": {"NVIDIA_VISIBLE_DEVICES": "all"}, "cdi_devices": [OURS_FIELD],
                       "annotations": OURS_ANNOTATION}, {"cri-proxy": "void", "nri": "refused"}),
        ("forged claim annotation", {"annotations": {"elasticgpu.io/claim": f"{NS}/forged"}},
         {"cri-proxy": "void", "nri": "void"}),
        ("forged isolation annotation", {"annotations": {"elasticgpu.io/isolation": "None"}},
         {"cri-proxy": "void", "nri": "void"}),
        # Issue 44 item 1: a CUDA image's ENV and the pod's env of the same key. The proxy rewrites the pod's,
        # after the image's: the hook reads the last, `void`. NRI can replace one entry only: refused.
        ("image ENV all and pod env all", {"image": "cuda", "envs": {"NVIDIA_VISIBLE_DEVICES": "all"}},
         {"cri-proxy": "void", "nri": "refused"}),
        ("image ENV all", {"image": "cuda"}, {"cri-proxy": "void", "nri": "void"}),
    ],
)
def test_container_without_claim_gets_no_gpu(front: Front, nri_containerd: TestRuntime, case: str,
                                             asked: dict[str, Any], outcome: dict[str, str]) -> None:  # fmt: skip
    k = front.kubelet
    front.view.add(slice_claim(NS, "slice", user="mixed"))
    pod = k.run_pod("mixed", NS, annotations={"egpuc.elasticgpu.io/main": "slice"})  # the sidecar has none
    if asked.get("image") == "cuda":
        asked = {**asked, "image": imported_cuda_image(nri_containerd)}
    expected = outcome[front.name]
    if expected == "refused":
        with pytest.raises(grpc.RpcError) as refused:
            k.create_container(pod, "sidecar", **asked)
        assert refused.value.code() == grpc.StatusCode.UNKNOWN or refused.value.details(), case
        assert "pod team/mixed, container 'sidecar'" in (refused.value.details() or ""), refused.value.details()
        assert k.container_ids() == set()
    else:
        sidecar = k.create_container(pod, "sidecar", **asked)
        k.start(sidecar)
        assert visible(k, sidecar) == expected, case
        assert k.env(sidecar)["NVIDIA_VISIBLE_DEVICES"] == expected  # what a process sees (the last entry)
        assert card_nodes(k, sidecar) == [], case
        annotations = spec(k, sidecar).get("annotations") or {}
        assert not any(key.startswith("elasticgpu.io/") for key in annotations), annotations
        assert not any(key.startswith("cdi.k8s.io/") and "elasticgpu.io/gpu" in value
                       for key, value in annotations.items()), annotations
    assert front.rows() == []
