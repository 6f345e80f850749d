"""`elasticgpu crds` prints, writes and applies the CRDs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes import client

from elasticgpu.api.kinds import KINDS
from elasticgpu.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_print_gives_the_committed_crds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crds"]) == 0
    printed = [doc for doc in yaml.safe_load_all(capsys.readouterr().out) if doc]
    committed = [yaml.safe_load((ROOT / "crds" / info.crd_file).read_text()) for info in KINDS]
    assert printed == committed


def test_write_creates_one_file_per_kind(tmp_path: Path) -> None:
    assert main(["crds", "--write", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(info.crd_file for info in KINDS)
    for info in KINDS:
        assert (tmp_path / info.crd_file).read_text() == (ROOT / "crds" / info.crd_file).read_text()


def test_apply_installs_and_waits_for_established(
    kube_cluster: object, api_client: client.ApiClient, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = str(kube_cluster.kubeconfig)  # type: ignore[attr-defined]
    assert main(["crds", "--apply", "--kubeconfig", kubeconfig]) == 0
    assert capsys.readouterr().out.count("applied and established") == len(KINDS)
    extensions = client.ApiextensionsV1Api(api_client)
    for info in KINDS:
        crd = extensions.read_custom_resource_definition(info.crd_name)
        established = {c.type: c.status for c in crd.status.conditions}["Established"]
        assert established == "True"
        assert crd.spec.names.short_names == list(info.short_names)
