"""What the agent publishes of a card's topology (issue 27 item 3): PCIe root and RDMA NICs,
from sysfs on real nodes and from the simulation file otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from elasticgpu.agent import errors
from elasticgpu.agent.discovery import pci
from elasticgpu.agent.discovery.models import Card
from elasticgpu.agent.inventory import gpu_spec
from elasticgpu.api.gpu import GPU
from tests.agent.test_discovery import NODE, open_sim


def fake_sysfs(root: Path) -> Path:
    """A sysfs tree as the kernel lays it out: two root ports, a card and a NIC under the first,
    a card alone under the second, and a soft-RoCE device on no PCI bus."""
    devices = root / "devices/pci0000:00"
    gpu0 = devices / "0000:00:01.0/0000:05:00.0/0000:07:00.0"
    nic0 = devices / "0000:00:01.0/0000:05:01.0/0000:08:00.0"
    gpu1 = devices / "0000:00:03.0/0000:0a:00.0"
    for d in (gpu0, nic0, gpu1, nic0 / "infiniband_verbs/uverbs3", root / "devices/virtual/rxe0"):
        d.mkdir(parents=True)
    bus = root / "bus/pci/devices"
    bus.mkdir(parents=True)
    for d in (gpu0, nic0, gpu1):
        (bus / d.name).symlink_to(d)
    ib = root / "class/infiniband"
    (ib / "mlx5_0").mkdir(parents=True)
    (ib / "mlx5_0/device").symlink_to(nic0)
    (ib / "rxe0").mkdir()
    (ib / "rxe0/device").symlink_to(root / "devices/virtual/rxe0")
    return root


def test_roots_and_nics_from_sysfs(tmp_path: Path) -> None:
    sysfs = fake_sysfs(tmp_path / "sys")
    assert pci.pcie_root_of("0000:07:00.0", sysfs) == "0000:00:01.0"
    assert pci.pcie_root_of("0000:0a:00.0", sysfs) == "0000:00:03.0"
    assert pci.pcie_root_of("0000:99:00.0", sysfs) == ""  # not there: unknown, not an error
    assert pci.rdma_nics_by_root(sysfs) == {"0000:00:01.0": ("mlx5_0",)}  # rxe0 is on no PCI root
    assert pci.rdma_nics_by_root(tmp_path / "nothing") == {}
    assert pci.verbs_devices("mlx5_0", sysfs) == ("/dev/infiniband/uverbs3", "/dev/infiniband/rdma_cm")
    assert pci.verbs_devices("rxe0", sysfs) == ()


def test_simulated_cards_carry_root_and_nics_into_the_gpu_object(tmp_path: Path) -> None:
    backend = open_sim(tmp_path, {"cards": [
        {"memory": "80Gi", "numa": 0, "pcieRoot": "0000:00:01.0", "nics": ["mlx5_1", "mlx5_0"], "links": [1]},
        {"memory": "80Gi", "numa": 1},
    ]})
    a, b = backend.snapshot().cards
    assert (a.pcie_root, a.nics) == ("0000:00:01.0", ("mlx5_0", "mlx5_1"))
    assert (b.pcie_root, b.nics) == ("", ())
    spec = gpu_spec(a, NODE)
    gpu = GPU.model_validate({"metadata": {"name": a.uuid.lower()}, "spec": spec})
    assert gpu.spec.pcie_root == "0000:00:01.0" and gpu.spec.nics == ["mlx5_0", "mlx5_1"]
    assert gpu.spec.numa == 0 and gpu.spec.links == [b.uuid]
    assert "pcieRoot" not in gpu_spec(b, NODE) and "nics" not in gpu_spec(b, NODE)


def test_bad_nics_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(errors.SimulationInvalid, match=r"cards\[0\]\.nics: must be a list of RDMA device names"):
        open_sim(tmp_path, {"cards": [{"memory": 1024, "nics": "mlx5_0"}]}).snapshot()


def test_card_defaults_have_no_topology() -> None:
    card = Card(index=0, uuid="GPU-1", model="m", memory_mib=1, minor=0, device_path="/dev/nvidia0")
    assert card.pcie_root == "" and card.nics == ()


def test_simulated_nics_get_stand_in_verbs_devices(tmp_path: Path) -> None:
    backend = open_sim(tmp_path, {"cards": [
        {"memory": 1024, "pcieRoot": "r0", "nics": ["mlx5_1"]}, {"memory": 1024, "pcieRoot": "r1", "nics": ["mlx5_0"]},
    ]})
    nodes = backend.rdma_device_nodes("mlx5_1")
    assert [path for path, _ in nodes] == ["/dev/infiniband/uverbs1", "/dev/infiniband/rdma_cm"]
    for _, host in nodes:
        assert Path(host).is_relative_to(tmp_path / "dev") and (Path(host).is_symlink() or Path(host).exists())
    assert backend.rdma_device_nodes("mlx5_9") == []
