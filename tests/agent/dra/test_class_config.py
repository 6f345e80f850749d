"""The isolation of a DRA slice is its DeviceClass's (issue 48): read at prepare from the allocation's opaque
config of source FromClass, kept in the checkpoint (so the node hook applies it across agent restarts); a
claim's own config (FromClaim) cannot change it, and a config we cannot read is refused naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from elasticgpu.agent.dra import checkpoint, claim_cdi, class_config, preparing

UUID = "GPU-0a1b2c3d-0000-0000-0000-00000000000a"
GPU = {"metadata": {"name": "gpu-a"}, "spec": {"index": 0, "uuid": UUID, "memory": 81920, "owner": "DRA"},
       "status": {"owner": "DRA"}}  # fmt: skip


def isolation(mode: object, source: str = "FromClass", **extra: object) -> dict[str, Any]:
    parameters = {"apiVersion": "gpu.elasticgpu.io/v1", "kind": "Isolation", "mode": mode, **extra}
    return {"source": source, "opaque": {"driver": "gpu.elasticgpu.io", "parameters": parameters}}


def resource_claim(*configs: dict[str, Any], consumed: dict[str, str] | None = None) -> dict[str, Any]:
    result = {"request": "gpu", "driver": "gpu.elasticgpu.io", "pool": "node-a", "device": "gpu-0",
              "consumedCapacity": consumed if consumed is not None else {"cores": "30", "memory": "10Gi"}}  # fmt: skip
    return {"metadata": {"name": "rc", "namespace": "team", "uid": "u-1"},
            "status": {"allocation": {"devices": {"results": [result], "config": list(configs)}},
                       "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-1"}]}}  # fmt: skip


def preparer(tmp_path: Path, claim: dict[str, Any]) -> preparing.Preparer:
    return preparing.Preparer(node="node-a", read_claim=lambda namespace, name: claim, list_gpus=lambda: [GPU],
                              store=checkpoint.Checkpoint(tmp_path / "cp.json"), cdi_dir=tmp_path / "cdi")  # fmt: skip


REF = preparing.ClaimRef(namespace="team", name="rc", uid="u-1")


def test_the_class_s_mode_is_kept_and_its_env_left_to_the_room(tmp_path: Path) -> None:
    entry = preparer(tmp_path, resource_claim(isolation("MPS"))).prepare(REF)
    assert entry.isolation == "MPS"
    assert list(entry.env) == [f"NVIDIA_VISIBLE_DEVICES={UUID}"]  # the MPS room's env comes through the hook
    (claim,) = checkpoint.Checkpoint(tmp_path / "cp.json").claims_of_pod("pod-1")  # what a restarted agent reads
    assert (claim.isolation, claim.cores, claim.memory_mib, claim.whole_cards) == ("MPS", 30, 10240, False)
    assert set(claim.cdi_ids) == {claim_cdi.card_id(UUID), claim_cdi.device_id("u-1")}


def test_without_a_class_config_a_slice_is_mode_none_with_advisory_env(tmp_path: Path) -> None:
    entry = preparer(tmp_path, resource_claim()).prepare(REF)
    assert entry.isolation == "None"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30" in entry.env


def test_a_whole_card_is_whole(tmp_path: Path) -> None:
    preparer(tmp_path, resource_claim(isolation("MPS"), consumed={})).prepare(REF)
    (claim,) = checkpoint.Checkpoint(tmp_path / "cp.json").claims_of_pod("pod-1")
    assert (claim.whole_cards, claim.cores, claim.memory_mib) == (True, 100, 0)


@pytest.mark.parametrize("weaker", ["None", "HAMiCore"])
def test_a_claim_s_own_config_cannot_change_the_class_s_mode(tmp_path: Path, weaker: str) -> None:
    claim = resource_claim(isolation("MPS"), isolation(weaker, "FromClaim"))
    with pytest.raises(preparing.ClaimRefused, match=rf"spec.devices.config asks isolation mode {weaker}.*gives MPS"):
        preparer(tmp_path, claim).prepare(REF)
    assert checkpoint.Checkpoint(tmp_path / "cp.json").entries() == {}  # nothing prepared


def test_a_claim_config_naming_the_class_s_mode_is_fine(tmp_path: Path) -> None:
    entry = preparer(tmp_path, resource_claim(isolation("MPS"), isolation("MPS", "FromClaim"))).prepare(REF)
    assert entry.isolation == "MPS"


def test_a_claim_config_cannot_choose_a_mode_on_a_class_without_one(tmp_path: Path) -> None:
    with pytest.raises(preparing.ClaimRefused, match=r"asks isolation mode MPS.*gives None"):
        preparer(tmp_path, resource_claim(isolation("MPS", "FromClaim"))).prepare(REF)


def test_an_unknown_mode_or_version_is_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(preparing.ClaimRefused, match=r"DeviceClass's config .* names isolation mode 'Strong'; use"):
        preparer(tmp_path, resource_claim(isolation("Strong"))).prepare(REF)
    bad = isolation("MPS")
    bad["opaque"]["parameters"]["apiVersion"] = "gpu.elasticgpu.io/v2"
    with pytest.raises(preparing.ClaimRefused, match=r"apiVersion 'gpu\.elasticgpu\.io/v2'; write"):
        preparer(tmp_path, resource_claim(bad)).prepare(REF)


def test_configs_of_other_drivers_and_other_requests_are_not_ours() -> None:
    other_driver = {"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com", "parameters": {"kind": "Isolation"}}}
    other_request = {**isolation("None", "FromClaim"), "requests": ["other"]}
    allocation = {"devices": {"config": [isolation("HAMiCore"), other_driver, other_request]}}
    assert class_config.isolation_mode(allocation, ["gpu"], claim="c") == "HAMiCore"
    assert class_config.isolation_mode(allocation, ["gpu/sub"], claim="c") == "HAMiCore"
