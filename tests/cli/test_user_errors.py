"""Every everyday mistake on the command line gets one line naming the file, port or server and the
fix, and exit 2; never a traceback (issue 18). Each case runs the real `elasticgpu` command."""

from __future__ import annotations

import base64
import datetime
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.kube_cluster import TestCluster


def _elasticgpu(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "elasticgpu", *args], capture_output=True, text=True, timeout=90, env=env
    )


def _told_in_one_line(result: subprocess.CompletedProcess[str], *names: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        yield int(s.getsockname()[1])


def _kubeconfig(path: Path, server: str, ca_data: str | None = None) -> Path:
    cluster: dict[str, str] = {"server": server}
    if ca_data:
        cluster["certificate-authority-data"] = ca_data
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return path


def _unrelated_ca() -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "not-the-cluster-ca")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return base64.b64encode(cert.public_bytes(serialization.Encoding.PEM)).decode()


@pytest.mark.parametrize("command", ["controller", "webhook", "crds --apply"])
def test_a_missing_kubeconfig(command: str, tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    _told_in_one_line(_elasticgpu(*command.split(), "--kubeconfig", str(missing)), str(missing), "--kubeconfig")


@pytest.mark.parametrize("command", ["controller", "webhook", "crds --apply"])
def test_a_kubeconfig_that_is_not_yaml(command: str, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage"
    garbage.write_text("clusters: [\n")
    _told_in_one_line(_elasticgpu(*command.split(), "--kubeconfig", str(garbage)), str(garbage), "YAML")


def test_an_unreadable_kubeconfig(tmp_path: Path) -> None:
    folder = tmp_path / "a-folder"  # unreadable as a file even for root
    folder.mkdir()
    _told_in_one_line(_elasticgpu("crds", "--apply", "--kubeconfig", str(folder)), str(folder))


@pytest.mark.parametrize("command", ["controller", "crds --apply"])
def test_a_context_the_kubeconfig_lacks(command: str, tmp_path: Path, closed_port: int) -> None:
    config = _kubeconfig(tmp_path / "kc", f"https://127.0.0.1:{closed_port}")
    line = _told_in_one_line(
        _elasticgpu(*command.split(), "--kubeconfig", str(config), "--context", "elsewhere"), "'elsewhere'"
    )
    assert "get-contexts" in line


def test_crds_apply_with_the_server_down(tmp_path: Path, closed_port: int) -> None:
    config = _kubeconfig(tmp_path / "kc", f"https://127.0.0.1:{closed_port}")
    line = _told_in_one_line(_elasticgpu("crds", "--apply", "--kubeconfig", str(config)), f"127.0.0.1:{closed_port}")
    assert "does not answer" in line


def test_a_server_whose_certificate_the_kubeconfig_does_not_trust(kube_cluster: TestCluster, tmp_path: Path) -> None:
    if kube_cluster.external:
        pytest.skip("the external cluster's own CA is not ours to replace")
    config = _kubeconfig(tmp_path / "kc", kube_cluster.server, ca_data=_unrelated_ca())
    line = _told_in_one_line(_elasticgpu("crds", "--apply", "--kubeconfig", str(config)), "TLS", str(config))
    assert "does not answer" not in line  # told apart from an unreachable server


def test_a_health_port_in_use(tmp_path: Path, taken_port: int, closed_port: int) -> None:
    config = _kubeconfig(tmp_path / "kc", f"https://127.0.0.1:{closed_port}")
    result = _elasticgpu(
        "controller", "--kubeconfig", str(config), "--leader-elect=false",
        "--health-probe-bind-address", f":{taken_port}",
    )  # fmt: skip
    _told_in_one_line(result, str(taken_port), "in use")


@pytest.mark.parametrize("port", ["70000", "-5", "http"])
def test_a_port_out_of_range(port: str) -> None:
    result = _elasticgpu("webhook", "--port", port)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "port" in result.stderr.splitlines()[-1]


def test_plan_of_a_missing_file(tmp_path: Path) -> None:
    _told_in_one_line(_elasticgpu("plan", "-f", str(tmp_path / "gone.yaml")), "gone.yaml", "no such file")


def test_plan_of_malformed_yaml(tmp_path: Path) -> None:
    bad = tmp_path / "claims.yaml"
    bad.write_text("kind: ElasticGPUClaim\nmetadata: {name: [x\n")
    _told_in_one_line(_elasticgpu("plan", "-f", str(bad)), str(bad), "line")


def test_plan_skips_kinds_it_does_not_use_with_a_note(tmp_path: Path) -> None:
    mixed = tmp_path / "mixed.yaml"
    sample = Path(__file__).resolve().parents[2] / "examples" / "plan"
    mixed.write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a}\n")
    result = _elasticgpu("plan", "-f", str(sample), "-f", str(mixed))
    assert result.returncode == 0, result.stderr
    assert "kind Namespace is not used by plan; skipped" in result.stderr


def test_agent_db_with_a_bad_ledger_url() -> None:
    _told_in_one_line(_elasticgpu("agent", "db", "current", "--ledger-url", "nosuchdb://x"), "nosuchdb://x")
