"""A real Kubernetes control plane: Kubernetes' own kube-apiserver, kube-controller-manager and
kube-scheduler (testcluster/build.sh's elasticgpu-k8s) on etcd, for `elasticgpu demo --cluster real`,
the tier tests/realcluster (tests/realcluster/control_plane.py re-exports this module) and
bench/real_scheduler.py.

Unlike tests/kube_cluster.py's fixture server (every user may do everything, no scheduler, no
garbage collector), this is configured as a production cluster is:

* kube-apiserver: x509 client certificates and bound service-account tokens (signed with a key
  generated for the run), ``--authorization-mode=Node,RBAC``, the NodeRestriction admission plugin
  on top of the default ones (ValidatingAdmissionPolicy, ServiceAccount, ... are on by default);
* kube-controller-manager: the default controllers (garbage collector, namespace, service
  account, node lifecycle, ...), each with its own service-account credentials
  (``--use-service-account-credentials``), so RBAC applies to them too;
* kube-scheduler with leader election on a Lease;
* kubeconfigs with client certificates for the admin (system:masters), the controller manager
  (system:kube-controller-manager), the scheduler (system:kube-scheduler) and, per node,
  the node's own identity (``system:node:<name>`` in group ``system:nodes``) that kubelet uses.

``running_control_plane()`` starts everything on free loopback ports in a fresh temporary
directory, waits until the API server's ``/readyz`` passes, the controller manager and the
scheduler answer their health checks and the ``default`` ServiceAccount exists (the controller
manager works, with a token from the API server), and stops everything on exit.

The binary comes from ``ELASTICGPU_K8S_BIN`` or ``<cache>/testcluster/current.env``; etcd from
the testserver build (``ELASTICGPU_ETCD_BIN`` or ``<cache>/testserver/current.env``). Neither is
built here: the cold build of Kubernetes takes tens of minutes (testcluster/README.md).

Manual use: ``python -m elasticgpu.testbed.real_cluster`` (or the old
``python -m tests.realcluster.control_plane``) prints ``export KUBECONFIG=...`` and waits
for Ctrl-C.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import os
import shutil
import signal
import ssl
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from elasticgpu import certificate_authority as authority
from elasticgpu.testbed import free_ports, local_cluster, processes

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "testcluster" / "build.sh"
START_TIMEOUT_S = 180.0
"""Per component: the API server's first start (RBAC bootstrap, 100+ post-start hooks) takes
20-60 s on the shared 2-core machines."""
TMP_PREFIX = "egk8s-"
SERVICE_CIDR = "10.96.0.0/24"
SERVICE_IP = "10.96.0.1"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")


class ControlPlaneUnavailable(RuntimeError):
    """The binaries are not built here; the tests using the real control plane skip."""


def k8s_cache_dir() -> Path:
    """Where testcluster/build.sh keeps its builds."""
    return local_cluster.cache_dir().parent / "testcluster"


def find_k8s_binary() -> Path:
    """elasticgpu-k8s: ``ELASTICGPU_K8S_BIN``, else the cached build's current.env."""
    candidate = os.environ.get("ELASTICGPU_K8S_BIN") or local_cluster.read_env_file(
        k8s_cache_dir() / "current.env"
    ).get("ELASTICGPU_K8S_BIN")
    if candidate and os.access(candidate, os.X_OK):
        return Path(candidate)
    raise ControlPlaneUnavailable(
        f"Kubernetes' own components are not built: run `bash {BUILD_SCRIPT.relative_to(REPO_ROOT)}` (a cold "
        "build takes tens of minutes; see testcluster/README.md) or set ELASTICGPU_K8S_BIN"
    )


def find_etcd() -> Path:
    """etcd of the testserver build (``ELASTICGPU_ETCD_BIN`` or its current.env)."""
    candidate = os.environ.get("ELASTICGPU_ETCD_BIN") or local_cluster.read_env_file(
        local_cluster.cache_dir() / "current.env"
    ).get("ELASTICGPU_ETCD_BIN")
    if candidate and os.access(candidate, os.X_OK):
        return Path(candidate)
    raise ControlPlaneUnavailable("etcd not found: run `bash testserver/build.sh` or set ELASTICGPU_ETCD_BIN")


@dataclass(frozen=True)
class Identity:
    """A client certificate's user and groups, as Kubernetes reads them (CN, O)."""

    user: str
    group: str | None = None


ADMIN = Identity("elasticgpu-realcluster-admin", "system:masters")
CONTROLLER_MANAGER = Identity("system:kube-controller-manager")
SCHEDULER = Identity("system:kube-scheduler")
APISERVER_KUBELET_CLIENT = Identity("kube-apiserver-kubelet-client", "system:masters")


def node_identity(node: str) -> Identity:
    """What the Node authorizer and NodeRestriction recognise as node `node` (kubelet's identity)."""
    return Identity(f"system:node:{node}", "system:nodes")


@dataclass
class Pki:
    """The run's CA, the API server's serving certificate and the service-account signing key."""

    directory: Path
    ca: authority.Issued
    validity: authority.Validity

    @classmethod
    def create(cls, directory: Path, *, extra_hosts: Sequence[str] = ()) -> Pki:
        """A new CA, serving certificate and service-account key pair under `directory`; the serving
        certificate names the API server's loopback and Service names and `extra_hosts` (the box's
        node address, where the API server listens inside its network namespace)."""
        directory.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.UTC)
        validity = authority.Validity(now - datetime.timedelta(hours=1), now + datetime.timedelta(days=2))
        pki = cls(directory, authority.new_ca("elasticgpu-realcluster-ca", validity), validity)
        _write(directory / "ca.crt", pki.ca.cert_pem())
        _write(directory / "ca.key", pki.ca.key_pem())
        hosts = ["127.0.0.1", "localhost", SERVICE_IP, "kubernetes", "kubernetes.default",
                 "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", *extra_hosts]  # fmt: skip
        serving = authority.issue(pki.ca, authority.subject("kube-apiserver"), usage=authority.SERVER_AUTH,
                                  hosts=hosts, validity=validity)  # fmt: skip
        _write(directory / "apiserver.crt", serving.cert_pem())
        _write(directory / "apiserver.key", serving.key_pem())
        # The service-account token signing key (ES256): the API server signs with the private
        # key and verifies with the public one; the controller manager gets the private key too
        # (legacy token secrets), as kubeadm does.
        account = authority.new_ca("service-accounts", validity).key
        _write(directory / "sa.key", authority.pem_key(account))
        public = account.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
        _write(directory / "sa.pub", public)
        return pki

    def client(self, identity: Identity) -> tuple[Path, Path]:
        """(certificate, key) files of a client certificate for `identity`, made once."""
        stem = identity.user.replace(":", "-")
        cert, key = self.directory / f"{stem}.crt", self.directory / f"{stem}.key"
        if not cert.exists():
            issued = authority.issue(self.ca, authority.subject(identity.user, identity.group),
                                     usage=authority.CLIENT_AUTH, hosts=None, validity=self.validity)  # fmt: skip
            _write(cert, issued.cert_pem())
            _write(key, issued.key_pem())
        return cert, key

    @property
    def ca_file(self) -> Path:
        """The CA certificate (PEM)."""
        return self.directory / "ca.crt"


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)


def write_kubeconfig(path: Path, server: str, ca_file: Path, cert: Path, key: Path, user: str) -> Path:
    """A kubeconfig for `server` with one client certificate (inlined, so the file stands alone)."""

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "realcluster", "cluster": {"server": server, "certificate-authority-data": b64(ca_file)}}
        ],
        "users": [{"name": user, "user": {"client-certificate-data": b64(cert), "client-key-data": b64(key)}}],
        "contexts": [{"name": "realcluster", "context": {"cluster": "realcluster", "user": user}}],
        "current-context": "realcluster",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@dataclass(frozen=True)
class Placement:
    """Where the components run when not on the host's loopback: inside a network namespace (the
    box of elasticgpu/testbed/box.py), which the calling process cannot reach directly.

    `prefix` starts a command in it (``nsenter --net=/run/netns/NAME --``); `address` is where the
    API server listens and what it advertises (the `kubernetes` Service's endpoint), on
    `api_port`; `inside(check)` returns `check` made to run in the namespace (a thread that
    entered it), for the health checks of the components that listen on its loopback;
    `server` is the URL by which the test process reaches the API server (a forwarder)."""

    prefix: tuple[str, ...]
    address: str
    api_port: int
    inside: Callable[[Callable[[], bool]], Callable[[], bool]]
    server: str


@dataclass
class ControlPlane:
    """A running control plane and how to reach it."""

    directory: Path
    server: str  # how the test process (and the product's processes beside it) reach the API server
    pki: Pki
    kubeconfig: Path  # the admin's (system:masters)
    binary: Path
    children: processes.Children
    ports: dict[str, int] = field(default_factory=dict)
    """The ports the components listen on, by name (etcd, etcd-peer, kube-apiserver, ...): those of
    the start that came up (a port taken meanwhile made it start again on fresh ones)."""
    component_server: str = ""
    """How the cluster's own components (controller manager, scheduler, kubelet, kube-proxy) reach
    it: `server`, unless they run inside a network namespace (Placement)."""
    placement: Placement | None = None

    def kubeconfig_for(self, identity: Identity, *, component: bool = False) -> Path:
        """A kubeconfig for the client certificate of `identity` (made on first use); `component`:
        for a process that runs where the cluster's components run (`component_server`)."""
        server = (self.component_server or self.server) if component else self.server
        suffix = ".component" if component and server != self.server else ""
        path = self.directory / f"{identity.user.replace(':', '-')}{suffix}.kubeconfig"
        if not path.exists():
            cert, key = self.pki.client(identity)
            write_kubeconfig(path, server, self.pki.ca_file, cert, key, identity.user)
        return path

    def node_kubeconfig(self, node: str) -> Path:
        """The kubeconfig kubelet of `node` uses (``system:node:<node>``), for where kubelet runs."""
        return self.kubeconfig_for(node_identity(node), component=True)

    def ssl_context(self) -> ssl.SSLContext:
        """Client TLS context with the CA and the admin certificate (for raw HTTPS)."""
        return _admin_context(self.pki)

    def log(self, component: str) -> Path:
        """The log file of a component (etcd, kube-apiserver, ...)."""
        return self.directory / f"{component}.log"

    def tails(self, lines: int = 30) -> str:
        """The last lines of every component's log, for a failure message."""
        return "\n".join(f"--- {c.name} ---\n{c.tail(lines)}" for c in self.children.started)


def _admin_context(pki: Pki) -> ssl.SSLContext:
    """Client TLS context with the CA and the admin certificate (the API server's readiness is
    asked before the plane, which names its address, exists)."""
    cert, key = pki.client(ADMIN)
    context = ssl.create_default_context(cafile=str(pki.ca_file))
    context.load_cert_chain(str(cert), str(key))
    return context


def _https_ok(url: str, context: ssl.SSLContext) -> Callable[[], bool]:
    def check() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=5, context=context) as answer:
                return bool(answer.status == 200)
        except urllib.error.HTTPError:
            return False

    return check


def _unverified() -> ssl.SSLContext:
    # The controller manager and scheduler serve /healthz with a certificate they make themselves
    # at start (no CA to check it against); the check only asks whether they answer.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def start(directory: Path, children: processes.Children, *, binary: Path, etcd_bin: Path,
          verbosity: str = "1", timeout_s: float = START_TIMEOUT_S,
          placement: Placement | None = None,
          extra_args: Mapping[str, Sequence[str]] | None = None,
          choose_port: free_ports.ChoosePort = free_ports.any_free_port) -> ControlPlane:  # fmt: skip
    """Start etcd, kube-apiserver, kube-controller-manager and kube-scheduler under `directory`,
    on the host's loopback, or inside a network namespace with `placement`. `extra_args` adds flags
    per component (by name in COMPONENTS), after the ones set here: the benches raise the controller
    manager's and scheduler's client limits with it.

    Each component chooses its ports (with `choose_port`, by their names in `ControlPlane.ports`)
    when it starts, and on the host starts again on fresh ones when one was taken meanwhile
    (free_ports.start_on_free_ports). Inside a namespace it starts once: its ports are the
    namespace's, where nothing else binds, and the API server's is the placement's.

    Raises processes.DemoError (naming the component) when one does not come up; everything started
    is in `children` (stopped by its stop_all even then)."""
    extra = extra_args or {}
    prefix: tuple[str, ...] = placement.prefix if placement else ()
    attempts = 1 if placement else free_ports.PORT_ATTEMPTS
    ports: dict[str, int] = {}

    def inside(check: Callable[[], bool]) -> Callable[[], bool]:
        return placement.inside(check) if placement else check

    def choose(*names: str) -> list[int]:
        for name in names:
            ports[name] = choose_port(name)
        return [ports[name] for name in names]

    def launch(name: str, command: Callable[[], list[str]], ready: Callable[[], Callable[[], bool]],
               also: Sequence[processes.Child]) -> processes.Child:  # fmt: skip
        child, _ = free_ports.start_on_free_ports(
            children, name, lambda: (command(), None), log=directory / f"{name}.log", ready=lambda _: ready(),
            timeout_s=timeout_s, also=also, attempts=attempts)  # fmt: skip
        return child

    pki = Pki.create(directory / "pki", extra_hosts=[placement.address] if placement else [])

    def etcd_url() -> str:
        return f"http://127.0.0.1:{ports['etcd']}"

    def etcd_command() -> list[str]:
        shutil.rmtree(directory / "etcd", ignore_errors=True)  # a failed attempt's data
        # Inside a namespace its ports are free whatever the host's are (the choice asks the host; harmless).
        _, peer = choose("etcd", "etcd-peer")
        return [
            *prefix, str(etcd_bin), "--name", "default", "--data-dir", str(directory / "etcd"),
            "--listen-client-urls", etcd_url(), "--advertise-client-urls", etcd_url(),
            "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"default=http://127.0.0.1:{peer}", "--unsafe-no-fsync", "--log-level", "warn",
            *extra.get("etcd", ()),
        ]  # fmt: skip

    etcd = launch("etcd", etcd_command, lambda: inside(lambda: _etcd_healthy(etcd_url())), also=[])

    address = placement.address if placement else "127.0.0.1"

    def server() -> str:
        return placement.server if placement else f"https://127.0.0.1:{ports['kube-apiserver']}"

    kubelet_cert, kubelet_key = pki.client(APISERVER_KUBELET_CLIENT)
    p = pki.directory
    # On loopback the `kubernetes` Service's endpoint would be 127.0.0.1, which Endpoints validation
    # refuses: no reconciler, and nothing reaches the API server through that Service. In the box the
    # endpoint is the node address, which pods reach through the Service (kube-proxy).
    reconciler = ["--endpoint-reconciler-type", "none"] if placement is None else []

    def apiserver_command() -> list[str]:
        if placement:
            ports["kube-apiserver"] = placement.api_port
        else:
            choose("kube-apiserver")
        return [
            *prefix, str(binary), "kube-apiserver", "--etcd-servers", etcd_url(),
            "--bind-address", address, "--advertise-address", address, "--secure-port", str(ports["kube-apiserver"]),
            "--cert-dir", str(directory / "apiserver-certs"),
            "--tls-cert-file", str(p / "apiserver.crt"), "--tls-private-key-file", str(p / "apiserver.key"),
            "--client-ca-file", str(pki.ca_file),
            "--authorization-mode", "Node,RBAC",
            "--enable-admission-plugins", "NodeRestriction",
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file", str(p / "sa.pub"), "--service-account-signing-key-file", str(p / "sa.key"),
            "--service-cluster-ip-range", SERVICE_CIDR,
            "--kubelet-client-certificate", str(kubelet_cert), "--kubelet-client-key", str(kubelet_key),
            "--kubelet-preferred-address-types", "InternalIP,Hostname",
            "--allow-privileged=true",
            *reconciler,
            "-v", verbosity, *extra.get("kube-apiserver", ()),
        ]  # fmt: skip

    admin = _admin_context(pki)
    apiserver = launch("kube-apiserver", apiserver_command, lambda: _https_ok(f"{server()}/readyz", admin),
                       also=[etcd])  # fmt: skip

    # The plane once the API server's address is settled: the kubeconfigs name it.
    plane = ControlPlane(directory, server(), pki, directory / "admin.kubeconfig", binary, children, ports,
                         component_server=f"https://{address}:{ports['kube-apiserver']}",
                         placement=placement)  # fmt: skip
    admin_cert, admin_key = pki.client(ADMIN)
    write_kubeconfig(plane.kubeconfig, plane.server, pki.ca_file, admin_cert, admin_key, ADMIN.user)

    cm_config = plane.kubeconfig_for(CONTROLLER_MANAGER, component=True)

    def controller_manager_command() -> list[str]:
        (port,) = choose("kube-controller-manager")
        return [
            *prefix, str(binary), "kube-controller-manager", "--kubeconfig", str(cm_config),
            "--authentication-kubeconfig", str(cm_config), "--authorization-kubeconfig", str(cm_config),
            "--bind-address", "127.0.0.1", "--secure-port", str(port), "--cert-dir", str(directory / "cm-certs"),
            "--use-service-account-credentials=true",
            "--service-account-private-key-file", str(p / "sa.key"), "--root-ca-file", str(pki.ca_file),
            "--cluster-signing-cert-file", str(pki.ca_file), "--cluster-signing-key-file", str(p / "ca.key"),
            "--service-cluster-ip-range", SERVICE_CIDR,
            "-v", verbosity, *extra.get("kube-controller-manager", ()),
        ]  # fmt: skip

    controller_manager = launch(
        "kube-controller-manager", controller_manager_command,
        lambda: inside(_https_ok(f"https://127.0.0.1:{ports['kube-controller-manager']}/healthz", _unverified())),
        also=[etcd, apiserver])  # fmt: skip

    sched_config = plane.kubeconfig_for(SCHEDULER, component=True)

    def scheduler_command() -> list[str]:
        (port,) = choose("kube-scheduler")
        return [
            *prefix, str(binary), "kube-scheduler", "--kubeconfig", str(sched_config),
            "--authentication-kubeconfig", str(sched_config), "--authorization-kubeconfig", str(sched_config),
            "--bind-address", "127.0.0.1", "--secure-port", str(port), "--cert-dir", str(directory / "sched-certs"),
            "-v", verbosity, *extra.get("kube-scheduler", ()),
        ]  # fmt: skip

    launch("kube-scheduler", scheduler_command,
           lambda: inside(_https_ok(f"https://127.0.0.1:{ports['kube-scheduler']}/readyz", _unverified())),
           also=[etcd, apiserver, controller_manager])  # fmt: skip

    # The service-account controller makes `default` in every namespace with the controller
    # manager's own token-based credentials: its existence shows both work.
    processes.wait_until(lambda: _https_ok(f"{plane.server}/api/v1/namespaces/default/serviceaccounts/default",
                                           plane.ssl_context())(),
                         "the default ServiceAccount (kube-controller-manager working)", timeout_s=timeout_s,
                         children=children.started)  # fmt: skip
    return plane


def _etcd_healthy(url: str) -> bool:
    with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
        return bool(answer.status == 200)


def _sweep_stale_dirs() -> None:
    """Remove folders of earlier runs whose test process died without cleaning up."""
    for d in Path(tempfile.gettempdir()).glob(f"{TMP_PREFIX}*"):
        try:
            pid = int((d / "owner.pid").read_text())
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except (OSError, ValueError):
            continue


@contextlib.contextmanager
def running_control_plane(
    *, verbosity: str | None = None, spawn: processes.Spawn = processes.spawn_dying_with_us,
    placement: Placement | None = None, extra_args: Mapping[str, Sequence[str]] | None = None,
    choose_port: free_ports.ChoosePort = free_ports.any_free_port,
) -> Iterator[ControlPlane]:
    """Start the real control plane in a fresh temporary folder; stop it and remove the folder on exit.
    `spawn` starts each component (the tests pass theirs, tests/spawning.py); `placement`: inside a
    network namespace (see Placement) instead of on the host's loopback; `extra_args` adds flags per
    component, `choose_port` chooses each component's ports (see `start`).

    Raises ControlPlaneUnavailable when the binaries are not built, processes.DemoError (with every
    component's log tail) when a component does not come up."""
    binary, etcd_bin = find_k8s_binary(), find_etcd()
    _sweep_stale_dirs()
    directory = Path(tempfile.mkdtemp(prefix=TMP_PREFIX))
    (directory / "owner.pid").write_text(str(os.getpid()))
    children = processes.Children(spawn=spawn)
    try:
        try:
            plane = start(directory, children, binary=binary, etcd_bin=etcd_bin, placement=placement,
                          verbosity=verbosity or os.environ.get("ELASTICGPU_K8S_V", "1"),
                          extra_args=extra_args, choose_port=choose_port)  # fmt: skip
        except processes.DemoError as e:
            logs = "\n".join(f"--- {c.name} ---\n{c.tail(40)}" for c in children.started)
            raise processes.DemoError(f"{e}\n{logs}") from None
        yield plane
    finally:
        _stop(children)
        keep = os.environ.get("ELASTICGPU_TEST_KEEP_LOGS")
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            for log in directory.glob("*.log"):
                shutil.copy(log, Path(keep) / log.name)
        shutil.rmtree(directory, ignore_errors=True)


def _stop(children: processes.Children) -> None:
    """Everything but the API server and etcd first (they talk to it until they are gone), then it, then etcd."""
    last = ("kube-apiserver", "etcd")
    for child in children.started:
        if child.name not in last:
            child.terminate()
    for child in children.started:
        if child.name not in last:
            child.stop()
    for name in last:
        for child in children.started:
            if child.name == name:
                child.stop()


if __name__ == "__main__":

    def _interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    began = time.monotonic()
    with running_control_plane() as plane:
        print(f"export KUBECONFIG={plane.kubeconfig}  # {plane.server}, up in {time.monotonic() - began:.1f} s",
              flush=True)  # fmt: skip
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
