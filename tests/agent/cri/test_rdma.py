"""RDMA NICs for a claim's containers (issue 27; elasticgpu/agent/rdma): the CRI hook gives the
NICs of the claim's ElasticGPU through the node's RDMA room, and refuses the container when the
node lacks one, rather than start it without what the claim was promised."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from elasticgpu.agent import rdma
from elasticgpu.agent.discovery import pci
from elasticgpu.agent.discovery.models import Card
from elasticgpu.agent.injecting import claim_view, hooks, injection
from elasticgpu.agent.rdma import spec_file
from tests.agent.cri.test_injection import CARD_A, CARD_B, claim, request, view
from tests.agent.test_topology_discovery import fake_sysfs

USES_PAIR = {"egpuc.elasticgpu.io/main": "pair"}
PAIR = claim("pair", gpus=(CARD_A, CARD_B), cores=100, memory_mib=0, nics=("mlx5_0",))


def test_a_claims_nics_are_injected_next_to_its_cards() -> None:
    room = rdma.NodeNics(lambda: ["mlx5_0", "mlx5_1"], node="node-a")
    edit = injection.decide(request(USES_PAIR, devices=["elasticgpu.io/rdma=mlx5_9", "vendor.com/x=1"]),
                            view(PAIR), nics=room)
    assert edit.cdi_devices == ("vendor.com/x=1", f"elasticgpu.io/gpu={CARD_A}", f"elasticgpu.io/gpu={CARD_B}",
                                "elasticgpu.io/rdma=mlx5_0")  # a NIC the spec named itself is ours: dropped
    # A claim without NICs gets none, whatever the node has.
    no_nics = injection.decide(request(USES_PAIR), view(replace(PAIR, nics=())), nics=room)
    assert not [d for d in no_nics.cdi_devices if d.startswith("elasticgpu.io/rdma=")]


def test_a_missing_nic_refuses_the_container_and_says_why() -> None:
    with pytest.raises(hooks.Refused, match=r"claim team/pair: RDMA NIC mlx5_0 .* is not on node node-a \(it has: "
                                            r"mlx5_1\)"):
        injection.decide(request(USES_PAIR), view(PAIR), nics=rdma.NodeNics(lambda: ["mlx5_1"], node="node-a"))
    with pytest.raises(hooks.Refused, match="this node's elasticgpu agent gives none"):
        injection.decide(request(USES_PAIR), view(PAIR))  # the default room: no NICs


def test_the_nics_are_read_from_the_elastic_gpu() -> None:
    claim_obj = {"metadata": {"namespace": "ns", "name": "c", "uid": "u"}, "spec": {"elasticGPUName": "egpu-u"},
                 "status": {"phase": "Bound"}}
    egpu = {"spec": {"claimRef": {"namespace": "ns", "name": "c", "uid": "u"},
                     "physicalGPU": {"gpuNames": ["gpu-1"], "rdmaNics": ["mlx5_0"]}},
            "status": {"gpus": ["GPU-1"], "nodeName": "n", "capacity": {"nvidia.com/gpu": 1}}}
    assert claim_view.claim_info(claim_obj, egpu).nics == ("mlx5_0",)
    del egpu["spec"]["physicalGPU"]["rdmaNics"]
    assert claim_view.claim_info(claim_obj, egpu).nics == ()


def test_the_cdi_spec_names_each_nics_verbs_device(tmp_path: Path) -> None:
    sysfs = fake_sysfs(tmp_path / "sys")
    card = Card(index=0, uuid="GPU-1", model="m", memory_mib=1, minor=0, device_path="/dev/nvidia0",
                pcie_root="0000:00:01.0", nics=("mlx5_0", "mlx5_gone"))
    nics = spec_file.nic_devices([card], lambda nic: [(p, p) for p in pci.verbs_devices(nic, sysfs)])
    assert [n.name for n in nics] == ["mlx5_0"]  # mlx5_gone has no verbs device: left out
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    assert spec_file.write_spec(cdi, nics) is True
    assert spec_file.write_spec(cdi, nics) is False  # unchanged: not rewritten
    spec = json.loads((cdi / rdma.SPEC_FILE).read_text())
    assert spec["kind"] == "elasticgpu.io/rdma"
    assert spec["devices"] == [{"name": "mlx5_0", "containerEdits": {"deviceNodes": [
        {"path": "/dev/infiniband/uverbs3", "hostPath": "/dev/infiniband/uverbs3"},
        {"path": "/dev/infiniband/rdma_cm", "hostPath": "/dev/infiniband/rdma_cm"}]}}]
    with pytest.raises(ValueError, match="cannot be a CDI device name"):
        spec_file.write_spec(cdi, [rdma.NicDevices(name="bad name", nodes=())])
