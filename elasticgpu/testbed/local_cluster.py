"""A throwaway Kubernetes API server: etcd and the project's test server (testserver/), cached.

`testserver/build.sh` builds the real apiextensions-apiserver with the core kinds (a few minutes,
once) and writes `<cache>/testserver/current.env` naming the binaries. `start` runs etcd and the
server on free loopback ports inside a given directory, with a CA, a serving certificate and an
admin client certificate generated for this run, waits for `/readyz` and writes a kubeconfig.
`LocalCluster.stop` stops both; the caller removes the directory.

The tests' fixture (tests/kube_cluster.py) uses this launcher too, with its own way to spawn.
"""

from __future__ import annotations

import base64
import datetime
import os
import shutil
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from elasticgpu.testbed import processes
from elasticgpu.testbed.free_ports import free_port as free_port  # its old home: callers import it from here
from elasticgpu.testbed.free_ports import start_on_free_ports

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "testserver" / "build.sh"
START_TIMEOUT_S = 90.0
"""Seconds etcd and then the server each get to answer their health checks."""
SERVER_GOGC = "400"
"""Go's GC target for the test API server (Go's default is 100; `GOGC` in the environment wins).
It shares two cores with the code under test; a CPU profile under a burst of binds
(`bench/README.md`) showed a third of its CPU in garbage collection. 400 trades a few hundred
MiB of heap for that CPU, as one would give a real control plane more memory."""


def cache_dir() -> Path:
    """Where testserver/build.sh keeps its builds (`$ELASTICGPU_CACHE`, else ~/.cache/elasticgpu)."""
    return Path(os.environ.get("ELASTICGPU_CACHE", str(Path.home() / ".cache" / "elasticgpu"))) / "testserver"


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of a build's current.env (comments skipped; missing file: empty)."""
    values: dict[str, str] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep and not line.startswith("#"):
                values[key.strip()] = value.strip()
    return values


def find_binaries(*, build_if_missing: bool) -> tuple[Path, Path] | None:
    """(server, etcd): `ELASTICGPU_TESTSERVER_BIN`/`ELASTICGPU_ETCD_BIN`, else the cached build,
    else (when allowed) run build.sh first; None when there is none."""
    server_env, etcd_env = os.environ.get("ELASTICGPU_TESTSERVER_BIN"), os.environ.get("ELASTICGPU_ETCD_BIN")
    if server_env and etcd_env:
        return Path(server_env), Path(etcd_env)

    def cached() -> tuple[Path, Path] | None:
        values = read_env_file(cache_dir() / "current.env")
        server, etcd = values.get("ELASTICGPU_TESTSERVER_BIN"), values.get("ELASTICGPU_ETCD_BIN")
        if server and etcd and os.access(server, os.X_OK) and os.access(etcd, os.X_OK):
            return Path(server), Path(etcd)
        return None

    found = cached()
    if found is None and build_if_missing and BUILD_SCRIPT.is_file():
        print(f"no cached API server: building it with `bash {BUILD_SCRIPT}` (a few minutes, once)", file=sys.stderr)
        subprocess.run(["bash", str(BUILD_SCRIPT)], check=False, stdout=subprocess.DEVNULL)
        found = cached()
    return found


def write_certs(directory: Path) -> dict[str, Path]:
    """CA, server certificate (127.0.0.1, localhost) and an admin client certificate
    (group system:masters), EC P-256, valid two days; files `ca.crt`, `server.crt`, `server.key`,
    `client.crt`, `client.key` in `directory`, mode 0600."""
    from elasticgpu import certificate_authority as authority

    now = datetime.datetime.now(datetime.UTC)
    validity = authority.Validity(now - datetime.timedelta(hours=1), now + datetime.timedelta(days=2))
    ca = authority.new_ca("elasticgpu-test-ca", validity)
    server = authority.issue(ca, authority.subject("elasticgpu-test-apiserver"), usage=authority.SERVER_AUTH,
                             hosts=["localhost", "127.0.0.1"], validity=validity)
    client = authority.issue(ca, authority.subject("elasticgpu-test-admin", "system:masters"),
                             usage=authority.CLIENT_AUTH, hosts=None, validity=validity)
    contents = {
        "ca.crt": ca.cert_pem(),
        "server.crt": server.cert_pem(),
        "server.key": server.key_pem(),
        "client.crt": client.cert_pem(),
        "client.key": client.key_pem(),
    }
    paths: dict[str, Path] = {}
    for file_name, data in contents.items():
        path = directory / file_name
        path.write_bytes(data)
        path.chmod(0o600)
        paths[file_name] = path
    return paths


def write_kubeconfig(path: Path, server: str, certs: dict[str, Path]) -> None:
    """A kubeconfig (context `elasticgpu-test`) for `server` with the admin client certificate."""

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


@dataclass
class LocalCluster:
    """A running etcd and API server, and how to reach them."""

    server: str
    kubeconfig: Path
    certs: dict[str, Path]
    etcd: processes.Child
    apiserver: processes.Child
    etcd_url: str = ""
    """etcd's client URL (tests compact it to expire a list's continue token for real)."""

    def ssl_context(self) -> ssl.SSLContext:
        """Client TLS context with the CA and the admin certificate (for raw HTTPS)."""
        context = ssl.create_default_context(cafile=str(self.certs["ca.crt"]))
        context.load_cert_chain(str(self.certs["client.crt"]), str(self.certs["client.key"]))
        return context

    def stop(self) -> None:
        """Stop the server, then etcd."""
        self.apiserver.stop()
        self.etcd.stop()


def start(
    directory: Path,
    children: processes.Children,
    *,
    server_bin: Path,
    etcd_bin: Path,
    verbosity: str = "1",
    timeout_s: float = START_TIMEOUT_S,
) -> LocalCluster:
    """Start etcd and the server with everything under `directory`; DemoError when one does not come up.
    Both are in `children` (stopped by its `stop_all` even when this raises)."""
    certs = write_certs(directory)

    def etcd_command() -> tuple[list[str], str]:
        shutil.rmtree(directory / "etcd", ignore_errors=True)  # a failed attempt's data
        url, peer = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
        return [
            str(etcd_bin), "--name", "default", "--data-dir", str(directory / "etcd"),
            "--listen-client-urls", url, "--advertise-client-urls", url,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"default={peer}", "--unsafe-no-fsync", "--log-level", "warn",
        ], url  # fmt: skip

    def etcd_healthy(url: str) -> Callable[[], bool]:
        def check() -> bool:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                return bool(answer.status == 200)

        return check

    etcd, etcd_url = start_on_free_ports(
        children, "etcd", etcd_command, log=directory / "etcd.log", ready=etcd_healthy, timeout_s=timeout_s
    )

    def server_command() -> tuple[list[str], str]:
        port = free_port()
        return [
            str(server_bin), "--etcd-servers", etcd_url,
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", str(port), "--cert-dir", str(directory / "certs"),
            "--tls-cert-file", str(certs["server.crt"]), "--tls-private-key-file", str(certs["server.key"]),
            "--client-ca-file", str(certs["ca.crt"]), "-v", verbosity,
        ], f"https://127.0.0.1:{port}"  # fmt: skip

    context = ssl.create_default_context(cafile=str(certs["ca.crt"]))
    context.load_cert_chain(str(certs["client.crt"]), str(certs["client.key"]))

    def server_ready(url: str) -> Callable[[], bool]:
        def check() -> bool:
            try:
                with urllib.request.urlopen(f"{url}/readyz", timeout=5, context=context) as answer:
                    return bool(answer.status == 200)
            except urllib.error.HTTPError:
                return False

        return check

    apiserver, server = start_on_free_ports(
        children, "API server", server_command, log=directory / "apiserver.log", ready=server_ready,
        timeout_s=timeout_s, env={"GOGC": os.environ.get("GOGC", SERVER_GOGC)}, also=[etcd],
    )  # fmt: skip
    cluster = LocalCluster(
        server=server, kubeconfig=directory / "kubeconfig", certs=certs, etcd=etcd, apiserver=apiserver,
        etcd_url=etcd_url,
    )
    write_kubeconfig(cluster.kubeconfig, server, certs)
    return cluster
