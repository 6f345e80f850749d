"""The CRDs in crds/ are the models' schemas: generated from them and checked field by field."""

from __future__ import annotations

import inspect
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

import elasticgpu.api as api
from elasticgpu.api import crd
from elasticgpu.api.kinds import KINDS, KindInfo

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted([*(ROOT / "examples").glob("*.yaml"), *(ROOT / "examples" / "demo").glob("*.yaml")])
BY_KIND = {info.kind: info for info in KINDS}


@pytest.mark.parametrize("info", KINDS, ids=lambda info: info.kind)
def test_committed_crd_is_generated_from_the_model(info: KindInfo) -> None:
    committed = (ROOT / "crds" / info.crd_file).read_text()
    assert committed == crd.crd_yaml(info), "crds/ is stale: run `python -m elasticgpu crds --write crds`"


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model inside `X | None`, `list[X]` or `X` itself, if any."""
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return annotation
    for argument in typing.get_args(annotation):
        found = _model_of(argument)
        if found is not None:
            return found
    return None


def _walk(model: type[BaseModel], schema: dict[str, Any], path: str, top: bool = False) -> list[str]:
    """Differences between a model's fields and a CRD schema's properties, recursively."""
    problems: list[str] = []
    fields = {info.alias or name: info for name, info in model.model_fields.items()}
    properties = schema.get("properties", {})
    if set(fields) != set(properties):
        problems.append(f"{path}: model {sorted(fields)} != CRD {sorted(properties)}")
    for key, info in fields.items():
        if key not in properties or (top and key == "metadata"):
            continue
        prop = properties[key]
        if not top and not prop.get("description"):
            problems.append(f"{path}.{key}: no description for kubectl explain")
        if info.is_required() != (key in schema.get("required", [])):
            problems.append(f"{path}.{key}: required in model={info.is_required()} but not in CRD")
        sub = _model_of(info.annotation)
        if sub is not None:
            target = prop.get("items", prop) if prop.get("type") == "array" else prop
            problems.extend(_walk(sub, target, f"{path}.{key}"))
    return problems


@pytest.mark.parametrize("info", KINDS, ids=lambda info: info.kind)
def test_crd_and_model_agree_field_by_field(info: KindInfo) -> None:
    document = yaml.safe_load((ROOT / "crds" / info.crd_file).read_text())
    schema = document["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert _walk(info.model, schema, info.kind, top=True) == []


@pytest.mark.parametrize(
    ("info", "short", "columns"),
    [
        (BY_KIND["ElasticGPUClaim"], "egpuc", ["Status", "EGPU", "Core", "Memory", "Node", "Class", "Reason", "Age"]),
        (
            BY_KIND["ElasticGPU"],
            "egpu",
            ["Node", "GPUs", "Core", "Memory", "Status", "Claim", "Class", "Reason", "Age"],
        ),
        (BY_KIND["ElasticGPUClass"], "egpuclass",
         ["Provisioner", "BindingMode", "EgpuBindingMode", "Reclaim", "Isolation", "Age"]),
        (BY_KIND["GPU"], "pgpu", ["Node", "Model", "Memory", "Allocatable", "Health", "Owner", "Desired", "Age"]),
    ],
    ids=lambda value: getattr(value, "kind", None) or str(value)[:8],
)
def test_names_and_columns(info: KindInfo, short: str, columns: list[str]) -> None:
    document = crd.crd_for(info)
    assert document["spec"]["names"]["shortNames"] == [short]
    # Not "elasticgpu": that is the ElasticGPU kind's singular, and kubectl would read
    # `kubectl get elasticgpu NAME` as the category (NAME not found among the claims).
    assert document["spec"]["names"]["categories"] == ["elasticgpu-all"]
    version = document["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    default = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert default == columns


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_round_trip_through_the_models(path: Path) -> None:
    manifest = yaml.safe_load(path.read_text())
    model = BY_KIND[manifest["kind"]].model.model_validate(manifest)
    written = model.to_dict()
    manifest.pop("metadata")
    assert _contains(written, manifest), "the model lost or changed a field of the example"


def _contains(big: Any, small: Any) -> bool:
    """True when every field of `small` is in `big` with the same value (defaults may be added)."""
    if isinstance(small, dict):
        return isinstance(big, dict) and all(key in big and _contains(big[key], v) for key, v in small.items())
    return bool(big == small)


def test_upstream_spellings_are_accepted() -> None:
    claim = api.ElasticGPUClaim.model_validate(
        {"spec": {"egpuClassName": "old", "resources": {"requests": {api.names.RESOURCE_CORE: 10}}}}
    )
    assert claim.spec.class_name == "old"
    klass = api.ElasticGPUClass.model_validate({"provisioner": "example.com/p", "egpuBindingMode": "Immediate"})
    klass.check()
    assert klass.effective_binding_mode == "Immediate"
    wait = "WaitForFirstConsumer"
    both = {"provisioner": "example.com/p", "bindingMode": wait, "egpuBindingMode": wait}
    assert api.ElasticGPUClass.model_validate(both).effective_binding_mode == "WaitForFirstConsumer"


def test_upstream_binding_mode_alone_asks_for_wait_for_first_consumer() -> None:
    # Issue 15: bindingMode had a schema default (Immediate), so the server saw both spellings and
    # refused the upstream class as a disagreement. Now the mode is bindingMode, else egpuBindingMode.
    upstream = {"provisioner": "example.com/p", "egpuBindingMode": "WaitForFirstConsumer"}
    klass = api.ElasticGPUClass.model_validate(upstream)
    klass.check()
    assert klass.effective_binding_mode == "WaitForFirstConsumer"
    assert api.ElasticGPUClass.model_validate({"provisioner": "example.com/p"}).effective_binding_mode == "Immediate"
    disagree = {**upstream, "bindingMode": "Immediate"}
    with pytest.raises(api.InvalidSpec, match="bindingMode: must equal egpuBindingMode"):
        api.ElasticGPUClass.model_validate(disagree).check()


def test_binding_mode_has_no_schema_default_and_reclaim_policy_has() -> None:
    schema = crd.crd_for(BY_KIND["ElasticGPUClass"])["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    # A default on either spelling would make the other one alone read as a disagreement.
    assert "default" not in schema["properties"]["bindingMode"]
    assert "default" not in schema["properties"]["egpuBindingMode"]
    assert schema["properties"]["reclaimPolicy"]["default"] == "Delete"
    dumped = api.ElasticGPUClass.model_validate({"provisioner": "example.com/p"}).model_dump(by_alias=True)
    assert dumped["reclaimPolicy"] == "Delete"


def test_examples_pass_the_python_checks() -> None:
    for path in EXAMPLES:
        manifest = yaml.safe_load(path.read_text())
        BY_KIND[manifest["kind"]].model.model_validate(manifest).check()  # type: ignore[attr-defined]


def test_public_surface_is_sorted_and_complete() -> None:
    # ruff's RUF022 order: SCREAMING_CASE, then CamelCase, then the rest.
    assert api.__all__ == sorted(api.__all__, key=lambda n: (not n.isupper(), not n[:1].isupper(), n))
    public = {name for name in vars(api) if not name.startswith("_")}
    modules = {name for name in public if inspect.ismodule(getattr(api, name))}
    assert set(api.__all__) == public - (modules - {"names"})
