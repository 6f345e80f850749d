"""A real Kubernetes API server for the tests: etcd + testserver/ (apiextensions-apiserver + core kinds).

``running_cluster()`` starts etcd and the test server on free loopback ports with a freshly
generated CA, server and client certificate, waits until ``/readyz`` passes, writes a kubeconfig
and stops everything (process groups killed, temporary directory removed) on exit. The launcher
is ``elasticgpu/testbed/local_cluster.py`` (``elasticgpu demo`` starts the same pair); the children
are spawned by ``tests/spawning.py`` (they die with the test process).

If ``ELASTICGPU_TEST_KUBECONFIG`` is set, nothing is started: that kubeconfig (kind, k3d, a real
cluster) is used as is, so the same tests run against any cluster.

The server and etcd binaries come from ``testserver/build.sh`` (which caches them and writes
``<cache>/testserver/current.env``); ``ELASTICGPU_TESTSERVER_BIN`` / ``ELASTICGPU_ETCD_BIN``
override them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import ssl
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

from elasticgpu.testbed import local_cluster, processes
from tests import spawning

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO_ROOT / "testserver" / "build.sh"
KUBECONFIG_ENV = "ELASTICGPU_TEST_KUBECONFIG"
START_TIMEOUT_S = 90.0
SERVER_GOGC = local_cluster.SERVER_GOGC
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
    etcd_url: str | None = None  # local test server only: etcd's client URL (compaction, tests/controller)
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


cache_dir = local_cluster.cache_dir
_read_env_file = local_cluster.read_env_file


def find_binaries(build_if_missing: bool = True) -> tuple[Path, Path]:
    """Paths of (test server, etcd): env overrides, else build.sh's current.env, else run build.sh."""
    found = local_cluster.find_binaries(build_if_missing=build_if_missing)
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
    # A kubeconfig's token: the client keeps it under "BearerToken" (v35+) or "authorization" (older);
    # auth_settings() gives the header either way. Without it a token user's request went out
    # anonymous (a 403 for the wrong user).
    auth = None
    if hasattr(cfg, "auth_settings"):
        auth = next((s["value"] for s in cfg.auth_settings().values() if s.get("in") == "header" and s.get("value")),
                    None)  # fmt: skip
    if auth is None and hasattr(cfg, "get_api_key_with_prefix"):
        auth = cfg.get_api_key_with_prefix("authorization")
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


# The launcher is elasticgpu/testbed/local_cluster.py (`elasticgpu demo` starts the same pair); other
# tests use these two helpers of it by their old names.
_free_port = local_cluster.free_port
_write_certs = local_cluster.write_certs


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
    children = processes.Children(spawn=spawning.spawn)
    try:
        try:
            local = local_cluster.start(
                tmp, children, server_bin=server_bin, etcd_bin=etcd_bin,
                verbosity=os.environ.get("ELASTICGPU_TESTSERVER_V", "1"), timeout_s=START_TIMEOUT_S,
            )  # fmt: skip
        except processes.DemoError as e:
            logs = "\n".join(f"--- {c.name} ---\n{c.tail(40)}" for c in children.started)
            raise ClusterStartError(f"{e}\n{logs}") from None
        yield TestCluster(
            kubeconfig=local.kubeconfig,
            server=local.server,
            ca_file=local.certs["ca.crt"],
            client_cert_file=local.certs["client.crt"],
            client_key_file=local.certs["client.key"],
            log_dir=tmp,
            kubectl=find_kubectl(),
            versions=_read_versions(server_bin),
            etcd_url=local.etcd_url,
        )
    finally:
        children.stop_all()
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
