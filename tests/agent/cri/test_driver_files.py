"""The CDI spec carries the driver (19.1): libraries, binaries, firmware, read-only, inside a real container.

The simulated backend writes a stand-in driver root for the version in its YAML; the agent's
spec mounts it; a claimed container on the test containerd (through the proxy with the claim
hooks) finds libcuda.so.1, nvidia-smi and the firmware, read-only, and a container without a
claim finds none of them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml

from elasticgpu.agent.cri.proxy import CriProxy, ProxySettings
from elasticgpu.agent.discovery.simulated import SimulatedBackend
from elasticgpu.agent.injecting import cdi, claim_hooks, driver
from elasticgpu.agent.ledger import store
from tests.agent.cri.kubelet import Kubelet
from tests.agent.cri.node import CARDS, View, slice_claim
from tests.containerd_runtime import TestRuntime

VERSION = "550.54.15"
NS = "team"
LIBS = "/usr/lib/x86_64-linux-gnu"


def backend(tmp: Path) -> SimulatedBackend:
    description = {
        "driver": {"version": VERSION, "cuda": "12.4"},
        "cards": [{"uuid": card.uuid, "memory": card.memory_mib, "model": "NVIDIA A100"} for card in CARDS],
    }
    return SimulatedBackend(description, node_name="node-a", device_dir=tmp / "dev")


def test_spec_lists_the_driver_read_only(tmp_path: Path) -> None:
    sim = backend(tmp_path)
    root = sim.driver_root()
    assert root is not None
    files = driver.find(version=VERSION, driver_root=root, nvidia_ctk="")
    spec = cdi.build_spec(cdi.card_devices(sim.snapshot().cards), cdi.control_nodes(sim.control_device_paths()), files)
    mounts = {m["containerPath"]: m for m in spec["containerEdits"]["mounts"]}
    assert mounts[f"{LIBS}/libcuda.so.{VERSION}"]["hostPath"] == f"{root}{LIBS}/libcuda.so.{VERSION}"
    # The soname the loader asks for is the same file (no create-symlinks hook needed).
    assert mounts[f"{LIBS}/libcuda.so.1"]["hostPath"] == f"{root}{LIBS}/libcuda.so.{VERSION}"
    assert mounts[f"{LIBS}/libnvidia-ml.so.1"]["hostPath"] == f"{root}{LIBS}/libnvidia-ml.so.{VERSION}"
    assert f"{LIBS}/libnvidia-ptxjitcompiler.so.{VERSION}" in mounts
    assert f"{LIBS}/libcudadebugger.so.{VERSION}" in mounts
    assert "/usr/bin/nvidia-smi" in mounts
    assert f"/lib/firmware/nvidia/{VERSION}" in mounts
    assert all(m["options"] == ["ro", "nosuid", "nodev", "bind"] for m in mounts.values())
    assert "hooks" not in spec["containerEdits"]  # no nvidia-ctk: no hook
    assert files.missing == ()


def test_ldcache_hook_when_nvidia_ctk_is_there(tmp_path: Path) -> None:
    root = backend(tmp_path).driver_root()
    assert root is not None
    ctk = tmp_path / "nvidia-ctk"
    ctk.write_text("#!/bin/sh\n")
    ctk.chmod(0o755)
    files = driver.find(version=VERSION, driver_root=root, nvidia_ctk=str(ctk))
    assert files.hooks() == [{"hookName": "createContainer", "path": str(ctk),
                              "args": ["nvidia-ctk", "hook", "update-ldcache", "--folder", LIBS]}]


def test_a_version_that_is_no_file_name_finds_nothing(tmp_path: Path) -> None:
    root = backend(tmp_path).driver_root()
    assert root is not None
    files = driver.find(version="../../etc", driver_root=root)
    assert files.mounts == () and files.missing


@pytest.fixture
def node(containerd: TestRuntime, proxy_socket: Path, tmp_path: Path) -> Iterator[tuple[View, Kubelet]]:
    sim = backend(containerd.directory / "sim")
    root = sim.driver_root()
    assert root is not None
    cdi.write_spec(containerd.cdi_dir, cdi.card_devices(sim.snapshot().cards),
                   cdi.control_nodes(sim.control_device_paths()),
                   driver.DriverLocator(driver_root=lambda: root).files(sim.snapshot().driver.driver_version))
    view = View()
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    hooks = claim_hooks.ClaimHooks(view=view, ledger=ledger)
    settings = ProxySettings(listen=proxy_socket, upstream=str(containerd.socket))
    with CriProxy(settings, container_hooks=hooks) as proxy, Kubelet(f"unix://{proxy_socket}", containerd.image) as k:
        assert proxy.reconciled.wait(10)
        yield view, k
    hooks.close()
    ledger.close()


def test_claimed_container_finds_the_driver_read_only(node: tuple[View, Kubelet]) -> None:
    view, k = node
    view.add(slice_claim(NS, "slice", user="trainer"))
    pod = k.run_pod("trainer", NS, annotations={"egpuc.elasticgpu.io/main": "slice"})
    main = k.create_container(pod, "main")
    k.start(main)
    code, out = k.exec(main, "cat", f"{LIBS}/libcuda.so.1")
    assert code == 0 and f"NVIDIA driver {VERSION}" in out, out
    code, out = k.exec(main, "/usr/bin/nvidia-smi", "-L")
    assert code == 0 and out.strip() == f"GPU 0: Simulated GPU (UUID: {CARDS[0].uuid})", out
    code, out = k.exec(main, "ls", f"/lib/firmware/nvidia/{VERSION}")
    assert code == 0 and "gsp_ga10x.bin" in out, out
    code, out = k.exec(main, "sh", "-c", f"echo x > {LIBS}/libcuda.so.1")
    assert code != 0 and "Read-only" in out, out
    code, out = k.exec(main, "cat", "/proc/self/mountinfo")
    line = next(line for line in out.splitlines() if f" {LIBS}/libcuda.so.1 " in line)
    assert {"ro", "nosuid", "nodev"} <= set(line.split()[5].split(",")), line

    # A container of the same pod without a claim gets no driver files.
    other = k.create_container(pod, "sidecar")
    k.start(other)
    code, out = k.exec(other, "sh", "-c", f"ls {LIBS}/libcuda.so.1 /usr/bin/nvidia-smi 2>&1; true")
    assert "No such file" in out and out.count("No such file") == 2, out


def test_stand_in_root_matches_yaml_version(tmp_path: Path) -> None:
    sim = SimulatedBackend(yaml.safe_load("driver: {version: '535.1', cuda: '12.2'}\ncards: [{memory: 1024}]"),
                           node_name="n", device_dir=tmp_path)
    root = Path(str(sim.driver_root()))
    assert (root / "usr/lib/x86_64-linux-gnu/libcuda.so.535.1").is_file()
    assert os.access(root / "usr/bin/nvidia-smi", os.X_OK)
    assert sim.snapshot().driver.driver_version == "535.1"


@pytest.mark.parametrize("status", [0, 3])
def test_the_ldcache_hook_runs_when_a_claimed_container_is_created(
    containerd: TestRuntime, proxy_socket: Path, tmp_path: Path, status: int
) -> None:
    """The runtime runs the hook the spec names: a stand-in nvidia-ctk that fails makes the container fail."""
    sim = backend(containerd.directory / "sim")
    ctk = containerd.directory / "nvidia-ctk"
    ctk.write_text(f"#!/bin/sh\nexit {status}\n")
    ctk.chmod(0o755)
    files = driver.find(version=VERSION, driver_root=str(sim.driver_root()), nvidia_ctk=str(ctk))
    assert files.hooks()
    cdi.write_spec(containerd.cdi_dir, cdi.card_devices(sim.snapshot().cards),
                   cdi.control_nodes(sim.control_device_paths()), files)
    view = View()
    view.add(slice_claim(NS, "slice", user="trainer"))
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    hooks = claim_hooks.ClaimHooks(view=view, ledger=ledger)
    settings = ProxySettings(listen=proxy_socket, upstream=str(containerd.socket))
    try:
        with CriProxy(settings, container_hooks=hooks) as proxy, Kubelet(f"unix://{proxy_socket}",
                                                                        containerd.image) as k:
            assert proxy.reconciled.wait(10)
            pod = k.run_pod("trainer", NS, annotations={"egpuc.elasticgpu.io/main": "slice"})
            if status == 0:
                k.start(k.create_container(pod, "main"))
            else:
                with pytest.raises(grpc.RpcError) as failed:
                    k.start(k.create_container(pod, "main"))
                assert "hook" in str(failed.value.details()).lower(), failed.value.details()
    finally:
        hooks.close()
        ledger.close()


def test_soname_is_read_from_the_library() -> None:
    libc = next((p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6") if os.path.exists(p)), None)
    if libc is None:
        pytest.skip("no libc.so.6 at the usual places")
    assert driver.elf_soname(libc) == "libc.so.6"
    assert driver.elf_soname("/bin/sh") is None or "/" not in str(driver.elf_soname("/bin/sh"))
    assert driver.elf_soname("/nonexistent") is None


def test_a_library_s_own_soname_is_mounted(tmp_path: Path) -> None:
    """A real ELF under the name of a driver library whose soname the table does not know: its DT_SONAME is used."""
    real = next(iter(sorted(Path("/lib/x86_64-linux-gnu").glob("libz.so.1.*"))), None)
    if real is None:
        pytest.skip("no libz.so.1.* to stand in for an ELF library")
    folder = tmp_path / LIBS.lstrip("/")
    folder.mkdir(parents=True)
    (folder / f"libnvidia-gpucomp.so.{VERSION}").write_bytes(real.read_bytes())
    files = driver.find(version=VERSION, driver_root=str(tmp_path), nvidia_ctk="")
    assert {m.container_path for m in files.mounts} == {f"{LIBS}/libnvidia-gpucomp.so.{VERSION}", f"{LIBS}/libz.so.1"}


def test_the_node_s_own_mps_pipe_folder_never_reaches_a_claim_container(tmp_path: Path) -> None:
    """Issue 44's audit: an MPS daemon someone else runs on the node (NVIDIA's device plugin, an admin) keeps its
    pipes in the node's /tmp/nvidia-mps; mounted into every claim container, any tenant of the node could talk to
    it (`quit` included). The product's MPS mode gives each card a pipe folder of its own (docs/isolation.md), so
    the spec mounts none of the node's; the node's daemon sockets (persistenced, fabric manager) stay."""
    sim = backend(tmp_path / "sim")
    root = sim.driver_root()
    assert root is not None
    host = tmp_path / "host"
    (host / "tmp" / "nvidia-mps").mkdir(parents=True)
    (host / "tmp" / "nvidia-mps" / "control").write_text("")
    (host / "var" / "run" / "nvidia-persistenced").mkdir(parents=True)
    (host / "var" / "run" / "nvidia-persistenced" / "socket").write_text("")
    # The driver root is seen through the host root by the agent: the stand-in's path, as a path on `host`.
    (host / root.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(root, host / root.lstrip("/"))
    files = driver.find(version=VERSION, driver_root=root, host_root=str(host), nvidia_ctk="")
    paths = {m.container_path for m in files.mounts}
    assert "/var/run/nvidia-persistenced/socket" in paths  # the node's daemons that every CUDA process may ask
    assert f"{LIBS}/libcuda.so.{VERSION}" in paths
    assert not [p for p in paths if p.startswith("/tmp/nvidia-mps")], sorted(paths)
