"""A real Kubernetes API server for the tests: etcd + testserver/ (apiextensions-apiserver + core kinds).

``running_cluster()`` starts etcd and the test server on free loopback ports with a freshly
generated CA, server and client certificate, waits until ``/readyz`` passes, writes a kubeconfig
and stops everything (process groups killed, temporary directory removed) on exit.

If ``ELASTICGPU_TEST_KUBECONFIG`` is set, nothing is started: that kubeconfig (kind, k3d, a real
cluster) is used as is, so the same tests run against any cluster.

The server and etcd binaries come from ``testserver/build.sh`` (which caches them and writes
``<cache>/testserver/current.env``); ``ELASTICGPU_TESTSERVER_BIN`` / ``ELASTICGPU_ETCD_BIN``
override them.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests import spawning

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO_ROOT / "testserver" / "build.sh"
KUBECONFIG_ENV = "ELASTICGPU_TEST_KUBECONFIG"
START_TIMEOUT_S = 90.0
SERVER_GOGC = "400"
"""Go's GC target for the test API server (Go's default is 100; `GOGC` in the environment wins).
The fixture shares two cores with the code under test; a CPU profile under a burst of binds
(`bench/README.md`) showed a third of its CPU in garbage collection. 400 trades a few hundred
MiB of heap for that CPU, as one would give a real control plane more memory."""
TMP_PREFIX = "elasticgpu-kube-"


@dataclass
class TestCluster:
    """How to reach the cluster the tests run against."""

    __test__ = False  # not a pytest test class

    kubeconfig: Path
    server: str
    external: bool = False  # True when given by ELASTICGPU_TEST_KUBECONFIG
    # Only for the local test server: PEM files, for raw HTTPS (urllib/ssl) access.
    ca_file: Path | None = None
    client_cert_file: Path | None = None
    client_key_file: Path | None = None
    log_dir: Path | None = None
    kubectl: Path | None = None  # kubectl from build.sh (Debian's, same version) or from PATH
    versions: dict[str, str] = field(default_factory=dict)

    def ssl_context(self) -> ssl.SSLContext:
        """Client TLS context with the CA and client certificate (local test server only)."""
        if self.ca_file is None or self.client_cert_file is None or self.client_key_file is None:
            raise RuntimeError("no client certificate known for an external cluster; use the kubeconfig")
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.load_cert_chain(str(self.client_cert_file), str(self.client_key_file))
        return ctx


class ClusterStartError(RuntimeError):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get("ELASTICGPU_CACHE", str(Path.home() / ".cache" / "elasticgpu"))) / "testserver"


def _read_env_file(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep and not line.startswith("#"):
                values[key.strip()] = value.strip()
    return values


def find_binaries(build_if_missing: bool = True) -> tuple[Path, Path]:
    """Paths of (test server, etcd): env overrides, else build.sh's current.env, else run build.sh."""
    server_env, etcd_env = os.environ.get("ELASTICGPU_TESTSERVER_BIN"), os.environ.get("ELASTICGPU_ETCD_BIN")
    if server_env and etcd_env:
        return Path(server_env), Path(etcd_env)

    def from_env_file() -> tuple[Path, Path] | None:
        values = _read_env_file(cache_dir() / "current.env")
        server, etcd = values.get("ELASTICGPU_TESTSERVER_BIN"), values.get("ELASTICGPU_ETCD_BIN")
        if server and etcd and os.access(server, os.X_OK) and os.access(etcd, os.X_OK):
            return Path(server), Path(etcd)
        return None

    found = from_env_file()
    if found is None and build_if_missing:
        print(f"kube_cluster: no cached test server; running {BUILD_SCRIPT} (a few minutes)", file=sys.stderr)
        subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, stdout=subprocess.DEVNULL)
        found = from_env_file()
    if found is None:
        raise ClusterStartError(f"test server binaries not found; run `bash {BUILD_SCRIPT}`")
    return found


@dataclass
class RawResponse:
    status: int
    body: bytes
    headers: dict[str, str]

    def json(self) -> Any:
        return json.loads(self.body)


def kube_request(
    api: Any,
    method: str,
    path: str,
    *,
    body: Any = None,
    query: list[tuple[str, str]] | None = None,
    headers: dict[str, str] | None = None,
) -> RawResponse:
    """One raw HTTP request through a kubernetes.client.ApiClient (its TLS and credentials), any status.

    Works across kubernetes client versions (``ApiClient.call_api`` changed signature in v35+).
    ``body`` may be bytes/str (sent as is) or JSON-serialisable (sent as JSON, valid YAML too).
    """
    from kubernetes.client.rest import ApiException

    cfg = api.configuration
    url = cfg.host.rstrip("/") + path
    if query:
        url += "?" + urllib.parse.urlencode(query)
    hdrs = {"Accept": "application/json", **dict(api.default_headers), **(headers or {})}
    if getattr(cfg, "refresh_api_key_hook", None) is not None:
        cfg.refresh_api_key_hook(cfg)
    auth = cfg.get_api_key_with_prefix("authorization") if hasattr(cfg, "get_api_key_with_prefix") else None
    if auth:
        hdrs.setdefault("Authorization", auth)
    data = body
    if body is not None and not isinstance(body, str | bytes):
        data = json.dumps(body)
    if data is not None and "Content-Type" not in hdrs:
        hdrs["Content-Type"] = "application/json"
    pool = api.rest_client.pool_manager
    try:
        r = pool.request(method, url, body=data, headers=hdrs, preload_content=True)
    except ApiException as e:  # pragma: no cover - defensive
        return RawResponse(e.status or 0, (e.body or "").encode() if isinstance(e.body, str) else e.body or b"", {})
    return RawResponse(r.status, r.data, dict(r.headers))


def server_side_apply(api: Any, path: str, obj: dict[str, Any], manager: str = "elasticgpu-tests") -> Any:
    """PATCH application/apply-patch+yaml (server-side apply, forced) of obj at path; returns the object."""
    response = kube_request(
        api,
        "PATCH",
        path,
        body=obj,
        query=[("fieldManager", manager), ("force", "true")],
        headers={"Content-Type": "application/apply-patch+yaml"},
    )
    if response.status >= 300:
        raise AssertionError(f"apply {path}: HTTP {response.status}: {response.body[:2000]!r}")
    return response.json()


def wait_established(api: Any, names: list[str], timeout: float = 30.0) -> None:
    from kubernetes import client

    extensions = client.ApiextensionsV1Api(api)
    deadline = time.monotonic() + timeout
    pending = set(names)
    while pending:
        for name in sorted(pending):
            crd = extensions.read_custom_resource_definition(name)
            conditions = {c.type: c for c in (crd.status.conditions or [])} if crd.status else {}
            established = conditions.get("Established")
            if established is not None and established.status == "True":
                pending.discard(name)
            elif conditions.get("NamesAccepted") is not None and conditions["NamesAccepted"].status == "False":
                raise AssertionError(f"CRD {name} names not accepted: {conditions['NamesAccepted'].message}")
        if pending and time.monotonic() > deadline:
            raise AssertionError(f"CRDs not Established after {timeout:.0f}s: {sorted(pending)}")
        if pending:
            time.sleep(0.1)


def find_kubectl() -> Path | None:
    """kubectl: ELASTICGPU_KUBECTL_BIN, else the one build.sh unpacked, else PATH."""
    candidates = [
        os.environ.get("ELASTICGPU_KUBECTL_BIN"),
        _read_env_file(cache_dir() / "current.env").get("ELASTICGPU_KUBECTL_BIN"),
        shutil.which("kubectl"),
    ]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write_certs(directory: Path) -> dict[str, Path]:
    """CA, server certificate (127.0.0.1/localhost) and an admin client certificate, EC P-256."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    not_before, not_after = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=2)

    def key() -> ec.EllipticCurvePrivateKey:
        return ec.generate_private_key(ec.SECP256R1())

    def name(cn: str, org: str | None = None) -> x509.Name:
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
        if org:
            attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
        return x509.Name(attrs)

    ca_key = key()
    ca_name = name("elasticgpu-test-ca")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(subject: x509.Name, usage: x509.ObjectIdentifier, san: x509.SubjectAlternativeName | None):
        k = key()
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(k.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        )
        if san is not None:
            builder = builder.add_extension(san, critical=False)
        return k, builder.sign(ca_key, hashes.SHA256())

    server_key, server_cert = leaf(
        name("elasticgpu-test-apiserver"),
        ExtendedKeyUsageOID.SERVER_AUTH,
        x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
    )
    client_key, client_cert = leaf(
        name("elasticgpu-test-admin", "system:masters"), ExtendedKeyUsageOID.CLIENT_AUTH, None
    )

    def pem_key(k: ec.EllipticCurvePrivateKey) -> bytes:
        return k.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    files = {
        "ca.crt": ca_cert.public_bytes(serialization.Encoding.PEM),
        "server.crt": server_cert.public_bytes(serialization.Encoding.PEM),
        "server.key": pem_key(server_key),
        "client.crt": client_cert.public_bytes(serialization.Encoding.PEM),
        "client.key": pem_key(client_key),
    }
    paths = {}
    for file_name, data in files.items():
        path = directory / file_name
        path.write_bytes(data)
        path.chmod(0o600)
        paths[file_name] = path
    return paths


def _write_kubeconfig(path: Path, server: str, certs: dict[str, Path]) -> None:
    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "elasticgpu-test",
                "cluster": {"server": server, "certificate-authority-data": b64(certs["ca.crt"])},
            }
        ],
        "users": [
            {
                "name": "elasticgpu-test-admin",
                "user": {
                    "client-certificate-data": b64(certs["client.crt"]),
                    "client-key-data": b64(certs["client.key"]),
                },
            }
        ],
        "contexts": [
            {"name": "elasticgpu-test", "context": {"cluster": "elasticgpu-test", "user": "elasticgpu-test-admin"}}
        ],
        "current-context": "elasticgpu-test",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _stop(proc: subprocess.Popen[bytes] | None, timeout: float = 15.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout)


def _wait_until(check, what: str, procs: list[tuple[str, subprocess.Popen[bytes], Path]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last_error = ""
    while time.monotonic() < deadline:
        for proc_name, proc, log in procs:
            if proc.poll() is not None:
                raise ClusterStartError(
                    f"{proc_name} exited with {proc.returncode} while waiting for {what}:\n{_tail(log)}"
                )
        try:
            if check():
                return
        except (OSError, urllib.error.URLError, ssl.SSLError) as e:
            last_error = str(e)
        time.sleep(0.2)
    logs = "\n".join(f"--- {n} ---\n{_tail(log)}" for n, _, log in procs)
    raise ClusterStartError(f"timed out after {timeout:.0f}s waiting for {what} ({last_error})\n{logs}")


def _external_cluster(kubeconfig: Path) -> TestCluster:
    config = yaml.safe_load(kubeconfig.read_text()) or {}
    contexts = {c["name"]: c.get("context", {}) for c in config.get("contexts") or []}
    clusters = {c["name"]: c.get("cluster", {}) for c in config.get("clusters") or []}
    context = contexts.get(config.get("current-context", ""), {})
    server = clusters.get(context.get("cluster", ""), {}).get("server", "")
    return TestCluster(kubeconfig=kubeconfig, server=server, external=True, kubectl=find_kubectl())


def _read_versions(server_bin: Path) -> dict[str, str]:
    versions: dict[str, str] = {}
    path = server_bin.parent / "versions.txt"
    if path.is_file():
        for line in path.read_text().splitlines():
            pkg, sep, ver = line.partition("=")
            if sep and not line.startswith("#"):
                versions[pkg] = ver
    return versions


def _sweep_stale_dirs() -> None:
    """Remove temp dirs of earlier runs whose test process died without cleaning up (SIGKILL)."""
    for d in Path(tempfile.gettempdir()).glob(f"{TMP_PREFIX}*"):
        try:
            pid = int((d / "owner.pid").read_text())
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:
            pass


def _sigterm_as_keyboard_interrupt() -> None:
    """Let SIGTERM (CI timeouts) unwind like Ctrl-C so the cluster is stopped; only if nobody handles it."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:

        def _raise(signum: int, frame: object) -> None:
            raise KeyboardInterrupt("SIGTERM")

        signal.signal(signal.SIGTERM, _raise)


@contextlib.contextmanager
def running_cluster() -> Iterator[TestCluster]:
    """Start etcd + the test server (or use ELASTICGPU_TEST_KUBECONFIG); stop and clean up on exit."""
    external = os.environ.get(KUBECONFIG_ENV)
    if external:
        yield _external_cluster(Path(external).expanduser())
        return

    server_bin, etcd_bin = find_binaries()
    _sweep_stale_dirs()
    _sigterm_as_keyboard_interrupt()
    tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX))
    (tmp / "owner.pid").write_text(str(os.getpid()))
    etcd_proc: subprocess.Popen[bytes] | None = None
    server_proc: subprocess.Popen[bytes] | None = None
    try:
        certs = _write_certs(tmp)
        etcd_port, peer_port, api_port = _free_port(), _free_port(), _free_port()
        etcd_url, peer_url = f"http://127.0.0.1:{etcd_port}", f"http://127.0.0.1:{peer_port}"
        etcd_log, server_log = tmp / "etcd.log", tmp / "apiserver.log"
        with etcd_log.open("wb") as out:
            etcd_proc = spawning.spawn(
                [
                    str(etcd_bin), "--name", "default", "--data-dir", str(tmp / "etcd"),
                    "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
                    "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                    "--initial-cluster", f"default={peer_url}", "--unsafe-no-fsync", "--log-level", "warn",
                ],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        etcd_procs = [("etcd", etcd_proc, etcd_log)]

        def etcd_healthy() -> bool:
            with urllib.request.urlopen(f"{etcd_url}/health", timeout=2) as r:
                return r.status == 200

        _wait_until(etcd_healthy, "etcd /health", etcd_procs, START_TIMEOUT_S)

        server = f"https://127.0.0.1:{api_port}"
        with server_log.open("wb") as out:
            server_proc = spawning.spawn(
                [
                    str(server_bin), "--etcd-servers", etcd_url,
                    "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
                    "--secure-port", str(api_port), "--cert-dir", str(tmp / "certs"),
                    "--tls-cert-file", str(certs["server.crt"]), "--tls-private-key-file", str(certs["server.key"]),
                    "--client-ca-file", str(certs["ca.crt"]), "-v", os.environ.get("ELASTICGPU_TESTSERVER_V", "1"),
                ],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "GOGC": os.environ.get("GOGC", SERVER_GOGC)},
            )  # fmt: skip
        cluster = TestCluster(
            kubeconfig=tmp / "kubeconfig",
            server=server,
            ca_file=certs["ca.crt"],
            client_cert_file=certs["client.crt"],
            client_key_file=certs["client.key"],
            log_dir=tmp,
            kubectl=find_kubectl(),
            versions=_read_versions(server_bin),
        )
        ctx = cluster.ssl_context()

        def server_ready() -> bool:
            try:
                with urllib.request.urlopen(f"{server}/readyz", timeout=5, context=ctx) as r:
                    return r.status == 200
            except urllib.error.HTTPError:
                return False

        _wait_until(
            server_ready, "API server /readyz", [*etcd_procs, ("apiserver", server_proc, server_log)], START_TIMEOUT_S
        )
        _write_kubeconfig(cluster.kubeconfig, server, certs)
        yield cluster
    finally:
        _stop(server_proc)
        _stop(etcd_proc)
        if os.environ.get("ELASTICGPU_TEST_KEEP_LOGS"):
            keep = Path(os.environ["ELASTICGPU_TEST_KEEP_LOGS"])
            keep.mkdir(parents=True, exist_ok=True)
            for name in ("etcd.log", "apiserver.log"):
                if (tmp / name).exists():
                    shutil.copy(tmp / name, keep / name)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    # Manual use: python -m tests.kube_cluster  (prints KUBECONFIG, waits for Ctrl-C)
    def _interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    with running_cluster() as c:
        print(f"export KUBECONFIG={c.kubeconfig}  # server {c.server}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
