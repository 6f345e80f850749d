"""A private containerd (1.7 or 2.x, runc, CDI) from the cache of `testruntime/build.sh`, started and
stopped by its caller: the box's node runtime (`box`, `elasticgpu demo --cluster real --install chart`)
and the tests' (tests/containerd_runtime.py re-exports this with the tests' spawn).

``running_containerd()`` starts it with its own root, state, socket, CDI directory and config under a
fresh temporary directory, imports the locally built busybox image (also the sandbox image), and yields
a ``NodeRuntime``. On exit it stops and removes every pod through CRI, stops containerd, kills shims
left behind, unmounts whatever is still mounted under the directory and removes it.

Nothing is ever pulled: every registry (the default fallback included) points at a closed loopback port
through ``hosts.toml`` files under the CRI plugin's ``config_path`` (`local_runtime.block_registries`).
When the runtime was never built (or this is not root) it raises ``RuntimeUnavailable`` with the reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from elasticgpu.testbed import processes
from elasticgpu.testbed.local_cluster import read_env_file
from elasticgpu.testbed.local_runtime import (
    block_registries,
    cache_dir,
    containerd2_config,
    containerd_config,
    ctr_import,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "testruntime" / "build.sh"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
TMP_PREFIX = "egrt-"  # short: a unix socket path must stay under 108 bytes
CONTAINERD_VERSIONS = ("1.7", "2")
"""The containerds testruntime/build.sh fetches: 1.7 (trixie) and 2.x (sid; ELASTICGPU_TESTRUNTIME_CONTAINERD=2)."""
UNAVAILABLE_ENV = {"1.7": "ELASTICGPU_TESTRUNTIME_UNAVAILABLE", "2": "ELASTICGPU_TESTRUNTIME2_UNAVAILABLE"}
"""Set by scripts/test.sh to the reason when that build failed with nothing cached."""


class RuntimeUnavailable(RuntimeError):
    """The node runtime cannot run here (not built, not root): the tests skip, the demo says why."""


@dataclass
class NodeRuntime:
    """How to reach the running containerd."""

    __test__ = False  # the tests import it as `TestRuntime`: pytest must not collect it as a test class

    socket: Path  # containerd's CRI socket (absolute)
    directory: Path  # the temporary directory holding everything of this containerd
    cdi_dir: Path  # the CDI spec directory containerd reads on every CreateContainer
    image: str  # the imported busybox image, also the sandbox image
    log: Path
    ctr: Path
    nginx: Path | None = None  # the CRI front's nginx from the same build (None: a build from before it)
    nri_socket: Path | None = None  # containerd's NRI socket, where NRI is switched on (running_containerd(nri=True))
    version: str = "1.7"  # which containerd: "1.7" or "2" (running_containerd(containerd=...))

    @property
    def endpoint(self) -> str:
        """gRPC target of the socket."""
        return f"unix://{self.socket}"


def build_cache(containerd: str = "1.7") -> Path:
    """Where testruntime/build.sh keeps the builds of that containerd (1.7 or 2)."""
    return cache_dir() if containerd == "1.7" else cache_dir().with_name("testruntime2")


def find_build(build_if_missing: bool = True, containerd: str = "1.7") -> dict[str, str]:
    """build.sh's current.env (root, image archive, image name); runs build.sh once if missing."""
    if containerd not in CONTAINERD_VERSIONS:
        raise ValueError(f"containerd {containerd!r}: not one of {CONTAINERD_VERSIONS}")
    if reason := os.environ.get(UNAVAILABLE_ENV[containerd]):
        raise RuntimeUnavailable(reason)

    def complete(values: dict[str, str]) -> bool:
        root = values.get("ELASTICGPU_TESTRUNTIME_ROOT", "")
        image = values.get("ELASTICGPU_TESTRUNTIME_IMAGE", "")
        return bool(root) and os.access(f"{root}/usr/bin/containerd", os.X_OK) and os.path.isfile(image)

    env_file = build_cache(containerd) / "current.env"
    values = read_env_file(env_file) if env_file.exists() else {}
    if not complete(values) and build_if_missing:
        print(f"containerd: no cached test runtime (containerd {containerd}); running {BUILD_SCRIPT}",
              file=sys.stderr)
        done = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env={**os.environ, "ELASTICGPU_TESTRUNTIME_CONTAINERD": containerd}, timeout=600)
        if done.returncode != 0:
            raise RuntimeUnavailable(f"testruntime/build.sh (containerd {containerd}) failed: "
                                     f"{done.stderr.decode(errors='replace')[-500:]}")
        values = read_env_file(env_file)
    if not complete(values):
        raise RuntimeUnavailable(f"test runtime (containerd {containerd}) not built; run "
                                 f"`ELASTICGPU_TESTRUNTIME_CONTAINERD={containerd} bash {BUILD_SCRIPT}`")
    return values


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _wait_version(socket_path: Path, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Wait until containerd's CRI answers Version (the CRI plugin starts after the socket)."""
    from elasticgpu.agent.cri import api

    deadline = time.monotonic() + START_TIMEOUT_S
    last = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"containerd exited with {proc.returncode}:\n{_tail(log)}")
        if socket_path.exists():
            with grpc.insecure_channel(f"unix://{socket_path}") as channel:
                try:
                    api.services.RuntimeServiceStub(channel).Version(api.pb.VersionRequest(), timeout=2)
                    return
                except grpc.RpcError as e:
                    last = str(e.details() if hasattr(e, "details") else e)
        time.sleep(0.1)
    raise RuntimeError(f"containerd's CRI did not answer within {START_TIMEOUT_S:.0f}s ({last}):\n{_tail(log)}")


def _shim_pids(state: Path) -> list[int]:
    pids = []
    for pid_file in state.glob("io.containerd.runtime.v2.task/*/*/shim.pid"):
        with contextlib.suppress(OSError, ValueError):
            pids.append(int(pid_file.read_text().strip()))
    return pids


def remove_all_pods(runtime: NodeRuntime) -> None:
    """Stop and remove every pod sandbox (and so its containers) through CRI."""
    remove_pods_at(runtime.endpoint)


def remove_pods_at(endpoint: str) -> None:
    """`remove_all_pods` of the runtime at `endpoint` (a kubelet knows only its CRI endpoint)."""
    from elasticgpu.agent.cri import api

    with grpc.insecure_channel(endpoint) as channel:
        stub = api.services.RuntimeServiceStub(channel)
        for container in stub.ListContainers(api.pb.ListContainersRequest(), timeout=10).containers:
            with contextlib.suppress(grpc.RpcError):
                stub.RemoveContainer(api.pb.RemoveContainerRequest(container_id=container.id), timeout=10)
        for sandbox in stub.ListPodSandbox(api.pb.ListPodSandboxRequest(), timeout=10).items:
            with contextlib.suppress(grpc.RpcError):
                stub.StopPodSandbox(api.pb.StopPodSandboxRequest(pod_sandbox_id=sandbox.id), timeout=10)
                stub.RemovePodSandbox(api.pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox.id), timeout=10)


def _unmount_below(directory: Path) -> None:
    """Lazily unmount whatever is still mounted under directory, deepest first."""
    prefix = str(directory) + "/"
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, stderr=subprocess.DEVNULL)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=STOP_TIMEOUT_S)


def _check_can_run() -> None:
    if os.geteuid() != 0:
        raise RuntimeUnavailable("containerd needs root (namespaces, mounts, cgroups); run the tests as root")
    if shutil.which("umount") is None:
        raise RuntimeUnavailable("umount not found")


@contextlib.contextmanager
def running_containerd(*, nri: bool = False, containerd: str = "1.7", prefix: Sequence[str] = (),
                       spawn: processes.Spawn = processes.spawn_dying_with_us) -> Iterator[NodeRuntime]:  # fmt: skip
    """Start a private containerd, import the busybox image, yield it; clean everything on exit.
    `nri`: NRI switched on in its config, its socket in the test's own folder (`NodeRuntime.nri_socket`;
    off otherwise, also on 2.x where it is on by default). `containerd`: "1.7" or "2" (2.1 today).
    `prefix`: what containerd's command is started through (``nsenter --net=...``: the box's network
    namespace, `box`; its shims and pods' sandboxes inherit it). `spawn`: how containerd is started
    (a child that dies with this process; the tests pass theirs, tests/spawning.py)."""
    _check_can_run()
    build = find_build(containerd=containerd)
    root = Path(build["ELASTICGPU_TESTRUNTIME_ROOT"])
    image = build["ELASTICGPU_TESTRUNTIME_IMAGE_NAME"]
    directory = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir="/tmp"))
    config = directory / "config.toml"
    log = directory / "containerd.log"
    (directory / "cdi").mkdir()
    block_registries(directory / "certs.d")
    # The socket in a folder of its own: a pod that mounts the socket's folder (the agent's NRI
    # DaemonSet on the box: agent.nriSocket) gets nothing else of this containerd.
    nri_socket = directory / "nri-socket" / "nri.sock" if nri else None
    if nri_socket is not None:
        nri_socket.parent.mkdir()
    make_config = containerd_config if containerd == "1.7" else containerd2_config
    config.write_text(make_config(directory, root, image, [directory / "cdi"], nri_socket=nri_socket))
    env = {
        **os.environ,
        # containerd starts containerd-shim-runc-v2 from PATH; the shim starts runc by BinaryName.
        "PATH": f"{root}/usr/bin:{root}/usr/sbin:{os.environ.get('PATH', '/usr/bin:/bin')}",
    }
    runtime = NodeRuntime(
        socket=directory / "containerd.sock",
        directory=directory,
        cdi_dir=directory / "cdi",
        image=image,
        log=log,
        ctr=root / "usr" / "bin" / "ctr",
        nginx=Path(build["ELASTICGPU_TESTRUNTIME_NGINX"]) if build.get("ELASTICGPU_TESTRUNTIME_NGINX") else None,
        nri_socket=nri_socket,
        version=containerd,
    )
    proc: subprocess.Popen[bytes] | None = None
    try:
        with log.open("wb") as log_file:
            proc = spawn(
                [*prefix, str(root / "usr/bin/containerd"), "--config", str(config), "--log-level", "warn"],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        _wait_version(runtime.socket, proc, log)
        error = ctr_import(runtime.ctr, runtime.socket, build["ELASTICGPU_TESTRUNTIME_IMAGE"], env=env)
        if error is not None:
            raise RuntimeError(f"ctr images import failed: {error}")
        yield runtime
    finally:
        shims: list[int] = []
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(Exception):
                remove_all_pods(runtime)
            shims = _shim_pids(directory / "state")
            _stop(proc)
        for pid in shims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _unmount_below(directory)
        shutil.rmtree(directory, ignore_errors=True)
