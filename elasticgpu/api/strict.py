"""Strict reading of a manifest, as `kubectl apply` with strict field validation reads it.

The models ignore fields they do not know (a controller must not crash on a field a newer
version added), so a typo such as `resouces:` or `elasticGpuClassName:` would vanish silently
in an offline tool and bind the claim to something else. An API server with strict field
validation (kubectl's default since 1.27) refuses such a manifest instead; this module does the
same, from the CRD schema the models generate (`crd.crd_for`), so it knows exactly the fields
the cluster knows, and it says what was probably meant:

    unknown field spec.resouces; did you mean spec.resources?

`readable` turns a pydantic ValidationError into the same kind of one line (the field's path and
the rule), without pydantic's own text or link.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from elasticgpu.api import crd
from elasticgpu.api.kinds import KINDS

# metav1.ObjectMeta's fields: the CRD leaves `metadata` to the API server, which knows these.
OBJECT_META_FIELDS = frozenset({
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
    "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations",
    "ownerReferences", "finalizers", "managedFields",
})
_MAP_FIELDS = frozenset({"labels", "annotations"})


def _schema(kind: str) -> dict[str, Any] | None:
    for info in KINDS:
        if info.kind == kind:
            root: dict[str, Any] = crd.crd_for(info)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            return root
    return None


def _suggestion(key: str, known: list[str]) -> str | None:
    """The known field `key` most likely meant: the same letters in another case first
    (`elasticGpuClassName`), else the closest spelling (`resouces`)."""
    for name in known:
        if name.lower() == key.lower():
            return name
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return close[0] if close else None


def _walk(value: Any, schema: dict[str, Any], path: str) -> Iterator[tuple[str, str | None]]:
    """(unknown field's path, the path of what it probably meant) under `value`."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            yield from _walk(item, schema["items"], f"{path}[{index}]")
        return
    if not isinstance(value, dict):
        return
    properties: dict[str, Any] | None = schema.get("properties")
    if properties is None:
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, item in value.items():
                yield from _walk(item, extra, f"{path}[{key}]")
        return
    for key, item in value.items():
        here = f"{path}.{key}" if path else str(key)
        if key in properties:
            if here == "metadata":
                yield from _metadata(item)
            else:
                yield from _walk(item, properties[key], here)
        else:
            meant = _suggestion(str(key), list(properties))
            yield here, (f"{path}.{meant}" if path else meant) if meant else None


def _metadata(value: Any) -> Iterator[tuple[str, str | None]]:
    if not isinstance(value, dict):
        return
    for key in value:
        if key not in OBJECT_META_FIELDS:
            meant = _suggestion(str(key), sorted(OBJECT_META_FIELDS))
            yield f"metadata.{key}", f"metadata.{meant}" if meant else None


def unknown_fields(document: dict[str, Any]) -> list[str]:
    """Every field of `document` (an object of one of our kinds) its CRD does not know, each as
    `unknown field PATH` with `; did you mean PATH?` when a known field is close. Empty for a
    kind that is not ours."""
    schema = _schema(str(document.get("kind")))
    if schema is None:
        return []
    return [
        f"unknown field {path}" + (f"; did you mean {meant}?" if meant else "")
        for path, meant in _walk(document, schema, "")
    ]


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "." in part or "/" in part:
            out += f"[{part}]"  # a resource name such as elasticgpu.io/gpu-core
        else:
            out += f".{part}" if out else part
    return out


def readable(error: ValidationError) -> str:
    """One line per problem of a pydantic error, joined by `; `: `spec.resources: required`,
    `spec.reclaimPolicy: must be one of 'Delete', 'Retain' (got 'delete')`; no pydantic text."""
    told = []
    for problem in error.errors(include_url=False):
        where = _path(tuple(problem.get("loc", ())))
        kind = problem.get("type", "")
        if kind == "missing":
            rule = "required"
        elif kind == "literal_error":
            expected = (problem.get("ctx") or {}).get("expected", "")
            rule = f"must be {expected}"
        elif kind == "value_error":
            rule = str((problem.get("ctx") or {}).get("error") or problem.get("msg", ""))
        else:
            rule = str(problem.get("msg", "")).lower()
        if kind not in ("missing", "value_error") and "input" in problem:
            rule += f" (got {problem['input']!r})"
        told.append(f"{where}: {rule}" if where else rule)
    return "; ".join(told)
