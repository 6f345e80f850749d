"""Every manifest under tests/invalid/ is refused by the API server's own CRD validation
(structural schema and CEL), with a message that names the field; Python agrees."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml
from kubernetes import client

from elasticgpu.api import InvalidSpec
from tests.crds.objects import BY_KIND, Objects

CORPUS = sorted((Path(__file__).resolve().parents[1] / "invalid").glob("*.yaml"))


def _load(path: Path) -> tuple[str, list[dict[str, Any]]]:
    text = path.read_text()
    match = re.search(r"^# expect: (.+)$", text, re.MULTILINE)
    assert match, f"{path.name} has no '# expect:' line"
    return match.group(1).strip(), list(yaml.safe_load_all(text))


def test_corpus_is_large_enough() -> None:
    assert len(CORPUS) >= 25


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_server_refuses_with_a_message_naming_the_field(path: Path, objects: Objects) -> None:
    expect, documents = _load(path)
    *before, refused = documents
    for manifest in [*before, refused]:
        objects.delete(manifest)
    try:
        for manifest in before:
            objects.create(manifest)
        with pytest.raises(client.ApiException) as caught:
            if before:
                current = objects.get(refused)
                refused["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                objects.replace(refused)
            else:
                objects.create(refused)
        assert caught.value.status == 422, caught.value.body
        assert expect in caught.value.body, f"expected {expect!r} in {caught.value.body}"
        if not before:
            with pytest.raises(client.ApiException) as missing:
                objects.get(refused)
            assert missing.value.status == 404, "a refused object must not be stored"
    finally:
        for manifest in documents:
            objects.delete(manifest)


def _creates() -> list[Path]:
    return [path for path in CORPUS if len(_load(path)[1]) == 1]


@pytest.mark.parametrize("path", _creates(), ids=lambda p: p.stem)
def test_python_refuses_the_same_objects(path: Path) -> None:
    """The models refuse every object the server refuses on create: pydantic on load (types,
    required fields, bounds) or `check()` (the rules), naming the same field. Rules on updates
    (set once, immutable) are the server's alone: nothing in Python writes an old and a new object."""
    expect, (manifest,) = _load(path)
    field = expect.split(":")[0]
    model = BY_KIND[manifest["kind"]].model
    try:
        loaded = model.model_validate(manifest)
    except pydantic.ValidationError as err:
        # pydantic spells list indexes as path items: spec.selector.matchExpressions.0.operator
        where = {".".join(str(part) for part in error["loc"]) for error in err.errors()}
        assert re.sub(r"\[(\d+)\]", r".\1", field) in where, f"expected the field {field!r} in {err}"
        return
    with pytest.raises(InvalidSpec) as caught:
        loaded.check()  # type: ignore[attr-defined]
    assert field in str(caught.value), f"expected the field {field!r} in {caught.value}"
