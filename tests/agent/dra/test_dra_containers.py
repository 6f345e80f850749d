"""The node hook leaves a container kubelet prepared through DRA as kubelet made it, and only such a
container: the proof is the driver's checkpoint (the claims reserved for that pod), never what the
pod itself may write (a cdi.k8s.io/ annotation, another pod's claim)."""

from __future__ import annotations

from pathlib import Path

from elasticgpu.agent.dra import checkpoint
from elasticgpu.agent.injecting import injection
from tests.agent.cri.test_injection import CARD_A, CARD_B, OTHER_POD, POD, request, view

CARD = f"elasticgpu.io/gpu={CARD_A}"
CLAIM = "elasticgpu.io/claim=uid-claim"


def prepared(tmp_path: Path) -> checkpoint.Checkpoint:
    store = checkpoint.Checkpoint(tmp_path / "dra.json")
    device = checkpoint.PreparedDevice(requests=("gpu",), pool="node-a", device="gpu-0", uuid=CARD_A,
                                       cdi_ids=(CARD, CLAIM), cores=100, memory_mib=81920)  # fmt: skip
    store.put(checkpoint.ClaimEntry(uid="uid-claim", namespace="team", name="c", state=checkpoint.COMPLETED,
                                    devices=(device,), pods=(POD.uid,)))  # fmt: skip
    return store


def test_a_dra_container_keeps_its_devices_and_env(tmp_path: Path) -> None:
    store = prepared(tmp_path)
    edit = injection.decide(request(devices=[CARD, CLAIM], envs=[("NVIDIA_VISIBLE_DEVICES", CARD_A)]), view(),
                            dra_devices=store.devices_of_pod(POD.uid))  # fmt: skip
    assert edit.cdi_devices == (CARD, CLAIM)
    assert dict(edit.envs)["NVIDIA_VISIBLE_DEVICES"] == CARD_A  # not void
    assert edit.claim is None


def test_another_pod_naming_the_same_devices_is_neutralised(tmp_path: Path) -> None:
    store = prepared(tmp_path)
    edit = injection.decide(request(devices=[CARD, CLAIM], pod=OTHER_POD), view(),
                            dra_devices=store.devices_of_pod(OTHER_POD.uid))  # fmt: skip
    assert edit.cdi_devices == ()
    assert dict(edit.envs)["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_a_device_beyond_the_prepared_ones_makes_it_no_dra_container(tmp_path: Path) -> None:
    store = prepared(tmp_path)
    edit = injection.decide(request(devices=[CARD, CLAIM, f"elasticgpu.io/gpu={CARD_B}"]), view(),
                            dra_devices=store.devices_of_pod(POD.uid))  # fmt: skip
    assert edit.cdi_devices == ()
    assert dict(edit.envs)["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_a_forged_cdi_annotation_is_dropped_even_in_a_dra_container(tmp_path: Path) -> None:
    store = prepared(tmp_path)
    edit = injection.decide(request(devices=[CARD, CLAIM],
                                    container_annotations={"cdi.k8s.io/x": f"elasticgpu.io/gpu={CARD_B}"}),
                            view(), dra_devices=store.devices_of_pod(POD.uid))  # fmt: skip
    assert edit.cdi_devices == (CARD, CLAIM)
    assert "cdi.k8s.io/x" not in edit.annotations


def test_a_started_claim_is_not_yet_proof(tmp_path: Path) -> None:
    store = prepared(tmp_path)
    entry = store.get("uid-claim")
    assert entry is not None
    store.put(checkpoint.ClaimEntry(**{**entry.__dict__, "state": checkpoint.STARTED}))
    assert store.devices_of_pod(POD.uid) == frozenset()
