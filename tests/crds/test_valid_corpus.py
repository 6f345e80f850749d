"""Every manifest under tests/valid/ is accepted by the API server's CRD validation and by the
models' `check()`, and its effective binding mode is the one its `# mode:` line states: the
counterpart of tests/invalid/ for shapes that were once refused by mistake (issue 15)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from elasticgpu.api import ElasticGPUClass
from tests.crds.objects import Objects

CORPUS = sorted((Path(__file__).resolve().parents[1] / "valid").glob("*.yaml"))


def _load(path: Path) -> tuple[str, dict[str, Any]]:
    text = path.read_text()
    match = re.search(r"^# mode: (.+)$", text, re.MULTILINE)
    assert match, f"{path.name} has no '# mode:' line"
    return match.group(1).strip(), yaml.safe_load(text)


def test_corpus_holds_the_upstream_class() -> None:
    assert "class-egpu-binding-mode-alone" in {path.stem for path in CORPUS}


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_server_accepts_and_stores_what_was_written(path: Path, objects: Objects) -> None:
    mode, manifest = _load(path)
    objects.delete(manifest)
    try:
        objects.create(manifest)  # raises ApiException (422) where the CRD refuses it
        stored = objects.get(manifest)
        # No field is defaulted behind the user's back: a defaulted bindingMode is what broke
        # upstream classes, so what comes back is what was written.
        for field in ("bindingMode", "egpuBindingMode"):
            assert stored.get(field) == manifest.get(field), field
        assert ElasticGPUClass.model_validate(stored).effective_binding_mode == mode
    finally:
        objects.delete(manifest)


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_python_accepts_the_same_objects(path: Path) -> None:
    mode, manifest = _load(path)
    klass = ElasticGPUClass.model_validate(manifest)
    klass.check()
    assert klass.effective_binding_mode == mode
