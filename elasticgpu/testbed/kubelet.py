"""Kubernetes' own kubelet (elasticgpu-k8s kubelet) as one node of the real control plane, on a
container runtime given by its CRI socket (the node's containerd, or the agent's CRI proxy in front
of it): the box's node (`box`), and the tests' nodes (tests/realcluster/kubelet.py re-exports it).

What it needs on these machines (testcluster/README.md, "kubelet", says what was found):

* root (mounts of volumes, cgroups, the runtime's sockets);
* cgroups: the machines run cgroup v1 (hybrid: v1 controllers, an empty v2 `unified`); kubelet
  1.35+ refuses v1 unless ``failCgroupV1: false``. ``cgroupDriver: cgroupfs`` (runc of the test
  containerd uses cgroupfs, ``SystemdCgroup = false``). Each kubelet gets its own
  ``cgroupRoot`` so that two on one machine do not manage each other's pods;
* a node IP that is not loopback (kubelet refuses one): kubelet picks the address of the default
  route; it listens on 127.0.0.1 only, and nothing in the tests asks the API server to reach it
  (no logs/exec through the API server). In the box (elasticgpu/testbed/box.py) it runs inside the
  box's network namespace with ``--node-ip`` the node address and listens there: exec works;
* one kubelet per containerd: a kubelet removes every pod sandbox it does not know.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from elasticgpu.testbed import free_ports, processes
from elasticgpu.testbed.real_cluster import ControlPlane

START_TIMEOUT_S = 180.0


@dataclass
class Kubelet:
    """A running kubelet and its node."""

    node: str
    directory: Path
    child: processes.Child
    config: dict[str, Any]


def kubelet_config(plane: ControlPlane, node: str, runtime_endpoint: str, directory: Path,
                   address: str = "127.0.0.1",
                   choose_port: free_ports.ChoosePort = free_ports.any_free_port) -> dict[str, Any]:  # fmt: skip
    """The KubeletConfiguration of one test node (see the module's docstring for why each setting);
    `address`: where it listens (the box's node address, so that the API server reaches it);
    `choose_port`: its ports, "kubelet" and "kubelet-healthz"."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": address,
        "port": choose_port("kubelet"),
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": choose_port("kubelet-healthz"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(plane.pki.ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": runtime_endpoint,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/elasticgpu-{node}",
        "failCgroupV1": False,
        "failSwapOn": False,
        "registerNode": True,
        "nodeStatusUpdateFrequency": "5s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        "resolvConf": "",
        # Its own folder, not the host's /var/log/pods: a kubelet stopped with pods still running (the
        # end of every test node) leaves their log folders behind.
        "podLogsDir": str(directory / "pod-logs"),
        "clusterDomain": "cluster.local",
        # The shared test machines are always short of something: no eviction in the tests.
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "tlsCertFile": "",
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
    }


HOST_NETWORK_ONLY = {
    "cniVersion": "1.0.0",
    "name": "elasticgpu-host-network-only",
    "plugins": [{"type": "loopback"}],
}
"""The CNI configuration given to the test containerd: containerd reports NetworkReady=false, and
so kubelet keeps its Node NotReady (and the scheduler away), until its CNI folder holds a
configuration; nothing here installs CNI plugins (pods of this tier use the host's network, for
which the runtime calls no plugin), so a pod without hostNetwork fails at its sandbox, plainly."""


def give_network_config(cni_conf_dir: Path) -> None:
    """Write HOST_NETWORK_ONLY into the runtime's CNI configuration folder (containerd watches it)."""
    cni_conf_dir.mkdir(parents=True, exist_ok=True)
    (cni_conf_dir / "10-elasticgpu.conflist").write_text(json.dumps(HOST_NETWORK_ONLY))


def start(plane: ControlPlane, node: str, runtime_endpoint: str, *, directory: Path,
          verbosity: str = "1", node_ip: str | None = None,
          choose_port: free_ports.ChoosePort = free_ports.any_free_port) -> Kubelet:  # fmt: skip
    """Start kubelet for `node` on `runtime_endpoint` (``unix:///...``) under `directory`; it
    registers its Node with the node's own credentials (Node authorizer, NodeRestriction).
    On the host it returns once it serves (its healthz, its HTTPS port), started again on fresh
    ports (`choose_port`) when one was taken meanwhile (free_ports); processes.DemoError when it
    does not come up.
    Where the control plane runs in a network namespace (`plane.placement`, the box), kubelet runs
    there too, with `node_ip` as its node address (``--node-ip``) and listening on it; started once
    and not waited for, as before: its ports are the namespace's, where nothing else binds."""
    directory.mkdir(parents=True, exist_ok=True)
    make_cgroup_root(f"/elasticgpu-{node}")
    config_file = directory / "kubelet.yaml"
    prefix = plane.placement.prefix if plane.placement else ()
    name, log = f"kubelet {node}", directory / "kubelet.log"

    def command() -> tuple[list[str], dict[str, Any]]:
        config = kubelet_config(plane, node, runtime_endpoint, directory, address=node_ip or "127.0.0.1",
                                choose_port=choose_port)  # fmt: skip
        config_file.write_text(yaml.safe_dump(config))
        return [
            *prefix, str(plane.binary), "kubelet", *(["--node-ip", node_ip] if node_ip else []),
            "--config", str(config_file), "--kubeconfig", str(plane.node_kubeconfig(node)),
            "--root-dir", str(directory / "root"), "--cert-dir", str(directory / "pki"),
            "--hostname-override", node, "-v", verbosity,
        ], config  # fmt: skip

    if plane.placement:
        arguments, config = command()
        return Kubelet(node, directory, plane.children.start(name, arguments, log=log), config)
    child, config = free_ports.start_on_free_ports(plane.children, name, command, log=log, ready=_serving,
                                                   timeout_s=START_TIMEOUT_S)  # fmt: skip
    return Kubelet(node, directory, child, config)


def _serving(config: dict[str, Any]) -> Callable[[], bool]:
    """Its healthz answers and its HTTPS port is its own: a bare connection would be accepted by
    whoever took the port; kubelet's server answers (401: anonymous requests are refused)."""
    unverified = ssl.create_default_context()
    unverified.check_hostname, unverified.verify_mode = False, ssl.CERT_NONE

    def check() -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{config['healthzPort']}/healthz", timeout=2) as answer:
            if answer.status != 200:
                return False
        try:
            with urllib.request.urlopen(f"https://{config['address']}:{config['port']}/healthz", timeout=2,
                                        context=unverified):  # fmt: skip
                return True
        except urllib.error.HTTPError:
            return True

    return check


@contextlib.contextmanager
def running_kubelet(plane: ControlPlane, node: str, runtime_endpoint: str, *,
                    node_ip: str | None = None, directory: Path | None = None,
                    choose_port: free_ports.ChoosePort = free_ports.any_free_port) -> Iterator[Kubelet]:  # fmt: skip
    """A kubelet for `node` (stopped, its folder removed, on exit, and when it does not come up);
    `node_ip`, `choose_port`: see `start`; `directory`: its folder (made when absent; its root-dir is
    `directory/root`), a fresh one under /tmp by default."""
    directory = directory or Path(tempfile.mkdtemp(prefix=f"egkl-{node}-", dir="/tmp"))
    kubelet: Kubelet | None = None
    try:
        kubelet = start(plane, node, runtime_endpoint, directory=directory, node_ip=node_ip, choose_port=choose_port)
        yield kubelet
    finally:
        if kubelet is not None:
            kubelet.child.stop()
        # The pods' cgroups live under the cgroupRoot: they go with the pods (a stopped kubelet
        # leaves them running in the runtime).
        with contextlib.suppress(Exception):
            _remove_all_pods(runtime_endpoint)
        _unmount_below(directory)
        shutil.rmtree(directory, ignore_errors=True)
        remove_cgroup_root(f"/elasticgpu-{node}")


CGROUP_MOUNT = Path("/sys/fs/cgroup")
CGROUP_REMOVE_TIMEOUT_S = 10.0


def _hierarchies() -> list[Path]:
    """The mounted cgroup v1 hierarchies (cpu, memory, ..., name=systemd), or the v2 root."""
    if (CGROUP_MOUNT / "cgroup.controllers").exists():
        return [CGROUP_MOUNT]
    return [d for d in sorted(CGROUP_MOUNT.iterdir()) if d.is_dir() and not d.is_symlink() and d.name != "unified"]


def make_cgroup_root(root: str) -> None:
    """kubelet refuses a cgroupRoot missing in any hierarchy ("cgroup [...] has some missing
    paths"): make it in each, the cpuset one with its parent's cpus and memory nodes (an empty
    cpuset takes no task)."""
    for hierarchy in _hierarchies():
        folder = hierarchy / root.strip("/")
        folder.mkdir(exist_ok=True)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            if (folder / knob).exists() and not (folder / knob).read_text().strip():
                (folder / knob).write_text((hierarchy / knob).read_text())


def remove_cgroup_root(root: str) -> None:
    """Remove the cgroupRoot's folders, deepest first (kubelet leaves kubepods/... behind), in every
    hierarchy and in the hybrid layout's v2 `unified` too: runc makes the pods' folders there as
    well (they were left behind, one per node, before this). A pod's folder cannot go while its
    last processes are still exiting: tried again for up to CGROUP_REMOVE_TIMEOUT_S."""
    unified = CGROUP_MOUNT / "unified"
    tops = [h / root.strip("/") for h in [*_hierarchies(), *([unified] if unified.is_dir() else [])]]
    deadline = time.monotonic() + CGROUP_REMOVE_TIMEOUT_S
    while left := [top for top in tops if top.exists()]:
        for top in left:
            for folder in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    folder.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()
        if time.monotonic() > deadline:
            return  # what is left is named by the test that checks (test_box_network)
        time.sleep(0.1)


def _remove_all_pods(runtime_endpoint: str) -> None:
    from elasticgpu.testbed.containerd import remove_pods_at

    remove_pods_at(runtime_endpoint)


def _unmount_below(directory: Path) -> None:
    prefix = str(directory) + "/"
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, stderr=subprocess.DEVNULL)
