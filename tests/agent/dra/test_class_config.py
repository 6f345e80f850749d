"""The isolation of a DRA slice is its DeviceClass's (issue 48): read at prepare from the allocation's opaque
config of source FromClass, kept in the checkpoint (so the node hook applies it across agent restarts); a
claim's own config (FromClaim) cannot change it, and a config we cannot read is refused naming the field."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from elasticgpu.agent import policing
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


# The over-limit policy (issue 48, follow-up): the class's, kept in the checkpoint, which policing reads by uid.
def policing_config(source: str = "FromClass", **fields: object) -> dict[str, Any]:
    config = isolation("None", source, **fields)
    del config["opaque"]["parameters"]["mode"]  # a config may name only the policy
    return config


def test_the_class_s_policy_is_kept_and_read_back_for_policing(tmp_path: Path) -> None:
    claim = resource_claim(isolation("MPS", overLimitAction="StopContainer", overLimitGraceSeconds=15))
    entry = preparer(tmp_path, claim).prepare(REF)
    assert (entry.isolation, entry.over_limit_action, entry.over_limit_grace_s) == ("MPS", "StopContainer", 15)
    kept = checkpoint.Checkpoint(tmp_path / "cp.json")
    assert kept.policy_of("u-1") == policing.Policy(action="StopContainer", grace_s=15.0)
    assert kept.policy_of("u-other") is None  # not prepared here: policing only warns


def test_a_class_without_a_policy_warns_after_60_s(tmp_path: Path) -> None:
    entry = preparer(tmp_path, resource_claim(isolation("MPS"))).prepare(REF)
    assert (entry.over_limit_action, entry.over_limit_grace_s) == ("Warn", 60)
    assert checkpoint.Checkpoint(tmp_path / "cp.json").policy_of("u-1") == policing.Policy(action="Warn", grace_s=60)


@pytest.mark.parametrize(("field", "value", "given"), [
    ("overLimitAction", "Warn", "StopContainer"), ("overLimitGraceSeconds", 3600, "30"),
    ("overLimitGraceSeconds", 0, "30")])  # fmt: skip
def test_a_claim_s_own_config_cannot_change_the_class_s_policy(tmp_path: Path, field: str, value: object,
                                                               given: str) -> None:  # fmt: skip
    claim = resource_claim(policing_config(overLimitAction="StopContainer", overLimitGraceSeconds=30),
                           policing_config("FromClaim", **{field: value}))  # fmt: skip
    with pytest.raises(preparing.ClaimRefused, match=rf"spec.devices.config asks over-limit .* {value} for driver"
                                                     rf" gpu.elasticgpu.io, but its DeviceClass gives {given}.*"
                                                     rf"Remove {field} from the claim's Isolation config"):
        preparer(tmp_path, claim).prepare(REF)
    assert checkpoint.Checkpoint(tmp_path / "cp.json").entries() == {}


def test_a_claim_config_naming_the_class_s_policy_or_only_a_mode_is_fine(tmp_path: Path) -> None:
    claim = resource_claim(isolation("HAMiCore", overLimitAction="StopContainer", overLimitGraceSeconds=5),
                           policing_config("FromClaim", overLimitAction="StopContainer"),
                           isolation("HAMiCore", "FromClaim"))  # fmt: skip
    entry = preparer(tmp_path, claim).prepare(REF)
    assert (entry.isolation, entry.over_limit_action, entry.over_limit_grace_s) == ("HAMiCore", "StopContainer", 5)


@pytest.mark.parametrize(("fields", "message"), [
    ({"overLimitAction": "Kill"}, r"names overLimitAction 'Kill'; use one of Warn, StopContainer"),
    ({"overLimitGraceSeconds": -1}, r"names overLimitGraceSeconds -1: must be 0 or more"),
    ({"overLimitGraceSeconds": "60"}, r"names overLimitGraceSeconds '60': must be 0 or more"),
    ({"overLimitGraceSeconds": True}, r"names overLimitGraceSeconds True"),
    ({"overlimitAction": "StopContainer"}, r"has unknown field\(s\) overlimitAction; its fields are apiVersion, kind,"),
])  # fmt: skip
def test_a_policy_we_cannot_read_is_refused_naming_the_field(tmp_path: Path, fields: dict[str, object],
                                                             message: str) -> None:  # fmt: skip
    where = r"rc \(uid u-1\): the DeviceClass's config for gpu.elasticgpu.io"
    with pytest.raises(preparing.ClaimRefused, match=rf"{where} {message}"):
        preparer(tmp_path, resource_claim(policing_config(**fields))).prepare(REF)


def test_classes_of_two_policies_for_one_claim_are_refused() -> None:
    allocation = {"devices": {"config": [policing_config(overLimitAction="Warn"),
                                         policing_config(overLimitAction="StopContainer")]}}  # fmt: skip
    with pytest.raises(class_config.ConfigRefused, match="several over-limit actions \\(StopContainer, Warn\\)"):
        class_config.read(allocation, ["gpu"], claim="c")


def test_a_checkpoint_entry_of_an_older_agent_warns(tmp_path: Path) -> None:
    """An entry written before the policy was kept (no such keys) reads as Warn, as that agent policed it."""
    preparer(tmp_path, resource_claim(isolation("MPS", overLimitAction="StopContainer"))).prepare(REF)
    path = tmp_path / "cp.json"
    document = json.loads(path.read_text())
    for entry in document["claims"].values():
        del entry["over_limit_action"], entry["over_limit_grace_s"]
    document["checksum"] = hashlib.sha256(json.dumps(document["claims"], sort_keys=True).encode()).hexdigest()
    path.write_text(json.dumps(document))
    assert checkpoint.Checkpoint(path).policy_of("u-1") == policing.Policy(action="Warn", grace_s=60)
