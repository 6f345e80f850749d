"""The box: a one-node Kubernetes with a pod network, inside a network namespace of its own.

What `elasticgpu demo --cluster real --install chart` installs the chart on, and the tests' `box`
fixture (tests/realcluster/box.py re-exports this module, starting children with the tests' spawn).

Everything of the cluster runs inside one network namespace (``egbox-<pid>-<hex>``, made with
``ip netns add`` and deleted at the end, also on failure): etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, the test containerd (1.7, NRI on), kubelet and
kube-proxy. The calling process stays in the host's namespace and reaches the API server through a
forwarder (`Forwarder`): it listens on 127.0.0.1:<free port> of the host and opens each upstream
connection from a thread that entered the box's namespace (a socket belongs to the namespace it
was made in). Nothing is routed between the namespaces: the box has no link to the host, so no
address outside loopback and the box is ever a target.

Addresses (RFC 1918; at start the host's own addresses and routes are checked not to overlap
them, so that no log or error of the box can name a host's address):

* node ``10.213.0.1/24`` on a veth pair that stays inside the box (``egbox0``/``egbox1``: a veth
  with its peer up has a carrier; there is no dummy device in this kernel). The default route of
  the box points there, so that a connection from the box to a ClusterIP has a route before
  kube-proxy's DNAT (the output hook runs after routing) and dies inside the box otherwise;
* pods ``10.244.0.0/24`` (cluster CIDR ``10.244.0.0/16``, Kubernetes' customary one) on the CNI
  bridge ``egcni0`` (gateway ``10.244.0.1``), plugins ``bridge`` + ``host-local`` + ``loopback``
  of Debian's containernetworking-plugins (testnetwork/build.sh); no IP masquerade (nothing leaves);
  host-local's state in the runtime's own folder;
* Services ``10.96.0.0/24`` (the tier's SERVICE_CIDR), the `kubernetes` Service ``10.96.0.1:443``
  -> ``10.213.0.1:6443`` (the API server's advertise address; its serving certificate names the node
  address, the Service IP and the ``kubernetes.default.svc`` names).

kube-proxy (testcluster's elasticgpu-k8s, the same release) runs in **nftables** mode: the kernel
has nf_tables built in (no /lib/modules, nothing to load) and the machines have no iptables
binary; Debian's nft comes from testnetwork/build.sh. Its conntrack settings are all 0 ("leave
as is"): nf_conntrack_max and the hash size are global, not per namespace. The API server calls a
webhook's Service by its ClusterIP (the default; no ``--enable-aggregator-routing``): kube-proxy's
rules in the box's own output hook carry that too.

Cluster DNS: none. Nothing of the chart resolves a name: the controller and the agent reach the
API server by ``KUBERNETES_SERVICE_HOST`` (an IP), the API server calls the webhook by its Service
(ClusterIP; the name is only the TLS server name), the agent installer runs on the host network.
kubelet is given no clusterDNS, so pods get the node's resolv.conf settings (none here).

Why ``nsenter --net --mount`` and not ``ip netns exec``: the latter unshares a mount namespace per
process (and remounts /sys, binds /etc/netns/NAME), so kubelet's volume mounts (the service-account
token's tmpfs) would be invisible to containerd and runc, which create the containers. Every process
of the box joins one mount namespace of the box's own instead: a copy of the host's, with / made
rshared in it as systemd makes it on a node (pods' Bidirectional and HostToContainer volumes need
it; this machine's / is private), so nothing the box mounts reaches the host.

Use: the session fixture `box` (tests/realcluster/conftest.py) yields a `Box`; `Box.kubeconfig`
is the admin's (through the forwarder), `Box.plane` the ControlPlane (its `kubeconfig_for`),
`Box.runtime` the containerd (its `nri_socket`, alone in its folder, for the agent DaemonSet's
``agent.nriSocket``; `image`, the busybox test image), `Box.import_image(tar)` puts an image into
the node's containerd (no registry: pods use it with imagePullPolicy Never/IfNotPresent),
`Box.in_box(fn)` runs `fn` in the box's namespace (a connection from there), `Box.node` the node's
name (``box-<hex>``); the `box_api_client` fixture is the admin's client.

Manual use: ``python -m elasticgpu.testbed.box`` prints ``export KUBECONFIG=...`` and how long the
box took to come up, and waits for Ctrl-C.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from elasticgpu.testbed import kubelet, local_cluster, processes, real_cluster
from elasticgpu.testbed.containerd import NodeRuntime, RuntimeUnavailable, find_build, running_containerd
from elasticgpu.testbed.local_runtime import ctr_import
from elasticgpu.testbed.real_cluster import SERVICE_CIDR, SERVICE_IP, Identity, Placement

T = TypeVar("T")

NETNS_PREFIX = "egbox-"
NODE_ADDRESS = "10.213.0.1"
NODE_NETWORK = "10.213.0.0/24"
POD_SUBNET = "10.244.0.0/24"
POD_GATEWAY = "10.244.0.1"
CLUSTER_CIDR = "10.244.0.0/16"
API_PORT = 6443
NODE_DEVICE, PEER_DEVICE, BRIDGE = "egbox0", "egbox1", "egcni0"
NODE_PREFIX = "box-"
"""A box's node is `box-<hex>`: kubelet's cgroupRoot is named after its node, and two boxes at once
(the session's, and a test's own) must not manage each other's pods."""
KUBE_PROXY = Identity("system:kube-proxy")  # bound to system:node-proxier by RBAC's bootstrap policy
KUBE_PROXY_HEALTHZ_PORT = 10256
START_TIMEOUT_S = 180.0
CALL_TIMEOUT_S = 30.0
NETWORK_BUILD_SCRIPT = real_cluster.REPO_ROOT / "testnetwork" / "build.sh"
NETWORK_UNAVAILABLE_ENV = "ELASTICGPU_TESTNETWORK_UNAVAILABLE"
"""Set by scripts/test.sh to the reason when testnetwork/build.sh failed with nothing cached."""
CLONE_NEWNET = 0x40000000


class BoxUnavailable(RuntimeError):
    """What the box needs is not here (a build, root, a tool): its tests skip with this reason."""


class BoxError(RuntimeError):
    """The box was built but did not come up or did not clean up: a failure, with what to look at."""


def find_network_build() -> dict[str, str]:
    """testnetwork/build.sh's current.env (CNI plugin folder, nft's folder)."""
    if reason := os.environ.get(NETWORK_UNAVAILABLE_ENV):
        raise BoxUnavailable(reason)
    env_file = local_cluster.cache_dir().parent / "testnetwork" / "current.env"
    values = local_cluster.read_env_file(env_file) if env_file.exists() else {}
    cni, bin_dir = values.get("ELASTICGPU_TESTNETWORK_CNI_BIN", ""), values.get("ELASTICGPU_TESTNETWORK_BIN", "")
    if not (cni and os.access(f"{cni}/bridge", os.X_OK) and os.access(f"{bin_dir}/nft", os.X_OK)):
        script = NETWORK_BUILD_SCRIPT.relative_to(real_cluster.REPO_ROOT)
        raise BoxUnavailable(f"the pod network's CNI plugins and nft are not fetched: run `bash {script}` (seconds)")
    return values


def _check_kube_proxy(binary: Path) -> None:
    """A binary built before testcluster/main.go had kube-proxy answers its usage (exit 2)."""
    done = subprocess.run([str(binary), "kube-proxy", "--version"], capture_output=True, timeout=CALL_TIMEOUT_S)
    if done.returncode != 0:
        raise BoxUnavailable(f"{binary} has no kube-proxy (built from an older testcluster/main.go): run "
                             "`bash testcluster/build.sh` (a minute with its Go build cache warm)")  # fmt: skip


def _check_can_run() -> None:
    if os.geteuid() != 0:
        raise BoxUnavailable("the box needs root (network namespaces, mounts, cgroups); run the tests as root")
    for tool in ("ip", "nsenter"):
        if shutil.which(tool) is None:
            raise BoxUnavailable(f"{tool} not found (iproute2, util-linux)")


def _run(command: list[str], what: str) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=CALL_TIMEOUT_S)
    if done.returncode != 0:
        raise BoxError(f"{what} failed: `{' '.join(command)}`: {done.stderr.strip()}")
    return done.stdout


def host_networks() -> list[ipaddress.IPv4Network]:
    """The IPv4 networks of the host's own addresses and routes (the host's network namespace)."""
    found: list[ipaddress.IPv4Network] = []
    for link in json.loads(_run(["ip", "-j", "-4", "addr", "show"], "listing the host's addresses")):
        for info in link.get("addr_info", []):
            found.append(ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False))
    for route in json.loads(_run(["ip", "-j", "-4", "route", "show", "table", "all"], "listing the host's routes")):
        dst = route.get("dst", "")
        if dst and dst != "default" and not dst.startswith(("127.", "broadcast")):
            with contextlib.suppress(ValueError):
                found.append(ipaddress.IPv4Network(dst, strict=False))
    return found


def clashes() -> list[str]:
    """The box's networks that overlap one of the host's (empty: none)."""
    mine = [ipaddress.IPv4Network(n) for n in (NODE_NETWORK, CLUSTER_CIDR, SERVICE_CIDR)]
    return [f"{m} overlaps the host's {h}" for m in mine for h in host_networks() if m.overlaps(h)]


def _enter(path: str) -> None:
    """Move the calling thread (only it: setns acts per thread) into the network namespace at `path`."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns({path}): {os.strerror(errno)}")
    finally:
        os.close(fd)


class NetworkNamespace:
    """A named network namespace (``ip netns add``) with a thread inside it for the test's own calls."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.path = f"/run/netns/{name}"
        self.mounts_dir = Path(f"/run/{name}.mnt")
        self.mounts = self.mounts_dir / "mnt"
        """The box's own mount namespace (see `create`), kept alive by a bind mount of its file here."""
        self._thread: ThreadPoolExecutor | None = None
        self.killed: dict[int, str] = {}
        """What `delete` found still inside and killed (pid: command): empty when every part stopped itself."""

    @property
    def prefix(self) -> tuple[str, ...]:
        """Starts a command in the namespace (network only: see the module's docstring)."""
        return ("nsenter", f"--net={self.path}", f"--mount={self.mounts}", "--")

    def create(self) -> None:
        _run(["ip", "netns", "add", self.name], f"creating network namespace {self.name}")
        # A mount namespace of the box's own, a copy of the host's with / made rshared in it, as on every
        # systemd node: kubelet and the runtime need shared mounts for a pod's Bidirectional and
        # HostToContainer volumes (the agent's DaemonSet has both; runc refuses "/ is not a shared or slave
        # mount" otherwise). The host's own mounts stay private: nothing mounted in the box reaches it. Its
        # file is bind-mounted in a private folder of its own (unshare refuses a shared parent).
        self.mounts_dir.mkdir(mode=0o700, exist_ok=True)
        _run(["mount", "--bind", str(self.mounts_dir), str(self.mounts_dir)], "a folder for the box's mounts")
        _run(["mount", "--make-private", str(self.mounts_dir)], "making it private")
        self.mounts.touch()
        _run(["unshare", f"--mount={self.mounts}", "--propagation", "private", "true"], "the box's mount namespace")
        _run(["nsenter", f"--mount={self.mounts}", "mount", "--make-rshared", "/"], "its / made rshared")
        # Worker threads, each moved into the namespace once: every call submitted runs there. More
        # than one, so that a health check waiting on its timeout does not hold up the forwarder.
        self._thread = ThreadPoolExecutor(4, thread_name_prefix=self.name, initializer=_enter, initargs=(self.path,))

    def ip(self, *args: str) -> str:
        """`ip -n NAME ARGS...` (iproute2 enters the namespace for that command only)."""
        return _run(["ip", "-n", self.name, *args], f"ip {' '.join(args)} in {self.name}")

    def call(self, fn: Callable[[], T], timeout_s: float = CALL_TIMEOUT_S) -> T:
        """`fn()` run by the thread inside the namespace (its sockets are the namespace's)."""
        assert self._thread is not None, "create() first"
        return self._thread.submit(fn).result(timeout=timeout_s)

    def inside(self, check: Callable[[], bool]) -> Callable[[], bool]:
        """`check` made to run inside the namespace (for processes.wait_until)."""
        return lambda: self.call(check)

    def connect(self, host: str, port: int, timeout_s: float = 10.0) -> socket.socket:
        """A TCP connection opened from inside the namespace."""
        return self.call(lambda: socket.create_connection((host, port), timeout=timeout_s), timeout_s + 5)

    def pids(self) -> list[int]:
        done = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True, timeout=10)
        return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []

    def delete(self) -> None:
        """Delete the namespace (its devices, addresses, routes and nftables rules go with it); a
        process still inside (one we started: only ours enter it) is killed first."""
        if self._thread is not None:
            self._thread.shutdown(wait=True, cancel_futures=True)
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while pids := self.pids():  # a killed process stays listed until its parent has reaped it
            for pid in pids:
                if pid not in self.killed:
                    self.killed[pid] = _command_of(pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                break  # the namespace goes from /run/netns anyway; the test names what is still alive
            time.sleep(0.1)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=10)
        for mount in (self.mounts, self.mounts_dir):  # the mount namespace goes with its last holder
            subprocess.run(["umount", str(mount)], capture_output=True, timeout=10)
        with contextlib.suppress(OSError):
            self.mounts.unlink()
            self.mounts_dir.rmdir()


def _command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "(gone)"


def sweep_stale_namespaces() -> None:
    """Delete the boxes (namespaces and folders) of test processes that died without cleaning up
    (``egbox-<pid>-...``, ``/tmp/egbox-*/owner.pid``)."""
    for folder in Path("/tmp").glob(f"{NETNS_PREFIX}*"):
        try:
            os.kill(int((folder / "owner.pid").read_text()), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except (OSError, ValueError):
            continue
    for entry in Path("/run/netns").glob(f"{NETNS_PREFIX}*") if Path("/run/netns").is_dir() else []:
        try:
            owner = int(entry.name.removeprefix(NETNS_PREFIX).split("-")[0])
            os.kill(owner, 0)
        except ProcessLookupError:
            NetworkNamespace(entry.name).delete()
        except (ValueError, OSError):
            continue


class Forwarder:
    """127.0.0.1:<port> of the host -> `host`:`port` inside `netns`, byte for byte (TLS passes through:
    the client verifies the API server's certificate, which names 127.0.0.1)."""

    def __init__(self, netns: NetworkNamespace, host: str, port: int) -> None:
        self._netns, self._target = netns, (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)  # accept() wakes to see `_stopped` (a close does not wake it)
        self.port: int = self._listener.getsockname()[1]
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, name=f"forward-{self.port}", daemon=True)
        self._accepting.start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = self._netns.connect(*self._target)
            except Exception:  # the API server not listening yet: the client sees a reset and retries
                client.close()
                continue
            upstream.settimeout(None)
            client.settimeout(None)
            with self._lock:
                self._open.update((client, upstream))
                done = [0]
                for src, dst in ((client, upstream), (upstream, client)):
                    t = threading.Thread(target=self._pump, args=(src, dst, client, upstream, done), daemon=True)
                    self._threads.append(t)
                    t.start()
                self._threads = [t for t in self._threads if t.is_alive()]

    def _pump(self, src: socket.socket, dst: socket.socket, a: socket.socket, b: socket.socket,
              done: list[int]) -> None:  # fmt: skip
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)  # the other side's EOF, passed on
        with self._lock:
            done[0] += 1
            if done[0] == 2:  # both directions ended: the pair is finished
                for s in (a, b):
                    s.close()
                    self._open.discard(s)

    def close(self) -> None:
        self._stopped.set()
        self._accepting.join(timeout=5)
        self._listener.close()
        with self._lock:
            for s in self._open:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            threads = list(self._threads)
        for t in threads:
            t.join(timeout=5)
        with self._lock:
            for s in self._open:
                s.close()
            self._open.clear()


@dataclass
class Box:
    """A running box (see the module's docstring)."""

    netns: NetworkNamespace
    plane: real_cluster.ControlPlane
    runtime: NodeRuntime
    kubelet: kubelet.Kubelet
    kube_proxy: processes.Child
    directory: Path
    node: str
    node_address: str = NODE_ADDRESS
    pod_subnet: str = POD_SUBNET
    service_ip: str = SERVICE_IP
    up_s: float = 0.0  # how long it took to come up
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def kubeconfig(self) -> Path:
        """The admin's kubeconfig (system:masters), through the forwarder."""
        return self.plane.kubeconfig

    def in_box(self, fn: Callable[[], T], timeout_s: float = CALL_TIMEOUT_S) -> T:
        """`fn()` run in the box's network namespace."""
        return self.netns.call(fn, timeout_s)

    def import_image(self, archive: Path, timeout_s: float = 120.0) -> None:
        """Import an image archive (OCI or docker-archive tar) into the node's containerd (namespace
        k8s.io, where kubelet looks), as a node without a registry gets one: pods then use it with
        imagePullPolicy Never or IfNotPresent (every registry of the box is closed)."""
        if (error := ctr_import(self.runtime.ctr, self.runtime.socket, archive, timeout_s=timeout_s)) is not None:
            raise BoxError(f"importing {archive} into the box's containerd failed: {error}")


def _make_network(netns: NetworkNamespace) -> None:
    """lo up; the node address on a veth pair inside the box; the default route there (see the
    module's docstring); forwarding on (pods -> Services -> pods through the bridge)."""
    netns.ip("link", "set", "lo", "up")
    netns.ip("link", "add", NODE_DEVICE, "type", "veth", "peer", "name", PEER_DEVICE)
    netns.ip("addr", "add", f"{NODE_ADDRESS}/{NODE_NETWORK.split('/')[1]}", "dev", NODE_DEVICE)
    netns.ip("link", "set", PEER_DEVICE, "up")
    netns.ip("link", "set", NODE_DEVICE, "up")
    netns.ip("route", "add", "default", "dev", NODE_DEVICE)
    # /proc/sys/net/* shows the namespace of the process that opens it: the box's, from its thread.
    netns.call(lambda: Path("/proc/sys/net/ipv4/ip_forward").write_text("1"))


def cni_config(state_dir: Path) -> dict[str, Any]:
    """The box's CNI network: a bridge with the pods' gateway, addresses from host-local, no masquerade."""
    return {
        "cniVersion": "1.0.0",
        "name": "elasticgpu-box",
        "plugins": [{
            "type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET, "gateway": POD_GATEWAY}]],
                     "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(state_dir)},
        }],
    }  # fmt: skip


CNI_CACHE = Path("/var/lib/cni")
"""Where containerd 1.7's CNI library caches each sandbox's result (`results/<network>-<id>-<if>`),
fixed (containerd 1.7 has no setting for it): the files go at each sandbox's teardown, the folders
stay; `_remove_cni_cache` removes them when this box made them and no other box runs."""


def _remove_cni_cache(existed_before: bool, own: str) -> None:
    """Remove CNI_CACHE's empty folders if they did not exist before this box and no other box (of
    any test process) is running; rmdir leaves anything not empty alone."""
    others = [n for n in os.listdir("/run/netns") if n.startswith(NETNS_PREFIX) and n != own] \
        if os.path.isdir("/run/netns") else []  # fmt: skip
    if existed_before or others:
        return
    for folder in (CNI_CACHE / "results", CNI_CACHE):
        with contextlib.suppress(OSError):
            folder.rmdir()


def give_pod_network(runtime_dir: Path, cni_bin: Path) -> None:
    """Link the CNI plugins into the runtime's bin_dir and write the conflist (containerd watches it)."""
    bin_dir, conf_dir = runtime_dir / "cni" / "bin", runtime_dir / "cni" / "conf"
    bin_dir.mkdir(parents=True, exist_ok=True)
    conf_dir.mkdir(parents=True, exist_ok=True)
    for plugin in ("bridge", "host-local", "loopback", "portmap"):
        (bin_dir / plugin).symlink_to(cni_bin / plugin)
    (conf_dir / "10-box.conflist").write_text(json.dumps(cni_config(runtime_dir / "cni" / "ipam")))


def kube_proxy_config(kubeconfig: Path, node: str) -> dict[str, Any]:
    """kube-proxy's configuration: nftables mode, the cluster CIDR, conntrack left alone (global knobs)."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node,
        "mode": "nftables",
        "clusterCIDR": CLUSTER_CIDR,
        "bindAddress": NODE_ADDRESS,
        "healthzBindAddress": f"127.0.0.1:{KUBE_PROXY_HEALTHZ_PORT}",
        "metricsBindAddress": "127.0.0.1:10249",
        "nodePortAddresses": [f"{NODE_ADDRESS}/32"],
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s",
                      "udpTimeout": "0s", "udpStreamTimeout": "0s"},
    }  # fmt: skip


def _http_ok(url: str) -> Callable[[], bool]:
    def check() -> bool:
        with urllib.request.urlopen(url, timeout=3) as answer:
            return bool(answer.status == 200)

    return check


def reaches(netns: NetworkNamespace, host: str, port: int) -> bool:
    """Whether a TCP connection from inside the box to host:port is accepted."""
    try:
        netns.connect(host, port, timeout_s=3).close()
        return True
    except OSError:
        return False


def check_prerequisites() -> dict[str, str]:
    """What the box needs, checked before anything starts (a test skips, the demo stops, with the reason):
    root, Kubernetes' own components with kube-proxy, etcd, the pod network's build, the node's containerd,
    no clash with the host's addresses. Returns the network build's values (`find_network_build`).
    Raises BoxUnavailable or ControlPlaneUnavailable."""
    _check_can_run()
    _check_kube_proxy(real_cluster.find_k8s_binary())
    real_cluster.find_etcd()
    network = find_network_build()
    try:
        find_build(build_if_missing=False)
    except RuntimeUnavailable as e:
        raise BoxUnavailable(str(e)) from None
    if found := clashes():
        raise BoxUnavailable(f"the box's addresses would clash with the host's: {'; '.join(found)}")
    return network


@contextlib.contextmanager
def running_box(*, verbosity: str | None = None,
                spawn: processes.Spawn = processes.spawn_dying_with_us) -> Iterator[Box]:  # fmt: skip
    """Make the box, yield it once its node is Ready and the `kubernetes` Service answers from inside;
    remove all of it on exit (also on failure). Raises BoxUnavailable (a part not built, not root),
    ControlPlaneUnavailable, or BoxError/DemoError. `spawn` starts every component (the tests pass theirs)."""
    network = check_prerequisites()
    sweep_stale_namespaces()
    began = time.monotonic()
    timings: dict[str, float] = {}
    netns = NetworkNamespace(f"{NETNS_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:6]}")
    directory = Path(tempfile.mkdtemp(prefix=NETNS_PREFIX, dir="/tmp"))
    (directory / "owner.pid").write_text(str(os.getpid()))
    v = verbosity or os.environ.get("ELASTICGPU_K8S_V", "1")
    name = f"{NODE_PREFIX}{uuid.uuid4().hex[:6]}"
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, directory, True)
        stack.callback(_remove_cni_cache, CNI_CACHE.exists(), netns.name)  # after the netns is gone
        netns.create()
        stack.callback(netns.delete)
        _make_network(netns)
        forwarder = Forwarder(netns, NODE_ADDRESS, API_PORT)
        stack.callback(forwarder.close)
        placement = Placement(prefix=netns.prefix, address=NODE_ADDRESS, api_port=API_PORT,
                              inside=netns.inside, server=forwarder.url)  # fmt: skip
        plane = stack.enter_context(real_cluster.running_control_plane(verbosity=v, spawn=spawn, placement=placement))
        timings["control plane"] = time.monotonic() - began
        runtime = stack.enter_context(running_containerd(nri=True, prefix=netns.prefix, spawn=spawn))
        give_pod_network(runtime.directory, Path(network["ELASTICGPU_TESTNETWORK_CNI_BIN"]))
        timings["containerd"] = time.monotonic() - began
        node = stack.enter_context(kubelet.running_kubelet(plane, name, runtime.endpoint, node_ip=NODE_ADDRESS))
        proxy_config = directory / "kube-proxy.yaml"
        proxy_kubeconfig = plane.kubeconfig_for(KUBE_PROXY, component=True)
        proxy_config.write_text(yaml.safe_dump(kube_proxy_config(proxy_kubeconfig, name)))
        path = f"{network['ELASTICGPU_TESTNETWORK_BIN']}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        # Its log beside the control plane's: in their tails on failure, kept by ELASTICGPU_TEST_KEEP_LOGS.
        proxy = plane.children.start("kube-proxy", [
            *netns.prefix, str(plane.binary), "kube-proxy", "--config", str(proxy_config), "-v", v,
        ], log=plane.log("kube-proxy"), env={"PATH": path})  # fmt: skip
        stack.callback(proxy.stop)  # before kubelet's and the plane's exits (ExitStack: last in, first out)
        try:
            with _node_ready(plane, name) as ready:
                processes.wait_until(ready, f"Node {name} Ready", timeout_s=START_TIMEOUT_S,
                                     children=[node.child, proxy])  # fmt: skip
            timings["node Ready"] = time.monotonic() - began
            processes.wait_until(netns.inside(_http_ok(f"http://127.0.0.1:{KUBE_PROXY_HEALTHZ_PORT}/healthz")),
                                 "kube-proxy healthy", timeout_s=START_TIMEOUT_S, children=[proxy])  # fmt: skip
            processes.wait_until(lambda: reaches(netns, SERVICE_IP, 443),
                                 f"the kubernetes Service {SERVICE_IP}:443 from inside the box",
                                 timeout_s=START_TIMEOUT_S, children=[proxy])  # fmt: skip
            timings["kube-proxy"] = time.monotonic() - began
        except processes.DemoError as e:
            # Every component's log tail, kubelet's and kube-proxy's included (they are the plane's children).
            raise BoxError(f"the box did not come up: {e}\n{plane.tails(30)}") from None
        yield Box(netns, plane, runtime, node, proxy, directory, name, up_s=time.monotonic() - began,
                  timings=timings)  # fmt: skip


@contextlib.contextmanager
def _node_ready(plane: real_cluster.ControlPlane, node: str) -> Iterator[Callable[[], bool]]:
    """A check that Node `node` is Ready (its client closed on exit)."""
    from elasticgpu.testbed import kube

    api = kube.DemoKube(str(plane.kubeconfig))

    def ready() -> bool:
        conditions = (api.get(f"/api/v1/nodes/{node}").get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    try:
        yield ready
    finally:
        api.close()


if __name__ == "__main__":

    def _interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    with running_box() as box:
        steps = ", ".join(f"{k} {v:.1f} s" for k, v in box.timings.items())
        print(f"export KUBECONFIG={box.kubeconfig}  # up in {box.up_s:.1f} s ({steps})", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
