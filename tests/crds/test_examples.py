"""Every manifest in examples/ applies to a real API server and reads back equal, and
`kubectl get` columns come back in the server's Table output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from elasticgpu.api import names
from tests.crds.objects import BY_KIND, Objects

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


def test_examples_cover_the_required_shapes() -> None:
    stems = {path.stem for path in EXAMPLES}
    assert {
        "claim-whole-card",
        "claim-slice",
        "claim-by-name",
        "class-gpushare",
        "class-physical",
        "elasticgpu-static",
        "gpu",
    } <= stems


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_applies_and_reads_back_equal(path: Path, objects: Objects) -> None:
    manifest = yaml.safe_load(path.read_text())
    objects.delete(manifest)
    try:
        objects.create(manifest)
        stored = objects.get(manifest)
        for key, value in manifest.items():
            if key == "metadata":
                for field in ("name", "labels", "annotations"):
                    assert stored["metadata"].get(field) == value.get(field), field
            else:
                assert stored[key] == value, f"{path.name}: the server changed or pruned {key}"
    finally:
        objects.delete(manifest)


def _table(api_client: client.ApiClient, path: str) -> dict[str, Any]:
    method, url, headers, _, _ = api_client.param_serialize(
        method="GET", resource_path=path, header_params={"Accept": TABLE}
    )
    raw = api_client.call_api(method, url, header_params=headers)
    raw.read()
    response: dict[str, Any] = json.loads(raw.data)
    assert response["kind"] == "Table", response
    return response


def _row(table: dict[str, Any], name: str) -> dict[str, Any]:
    columns = [column["name"] for column in table["columnDefinitions"]]
    for row in table["rows"]:
        cells = dict(zip(columns, row["cells"], strict=True))
        if cells["Name"] == name:
            return cells
    raise AssertionError(f"{name} not in table {table['rows']}")


def test_claim_columns(api_client: client.ApiClient, objects: Objects, namespace: str) -> None:
    manifest = yaml.safe_load(Path(EXAMPLES[0].parent / "claim-slice.yaml").read_text())
    manifest["spec"]["elasticGPUClassName"] = "gpushare"
    objects.create(manifest)
    objects.patch_status(
        manifest,
        {
            "phase": "Bound",
            "capacity": {names.RESOURCE_CORE: 30, names.RESOURCE_MEMORY: "10Gi"},
            "nodeName": "gpu-node-1",
            "gpus": ["GPU-1"],
        },
    )
    plural = BY_KIND[names.KIND_CLAIM].plural
    table = _table(api_client, f"/apis/{names.API_VERSION}/namespaces/{namespace}/{plural}")
    cells = _row(table, "notebook")
    assert list(cells) == ["Name", "Status", "EGPU", "Core", "Memory", "Node", "Class", "Age", "Reason"]
    assert (cells["Status"], cells["Core"], cells["Memory"], cells["Node"], cells["Class"]) == (
        "Bound",
        30,
        "10Gi",
        "gpu-node-1",
        "gpushare",
    )


def test_elastic_gpu_columns(api_client: client.ApiClient, objects: Objects) -> None:
    manifest = yaml.safe_load(Path(EXAMPLES[0].parent / "elasticgpu-static.yaml").read_text())
    objects.delete(manifest)
    try:
        objects.create(manifest)
        objects.patch_status(
            manifest,
            {
                "phase": "Available",
                "capacity": {names.RESOURCE_CORE: 25, names.RESOURCE_MEMORY: "20Gi"},
                "nodeName": "gpu-node-1",
                "gpus": ["GPU-a", "GPU-b"],
            },
        )
        table = _table(api_client, f"/apis/{names.API_VERSION}/{names.PLURAL_ELASTIC_GPU}")
        cells = _row(table, "static-a100-slice")
        assert list(cells) == ["Name", "Node", "GPUs", "Core", "Memory", "Status", "Claim", "Class", "Age", "Reason"]
        assert (cells["Node"], cells["GPUs"], cells["Core"], cells["Memory"], cells["Status"]) == (
            "gpu-node-1",
            '["GPU-a","GPU-b"]',
            25,
            "20Gi",
            "Available",
        )
    finally:
        objects.delete(manifest)


@pytest.mark.parametrize(
    ("example", "plural", "expected"),
    [
        ("class-physical", names.PLURAL_CLASS, {"Provisioner": "elasticgpu.io/physical", "Reclaim": "Delete"}),
        ("gpu", names.PLURAL_GPU, {"Node": "gpu-node-1", "Model": "NVIDIA A100-SXM4-80GB", "Memory": 81920}),
    ],
)
def test_cluster_kind_columns(
    api_client: client.ApiClient, objects: Objects, example: str, plural: str, expected: dict[str, Any]
) -> None:
    manifest = yaml.safe_load(Path(EXAMPLES[0].parent / f"{example}.yaml").read_text())
    objects.delete(manifest)
    try:
        objects.create(manifest)
        cells = _row(_table(api_client, f"/apis/{names.API_VERSION}/{plural}"), manifest["metadata"]["name"])
        assert {key: cells[key] for key in expected} == expected
    finally:
        objects.delete(manifest)
