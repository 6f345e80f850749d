"""The CDI spec (elasticgpu/agent/injecting/cdi.py) as the real containerd reads it: device nodes appear."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from elasticgpu.agent.injecting import cdi
from tests.agent.cri.kubelet import Kubelet
from tests.agent.cri.node import CARDS as NODE_CARDS
from tests.agent.cri.node import stand_ins
from tests.containerd_runtime import TestRuntime

CARDS = {card.uuid: card.index for card in NODE_CARDS}


def device_nodes(kubelet: Kubelet, container_id: str) -> dict[str, str]:
    """/dev/nvidia* inside the container: name -> 'type major:minor'."""
    code, out = kubelet.exec(
        container_id, "sh", "-c", "for f in /dev/nvidia*; do [ -e $f ] && stat -c '%n %F %t:%T' $f; done; true"
    )
    assert code == 0, out
    result = {}
    for line in out.splitlines():
        name, rest = line.split(" ", 1)
        result[name] = rest
    return result


def test_spec_is_written_atomically_and_only_when_changed(tmp_path: Path) -> None:
    cards, control = stand_ins(tmp_path / "dev")
    assert cdi.write_spec(tmp_path / "cdi", cards, control) is True
    assert cdi.write_spec(tmp_path / "cdi", list(reversed(cards)), control) is False  # same spec
    assert [p.name for p in (tmp_path / "cdi").iterdir()] == [cdi.SPEC_FILE]  # no temporary left
    spec = json.loads((tmp_path / "cdi" / cdi.SPEC_FILE).read_text())
    assert spec["cdiVersion"] == "0.6.0" and spec["kind"] == "elasticgpu.io/gpu"
    assert [d["name"] for d in spec["devices"]] == sorted(CARDS)
    assert cdi.write_spec(tmp_path / "cdi", cards[:1], control) is True
    assert len(json.loads((tmp_path / "cdi" / cdi.SPEC_FILE).read_text())["devices"]) == 1


def test_a_bad_uuid_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot be a CDI device name"):
        cdi.write_spec(tmp_path, [cdi.CardDevice(uuid="GPU 1/2", minor=0)], [])
    assert not (tmp_path / cdi.SPEC_FILE).exists()


@pytest.mark.parametrize("form", ["field", "annotation", "both"])
def test_device_nodes_appear_in_the_container(containerd: TestRuntime, kubelet: Kubelet, form: str) -> None:
    cards, control = stand_ins(containerd.directory / "dev")
    cdi.write_spec(containerd.cdi_dir, cards, control)
    second = "elasticgpu.io/gpu=GPU-11111111-2222-3333-4444-555555555501"
    pod = kubelet.run_pod(f"cdi-{form}")
    with_card = kubelet.create_container(
        pod,
        "gpu",
        cdi_devices=[second] if form in ("field", "both") else None,
        annotations={"cdi.k8s.io/elasticgpu": second} if form in ("annotation", "both") else None,
    )
    without = kubelet.create_container(pod, "plain")
    for container_id in (with_card, without):
        kubelet.start(container_id)
    assert device_nodes(kubelet, with_card) == {
        "/dev/nvidia1": "character special file c3:1",
        "/dev/nvidiactl": "character special file c3:ff",
        "/dev/nvidia-uvm": "character special file c3:fa",
        "/dev/nvidia-uvm-tools": "character special file c3:fb",
    }
    assert device_nodes(kubelet, without) == {}


def test_runtime_reads_a_rewritten_spec(containerd: TestRuntime, kubelet: Kubelet) -> None:
    cards, control = stand_ins(containerd.directory / "dev")
    first = "elasticgpu.io/gpu=GPU-11111111-2222-3333-4444-555555555500"
    cdi.write_spec(containerd.cdi_dir, cards[1:], control)  # the first card is not published yet
    pod = kubelet.run_pod("cdi-rewrite")
    with pytest.raises(grpc.RpcError) as raised:
        kubelet.create_container(pod, "early", cdi_devices=[first])
    assert "unresolvable CDI devices" in (raised.value.details() or "")
    cdi.write_spec(containerd.cdi_dir, cards, control)
    container_id = kubelet.create_container(pod, "late", cdi_devices=[first])
    kubelet.start(container_id)
    assert "/dev/nvidia0" in device_nodes(kubelet, container_id)
