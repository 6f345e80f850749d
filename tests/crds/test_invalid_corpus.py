"""Every manifest under tests/invalid/ is refused by the API server's own CRD validation
(structural schema and CEL), with a message that names the field; Python agrees."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from elasticgpu.api import ElasticGPUClaim, InvalidClassParameters, InvalidSpec, parse_class_parameters
from tests.crds.objects import Objects

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


@pytest.mark.parametrize(
    "path", [p for p in CORPUS if "claim" in p.stem and "resources" in _load(p)[0]], ids=lambda p: p.stem
)
def test_python_refuses_the_same_claims(path: Path) -> None:
    _, documents = _load(path)
    if len(documents) > 1:
        pytest.skip("transition rules are the server's job")
    spec = documents[-1].get("spec")
    if spec is None or "resources" not in spec:
        pytest.skip("missing fields are the schema's job")
    claim = ElasticGPUClaim.model_validate(documents[-1])
    with pytest.raises(InvalidSpec):
        claim.spec.gpu_request()


@pytest.mark.parametrize(
    "path", [p for p in CORPUS if "class" in p.stem and "parameters." in _load(p)[0]], ids=lambda p: p.stem
)
def test_python_refuses_the_same_class_parameters(path: Path) -> None:
    _, documents = _load(path)
    with pytest.raises(InvalidClassParameters):
        parse_class_parameters(documents[-1]["parameters"])
