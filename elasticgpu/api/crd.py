"""CustomResourceDefinitions derived from the models, so CRDs and models cannot drift.

Each pydantic field becomes a property with its description (for `kubectl explain`), its
constraints (ge/le/min_length/max_length/pattern) and the CRD-only extras attached with
`schema.crd_field`; a model's `crd_rules` become its `x-kubernetes-validations`.
"""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any

import annotated_types
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from elasticgpu.api import names
from elasticgpu.api.kinds import KINDS, KindInfo, PrinterColumn
from elasticgpu.api.schema import CRD_EXTRA, SCHEMA_DEFAULT

_SCALARS: dict[type, str] = {str: "string", int: "integer", bool: "boolean", float: "number"}


def _strip_none(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _apply_constraints(schema: dict[str, Any], metadata: list[Any]) -> None:
    kind = schema.get("type")
    for item in metadata:
        if isinstance(item, annotated_types.Ge):
            schema["minimum"] = item.ge
        elif isinstance(item, annotated_types.Gt):
            schema["minimum"] = item.gt
            schema["exclusiveMinimum"] = True
        elif isinstance(item, annotated_types.Le):
            schema["maximum"] = item.le
        elif isinstance(item, annotated_types.MinLen):
            key = {"array": "minItems", "object": "minProperties"}.get(str(kind), "minLength")
            schema[key] = item.min_length
        elif isinstance(item, annotated_types.MaxLen):
            key = {"array": "maxItems", "object": "maxProperties"}.get(str(kind), "maxLength")
            schema[key] = item.max_length
        elif getattr(item, "pattern", None):
            schema["pattern"] = item.pattern
        elif isinstance(item, FieldInfo):
            _apply_field_info(schema, item)


def _apply_field_info(schema: dict[str, Any], info: FieldInfo) -> None:
    _apply_constraints(schema, list(info.metadata))
    if info.description:
        schema["description"] = info.description
    extra = info.json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get(CRD_EXTRA), dict):
        crd_extra = dict(extra[CRD_EXTRA])  # type: ignore[arg-type]
        if crd_extra.get("x-kubernetes-int-or-string"):
            schema.pop("type", None)
        if crd_extra.pop(SCHEMA_DEFAULT, False):
            schema["default"] = info.get_default(call_default_factory=True)
        schema.update(crd_extra)


def schema_for(annotation: Any) -> dict[str, Any]:
    """OpenAPI v3 (structural) schema of a type annotation."""
    annotation = _strip_none(annotation)
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        base, *metadata = typing.get_args(annotation)
        schema = schema_for(base)
        _apply_constraints(schema, metadata)
        return schema
    if origin is typing.Literal:
        return {"type": "string", "enum": list(typing.get_args(annotation))}
    if origin in (list, tuple):
        item = typing.get_args(annotation)[0]
        return {"type": "array", "items": schema_for(item)}
    if origin is dict:
        _, value = typing.get_args(annotation)
        if value is Any:
            return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        return {"type": "object", "additionalProperties": schema_for(value)}
    if origin in (typing.Union, types.UnionType):
        # int | str is the only union the models use: a quantity.
        return {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]}
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return schema_for_model(annotation)
    if annotation in _SCALARS:
        return {"type": _SCALARS[annotation]}
    raise TypeError(f"no CRD schema for annotation {annotation!r}")


def schema_for_model(model: type[BaseModel], *, top_level: bool = False) -> dict[str, Any]:
    """Schema of one model: its fields as properties, its `crd_rules` as CEL validations."""
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, info in model.model_fields.items():
        key = info.alias or name
        if top_level and key == "metadata":
            properties[key] = {"type": "object"}
            continue
        if top_level and key in ("apiVersion", "kind"):
            properties[key] = {"type": "string", "description": info.description or key}
            continue
        prop = schema_for(info.annotation)
        _apply_field_info(prop, info)
        properties[key] = prop
        if info.is_required():
            required.append(key)
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if model.__doc__ and not top_level:
        schema["description"] = inspect.cleandoc(model.__doc__)
    if required:
        schema["required"] = required
    rules = getattr(model, "crd_rules", None)
    if rules:
        schema["x-kubernetes-validations"] = list(rules)
    return schema


def _column(column: PrinterColumn) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": column.name,
        "type": column.type,
        "jsonPath": column.json_path,
        "description": column.description,
    }
    if column.priority:
        entry["priority"] = column.priority
    return entry


def crd_for(info: KindInfo) -> dict[str, Any]:
    """The CustomResourceDefinition of one kind."""
    root = schema_for_model(info.model, top_level=True)
    root["description"] = inspect.cleandoc(info.model.__doc__ or info.kind)
    version: dict[str, Any] = {
        "name": names.VERSION,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": root},
        "subresources": {"status": {}},
        "additionalPrinterColumns": [_column(c) for c in info.columns],
    }
    if info.selectable_fields:
        version["selectableFields"] = [{"jsonPath": path} for path in info.selectable_fields]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": info.crd_name},
        "spec": {
            "group": names.GROUP,
            "names": {
                "kind": info.kind,
                "listKind": f"{info.kind}List",
                "plural": info.plural,
                "singular": info.singular,
                "shortNames": list(info.short_names),
                "categories": [names.CATEGORY],
            },
            "scope": "Namespaced" if info.namespaced else "Cluster",
            "versions": [version],
        },
    }


class _PlainDumper(yaml.SafeDumper):
    """Never writes YAML anchors: shared sub-schemas are spelled out in full for readers."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def crd_yaml(info: KindInfo) -> str:
    """The CRD of one kind as the YAML kept in `crds/`."""
    header = "# Generated from elasticgpu.api by `elasticgpu crds --write`; do not edit by hand.\n"
    return header + yaml.dump(crd_for(info), Dumper=_PlainDumper, sort_keys=False, width=120)


def all_crds() -> dict[str, str]:
    """File name -> YAML of every CRD."""
    return {info.crd_file: crd_yaml(info) for info in KINDS}
