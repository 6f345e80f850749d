"""Every manifest in examples/ applies to a real API server and reads back equal, and
`kubectl get` columns come back in the server's Table output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from elasticgpu.api import ObjectReference, allocatable_summary, claim_key, gpu_capacity, gpu_list, names
from tests.crds.objects import BY_KIND, Objects

ROOT = Path(__file__).resolve().parents[2]
# The manifests: examples/ (what `kubectl apply -f examples/` applies) and examples/demo/ (demo-only
# objects); examples/sim/ and examples/plan/ hold the agent's simulation and plan's input, not objects.
EXAMPLES = sorted([*(ROOT / "examples").glob("*.yaml"), *(ROOT / "examples" / "demo").glob("*.yaml")])
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


def test_kubectl_apply_of_examples_creates_nothing_fake() -> None:
    # `kubectl apply -f examples/` (not recursive) on a real cluster must create no GPU object (the
    # agents' to write) and nothing that names one: those live in examples/demo/, with a warning.
    applied = [doc for path in sorted((ROOT / "examples").glob("*.yaml"))
               for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert applied, "examples/ has no manifests"
    assert [d["kind"] for d in applied if d["kind"] in (names.KIND_GPU, names.KIND_ELASTIC_GPU)] == []
    assert [d["metadata"]["name"] for d in applied if (d.get("spec") or {}).get("elasticGPUName")] == []
    demo = sorted((ROOT / "examples" / "demo").glob("*.yaml"))
    assert {p.stem for p in demo} >= {"gpu", "elasticgpu-static", "claim-by-name"}
    for path in demo:
        assert path.read_text().startswith("# DEMO ONLY: do not apply to a real cluster."), path


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


def _example(stem: str) -> dict[str, Any]:
    [path] = [p for p in EXAMPLES if p.stem == stem]
    loaded: dict[str, Any] = yaml.safe_load(path.read_text())
    return loaded


def test_claim_columns(api_client: client.ApiClient, objects: Objects, namespace: str) -> None:
    manifest = _example("claim-slice")
    objects.create(manifest)
    # What the controller writes on bind: the ElasticGPU's name and the class it used (the
    # default one: the claim named none), in one patch; then the status.
    stored = objects.get(manifest)
    bind = {"metadata": {"resourceVersion": stored["metadata"]["resourceVersion"]},
            "spec": {"elasticGPUName": "egpu-1234", "elasticGPUClassName": "gpushare"}}
    objects.patch(manifest, bind)
    objects.patch_status(
        manifest,
        {
            "phase": "Bound",
            "capacity": {names.RESOURCE_CORE: 30, names.RESOURCE_MEMORY: "10Gi"},
            "nodeName": "gpu-node-1",
            "gpus": ["GPU-1"],
            "policing": {"overLimitAction": "StopContainer", "overLimitGraceSeconds": 30},
            "isolation": "MPS",
        },
    )
    plural = BY_KIND[names.KIND_CLAIM].plural
    table = _table(api_client, f"/apis/{names.API_VERSION}/namespaces/{namespace}/{plural}")
    cells = _row(table, "notebook")
    assert list(cells) == ["Name", "Status", "EGPU", "Core", "Memory", "Node", "Class", "Reason", "Age",
                           "Sizing", "Rec-Core", "Rec-Memory", "Isolation", "Over-Limit",
                           "Profile"]  # the last six: -o wide
    assert cells["Isolation"] == "MPS"  # what protects the claim, from its class (docs/isolation.md)
    assert (cells["Status"], cells["EGPU"], cells["Core"], cells["Memory"], cells["Node"], cells["Class"]) == (
        "Bound",
        "egpu-1234",
        30,
        "10Gi",
        "gpu-node-1",
        "gpushare",
    )
    assert cells["Over-Limit"] == "StopContainer"  # the class's policy, copied on bind (issue 25)


def test_elastic_gpu_columns(api_client: client.ApiClient, objects: Objects) -> None:
    manifest = _example("elasticgpu-static")
    objects.delete(manifest)
    try:
        objects.create(manifest)
        ref = ObjectReference(namespace="team-a", name="inference", uid="u-1")
        stored = objects.get(manifest)
        objects.patch(manifest, {"metadata": {"resourceVersion": stored["metadata"]["resourceVersion"]},
                                 "spec": {"claimRef": ref.to_dict()}})
        gpus = ["GPU-a", "GPU-b"]
        objects.patch_status(
            manifest,
            {
                "phase": "Bound",
                "capacity": {names.RESOURCE_CORE: 25, names.RESOURCE_MEMORY: "20Gi"},
                "nodeName": "gpu-node-1",
                "gpus": gpus,
                "gpuList": gpu_list(gpus),
                "claim": claim_key(ref),
            },
        )
        table = _table(api_client, f"/apis/{names.API_VERSION}/{names.PLURAL_ELASTIC_GPU}")
        cells = _row(table, "static-a100-slice")
        assert list(cells) == ["Name", "Node", "GPUs", "Core", "Memory", "Status", "Claim", "Class", "Reason", "Age"]
        shown = {key: cells[key] for key in ("Node", "GPUs", "Core", "Memory", "Status", "Claim")}
        assert shown == {
            "Node": "gpu-node-1",
            "GPUs": "GPU-a,GPU-b",
            "Core": 25,
            "Memory": "20Gi",
            "Status": "Bound",
            "Claim": "team-a/inference",
        }
    finally:
        objects.delete(manifest)


def test_gpu_columns(api_client: client.ApiClient, objects: Objects) -> None:
    manifest = _example("gpu")
    objects.delete(manifest)
    try:
        objects.create(manifest)
        # What the agent writes on publishing the card, and the controller with each reservation.
        memory = manifest["spec"]["memory"]
        objects.patch_status(
            manifest,
            {
                "capacity": gpu_capacity(memory),
                "allocatable": {names.RESOURCE_CORE: 70, names.RESOURCE_MEMORY: "40Gi"},
                "allocatableSummary": allocatable_summary(70, memory - 40 * 1024),
                "health": "Healthy",
            },
        )
        cells = _row(_table(api_client, f"/apis/{names.API_VERSION}/{names.PLURAL_GPU}"), manifest["metadata"]["name"])
        assert list(cells) == ["Name", "Node", "Model", "Memory", "Allocatable", "Health", "Owner", "Desired", "Age"]
        assert {key: cells[key] for key in ("Node", "Model", "Memory", "Allocatable", "Health")} == {
            "Node": "gpu-node-1",
            "Model": "NVIDIA A100-SXM4-80GB",
            "Memory": "80Gi",
            "Allocatable": "70%/40Gi",
            "Health": "Healthy",
        }
    finally:
        objects.delete(manifest)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        # Neither spelling: both mode columns blank (None in the Table; their descriptions say: Immediate).
        ({}, {"BindingMode": None, "EgpuBindingMode": None, "Reclaim": "Delete", "Isolation": "None",
              "Over-Limit": "Warn", "Grace": 60}),
        ({"isolation": "HAMiCore"}, {"Isolation": "HAMiCore"}),
        ({"egpuBindingMode": "WaitForFirstConsumer"},
         {"BindingMode": None, "EgpuBindingMode": "WaitForFirstConsumer", "Reclaim": "Delete"}),
        ({"bindingMode": "WaitForFirstConsumer", "reclaimPolicy": "Retain", "overLimitAction": "StopContainer",
          "overLimitGraceSeconds": 0},
         {"BindingMode": "WaitForFirstConsumer", "EgpuBindingMode": None, "Reclaim": "Retain",
          "Over-Limit": "StopContainer", "Grace": 0}),
    ],
    ids=["nothing-set", "isolation", "upstream-spelling", "ours-set"],
)
def test_class_columns_show_the_mode_as_written(
    api_client: client.ApiClient, objects: Objects, fields: dict[str, str], expected: dict[str, str | None]
) -> None:
    manifest = {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND_CLASS,
        "metadata": {"name": "columns-class"},
        "provisioner": names.PROVISIONER_GPUSHARE,
        **fields,
    }
    objects.delete(manifest)
    try:
        objects.create(manifest)
        cells = _row(_table(api_client, f"/apis/{names.API_VERSION}/{names.PLURAL_CLASS}"), "columns-class")
        assert list(cells) == ["Name", "Provisioner", "BindingMode", "EgpuBindingMode", "Reclaim", "Isolation", "Age",
                               "Over-Limit", "Grace"]  # the last two: -o wide
        assert {key: cells[key] for key in expected} == expected
        assert cells["Provisioner"] == names.PROVISIONER_GPUSHARE
    finally:
        objects.delete(manifest)
