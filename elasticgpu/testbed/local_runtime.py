"""A private containerd (runc, CDI) from the cache of `testruntime/build.sh`, root only.

Its root, state, socket, config and CDI folders all live in one directory the demo owns; every
registry points at a closed loopback port, so nothing is ever pulled; the cached busybox image is
imported and serves as sandbox image too. One CDI folder per simulated node: each node's agent
writes its own spec file (of a fixed name) and containerd reads all the folders.
The tests' fixture (tests/containerd_runtime.py) runs containerd the same way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from elasticgpu.testbed import local_cluster, processes

START_TIMEOUT_S = 30.0
"""Seconds containerd's CRI plugin gets to answer Version."""


@dataclass
class LocalRuntime:
    """A running containerd and what the demo needs of it."""

    socket: Path
    image: str
    cdi_dirs: dict[str, Path]  # node name -> CDI folder containerd reads
    child: processes.Child
    directory: Path

    def stop(self) -> None:
        """Remove every pod through CRI, stop containerd, kill the shims, unmount what is left."""
        from elasticgpu.agent.cri import api

        if self.child.running():
            with contextlib.suppress(grpc.RpcError), grpc.insecure_channel(f"unix://{self.socket}") as channel:
                stub = api.services.RuntimeServiceStub(channel)
                for sandbox in stub.ListPodSandbox(api.pb.ListPodSandboxRequest(), timeout=10).items:
                    with contextlib.suppress(grpc.RpcError):
                        stub.StopPodSandbox(api.pb.StopPodSandboxRequest(pod_sandbox_id=sandbox.id), timeout=10)
                        stub.RemovePodSandbox(api.pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox.id), timeout=10)
        shims = self._shims()
        self.child.stop()
        self._release(shims)

    def kill(self) -> None:
        """`stop` with nothing that can block: containerd and its shims SIGKILLed, mounts lazily
        unmounted (the demo's watchdog, when the cleanup after Ctrl-C does not finish)."""
        shims = self._shims()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.child.process.pid, signal.SIGKILL)
        self._release(shims)

    def _shims(self) -> list[int]:
        shims = []
        for pid_file in (self.directory / "state").glob("io.containerd.runtime.v2.task/*/*/shim.pid"):
            with contextlib.suppress(OSError, ValueError):
                shims.append(int(pid_file.read_text().strip()))
        return shims

    def _release(self, shims: list[int]) -> None:
        """Kill the shims (their own sessions: containerd's stop leaves them) and unmount what is left."""
        for pid in shims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        prefix = f"{self.directory}/"
        with open("/proc/self/mounts") as mounts:
            points = [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]
        for point in sorted(points, key=len, reverse=True):  # deepest first
            subprocess.run(["umount", "-l", point], check=False, stderr=subprocess.DEVNULL)


def unavailable_reason() -> str | None:
    """Why the test containerd cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "containerd needs root (namespaces, mounts, cgroups)"
    build = local_cluster.read_env_file(cache_dir() / "current.env")
    root, image = build.get("ELASTICGPU_TESTRUNTIME_ROOT", ""), build.get("ELASTICGPU_TESTRUNTIME_IMAGE", "")
    if not (root and os.access(f"{root}/usr/bin/containerd", os.X_OK) and os.path.isfile(image)):
        return "the test containerd is not built (`bash testruntime/build.sh` builds it)"
    return None


def cache_dir() -> Path:
    """Where testruntime/build.sh keeps its builds."""
    return Path(os.environ.get("ELASTICGPU_CACHE", str(Path.home() / ".cache" / "elasticgpu"))) / "testruntime"


def _nri_on(directory: Path, socket: Path) -> str:
    """NRI switched on, its socket at `socket` and its plugin folders under `directory`."""
    return f"""[plugins."io.containerd.nri.v1.nri"]
  disable = false
  disable_connections = false
  socket_path = "{socket}"
  plugin_path = "{directory}/nri/plugins"
  plugin_config_path = "{directory}/nri/conf.d"
  plugin_registration_timeout = "5s"
  plugin_request_timeout = "2s"
"""


def _own_paths(directory: Path, version: int, unused_snapshotter: str) -> str:
    """The config's head: its version, and the daemon's root, state, sockets and opt under `directory`."""
    return f"""version = {version}
root = "{directory}/root"
state = "{directory}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.{unused_snapshotter}",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{directory}/containerd.sock"
[ttrpc]
  address = "{directory}/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{directory}/opt"
"""


def containerd_config(directory: Path, root: Path, image: str, cdi_dirs: Sequence[Path], *,
                      nri_socket: Path | None = None) -> str:
    """containerd 1.7 config (version 2): own paths under `directory`, CRI with CDI from `cdi_dirs`,
    runc from the unpacked build `root`, every registry blocked (see `block_registries`); with
    `nri_socket`, NRI switched on (off by default in 1.7), its socket there and its plugin folders
    under `directory` (no plugin is started by containerd: the agent connects its own)."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    spec_dirs = ", ".join(f'"{d}"' for d in cdi_dirs)
    nri = "" if nri_socket is None else _nri_on(directory, nri_socket)
    return _own_paths(directory, 2, "aufs") + f"""[{cri}]
  sandbox_image = "{image}"
  enable_cdi = true
  cdi_spec_dirs = [{spec_dirs}]
  # Some machines refuse to lower oom_score_adj below the parent's (sandbox start fails without this).
  restrict_oom_score_adj = true
  stats_collect_period = 3600
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        BinaryName = "{root}/usr/sbin/runc"
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "{directory}/cni/bin"
    conf_dir = "{directory}/cni/conf"
  [{cri}.registry]
    config_path = "{directory}/certs.d"
""" + nri


def containerd2_config(directory: Path, root: Path, image: str, cdi_dirs: Sequence[Path], *,
                       nri_socket: Path | None = None) -> str:
    """containerd 2.x config (version 3), the same node as `containerd_config`'s: the CRI plugin is
    split into `io.containerd.cri.v1.images` (snapshotter, sandbox image, registries) and
    `io.containerd.cri.v1.runtime` (CDI, runc, CNI). NRI is on by default in 2.x; with
    `nri_socket` its socket and plugin folders are moved under `directory`, without it NRI is
    switched off (a test's containerd must not listen on the host's /var/run/nri/nri.sock)."""
    images = 'plugins."io.containerd.cri.v1.images"'
    runtime = 'plugins."io.containerd.cri.v1.runtime"'
    spec_dirs = ", ".join(f'"{d}"' for d in cdi_dirs)
    off = '[plugins."io.containerd.nri.v1.nri"]\n  disable = true\n'
    nri = off if nri_socket is None else _nri_on(directory, nri_socket)
    return _own_paths(directory, 3, "erofs") + f"""[{images}]
  snapshotter = "overlayfs"
  stats_collect_period = 3600
  [{images}.pinned_images]
    sandbox = "{image}"
  [{images}.registry]
    config_path = "{directory}/certs.d"
[{runtime}]
  enable_cdi = true
  cdi_spec_dirs = [{spec_dirs}]
  # Some machines refuse to lower oom_score_adj below the parent's (sandbox start fails without this).
  restrict_oom_score_adj = true
  [{runtime}.containerd]
    default_runtime_name = "runc"
    [{runtime}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{runtime}.containerd.runtimes.runc.options]
        BinaryName = "{root}/usr/sbin/runc"
        SystemdCgroup = false
  [{runtime}.cni]
    bin_dirs = ["{directory}/cni/bin"]
    conf_dir = "{directory}/cni/conf"
""" + nri


def block_registries(certs_d: Path) -> None:
    """Point every registry at a closed loopback port (hosts.toml files), so a pull fails at once and
    never leaves the machine; `_default` covers any host without its own folder."""
    closed = "http://127.0.0.1:9"  # the discard port: nothing listens, a pull fails at once
    for host in ("_default", "docker.io", "registry.k8s.io", "elasticgpu.local"):
        folder = certs_d / host
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "hosts.toml").write_text(
            f'server = "{closed}"\n\n[host."{closed}"]\n  capabilities = ["pull", "resolve"]\n'
        )


def start(directory: Path, children: processes.Children, *, nodes: Sequence[str]) -> LocalRuntime:
    """Start containerd under `directory` with one CDI folder per node and import the image."""
    from elasticgpu.agent.cri import api

    build = local_cluster.read_env_file(cache_dir() / "current.env")
    root = Path(build["ELASTICGPU_TESTRUNTIME_ROOT"])
    image = build["ELASTICGPU_TESTRUNTIME_IMAGE_NAME"]
    directory.mkdir(parents=True, exist_ok=True)
    cdi_dirs = {node: directory / f"cdi-{node}" for node in nodes}
    for folder in cdi_dirs.values():
        folder.mkdir()
    block_registries(directory / "certs.d")
    config = directory / "config.toml"
    config.write_text(containerd_config(directory, root, image, list(cdi_dirs.values())))
    # containerd starts the shim from PATH; the shim starts runc by BinaryName.
    env = {"PATH": f"{root}/usr/bin:{root}/usr/sbin:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    child = children.start(
        "containerd",
        [str(root / "usr/bin/containerd"), "--config", str(config), "--log-level", "warn"],
        log=directory / "containerd.log",
        env=env,
    )
    runtime = LocalRuntime(
        socket=directory / "containerd.sock", image=image, cdi_dirs=cdi_dirs, child=child, directory=directory
    )

    def answers() -> bool:
        if not runtime.socket.exists():
            return False
        with grpc.insecure_channel(f"unix://{runtime.socket}") as channel:
            api.services.RuntimeServiceStub(channel).Version(api.pb.VersionRequest(), timeout=2)
        return True

    processes.wait_until(answers, "containerd's CRI Version", timeout_s=START_TIMEOUT_S, children=[child])
    error = ctr_import(root / "usr/bin/ctr", runtime.socket, build["ELASTICGPU_TESTRUNTIME_IMAGE"],
                       env={**os.environ, **env})  # fmt: skip
    if error is not None:
        raise processes.DemoError(f"ctr images import failed: {error}")
    return runtime


def ctr_import(ctr: Path, socket: Path, archive: Path | str, *, env: dict[str, str] | None = None,
               timeout_s: float = 60.0) -> str | None:  # fmt: skip
    """`ctr -a SOCKET -n k8s.io images import ARCHIVE`: an image archive into the namespace kubelet and the
    CRI look in, as a node without a registry gets one. None when imported, else ctr's own error text."""
    done = subprocess.run([str(ctr), "-a", str(socket), "-n", "k8s.io", "images", "import", str(archive)],
                          capture_output=True, env=env, timeout=timeout_s, check=False)  # fmt: skip
    return None if done.returncode == 0 else done.stderr.decode(errors="replace").strip()
