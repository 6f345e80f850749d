"""Class `gpuModel` globs against the names NVML reports ("NVIDIA A100-SXM4-80GB")."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from elasticgpu.allocator.shapes import model_matches

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    ("model", "globs", "expected"),
    [
        ("NVIDIA A100-SXM4-80GB", ("A100*|H100*",), True),  # the glob DESIGN.md and platform teams write
        ("NVIDIA H100 80GB HBM3", ("A100*|H100*",), True),
        ("NVIDIA A100-SXM4-80GB", ("*A100*",), True),
        ("NVIDIA A100-SXM4-80GB", ("nvidia a100*",), True),
        ("NVIDIA A100-SXM4-80GB", ("H100*",), False),
        ("NVIDIA L4", ("A100*|H100*",), False),
        ("Tesla T4", ("T4",), False),  # no vendor prefix to leave out: the whole name must match
        ("Tesla T4", ("Tesla T4",), True),
    ],
)
def test_globs_match_with_or_without_the_vendor_prefix(model: str, globs: tuple[str, ...], expected: bool) -> None:
    assert model_matches(model, globs) is expected


def test_every_example_class_matches_the_example_card() -> None:
    card = yaml.safe_load((EXAMPLES / "demo" / "gpu.yaml").read_text())
    for path in EXAMPLES.glob("class-*.yaml"):
        parameters = yaml.safe_load(path.read_text()).get("parameters", {})
        if "gpuModel" in parameters:
            assert model_matches(card["spec"]["model"], (parameters["gpuModel"],)), path.name
