"""Building blocks for models that double as CRD schemas.

`KubeModel` is the base of every object model: camelCase on the wire, snake_case in Python.
`crd_field` attaches what only the CRD needs (CEL rules, list types, int-or-string) to a field,
so the model stays the one place where a field is described.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

# Extra schema keys a field or model may carry; `crd.py` copies them into the CRD.
CRD_EXTRA = "crd"
# A `crd_field` key (not copied) asking for the field's Python default as the schema's `default`,
# so the API server fills it in and `kubectl get` never shows the column blank.
SCHEMA_DEFAULT = "elasticgpuSchemaDefault"


class KubeModel(BaseModel):
    """Base of the object models: camelCase aliases, unknown fields ignored (the API server
    prunes them anyway, and a controller must not crash on a field a newer version added)."""

    model_config = ConfigDict(populate_by_name=True, alias_generator=to_camel, extra="ignore")

    def to_dict(self, *, prune_empty: bool = True) -> dict[str, Any]:
        """The object as the API server expects it: camelCase, no None fields, and (by default)
        no empty maps or lists, so a manifest reads back as it was written. Pass
        `prune_empty=False` where an empty list must be written, e.g. to clear allocations."""
        data = self.model_dump(by_alias=True, exclude_none=True, mode="json")
        return _pruned(data) if prune_empty else data


def _pruned(value: Any) -> Any:
    if isinstance(value, dict):
        pruned = {key: _pruned(item) for key, item in value.items()}
        return {key: item for key, item in pruned.items() if item not in ({}, [])}
    if isinstance(value, list):
        return [_pruned(item) for item in value]
    return value


def rule(expression: str, message: str, *, reason: str | None = None, field_path: str | None = None) -> dict[str, str]:
    """One CEL rule (`x-kubernetes-validations` entry). `message` must name the field and the rule."""
    entry = {"rule": expression, "message": message}
    if reason:
        entry["reason"] = reason
    if field_path:
        entry["fieldPath"] = field_path
    return entry


def crd_field(**extra: Any) -> dict[str, Any]:
    """`json_schema_extra` for a field: keys are copied verbatim into the field's CRD schema."""
    return {CRD_EXTRA: extra}


# A quantity as the API server holds it: an integer or a string such as `10Gi`.
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
QUANTITY_MAX_LENGTH = 64
ResourceValue = Annotated[
    int | str,
    Field(
        json_schema_extra=crd_field(
            **{"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]},
            pattern=QUANTITY_PATTERN,
            # Bounds the CEL cost of the rules that read these values as text.
            maxLength=QUANTITY_MAX_LENGTH,
        )
    ),
]
