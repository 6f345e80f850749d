"""Renders the plain manifests of deploy/ from the Helm chart deploy/chart.

    .venv/bin/python scripts/render-manifests.py          # rewrite deploy/*.yaml and deploy/policies/
    .venv/bin/python scripts/render-manifests.py --check  # exit 1 if they differ from the chart

The chart is the source: edit deploy/chart/templates/, then run this. Helm renders the chart with its
default values plus `namespace.create=true` (each plain file carries the Namespace, so it applies on
its own), release elasticgpu in elasticgpu-system; the renderer is Helm itself, in-process (the
`helm-python-sdk` package of the test extra: Helm's engine as a library, no helm binary).

    templates/X.yaml         -> deploy/X.yaml (none when it renders no object, e.g. a switch that is off)
    templates/policies.yaml  -> deploy/policies/F.yaml, one per "# file: policies/F.yaml" section
                                (the chart reads those files through files/policies, so they come back as
                                they are: drop a new policy file into deploy/policies/ and it is in the chart)
    templates/helm-*.yaml    -> nothing (Helm only: hooks)

Comment lines do not count when comparing (tests/deploy/test_chart.py neither); this script does not
import elasticgpu.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import helm_python

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "chart"
DEPLOY = ROOT / "deploy"
RELEASE = "elasticgpu"
NAMESPACE = "elasticgpu-system"
PLAIN_VALUES = {"namespace": {"create": True}}
"""The chart's defaults plus these: the values of the plain manifests."""
HEADER = "# Rendered from deploy/chart/templates/{name} by scripts/render-manifests.py: edit the template.\n"
FILE_MARKER = re.compile(r"^# file: (policies/[A-Za-z0-9._-]+\.yaml)\n", re.MULTILINE)


def significant(text: str) -> list[str]:
    """The lines that make up the objects: no comment lines, no blank lines."""
    return [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _has_objects(text: str) -> bool:
    return any(line.strip() != "---" for line in significant(text))


def _tidy(text: str) -> str:
    # Templates that start with a condition leave blank lines before the first comment.
    return text.strip("\n") + "\n"


def render(values: dict[str, object] | None = None) -> dict[Path, str]:
    """The plain manifests the chart renders with `values` (default: PLAIN_VALUES): path -> text."""
    chart = helm_python.Chart.load(CHART)
    try:
        rendered = chart.render(PLAIN_VALUES if values is None else values, name=RELEASE, namespace=NAMESPACE)
    finally:
        chart.close()
    files: dict[Path, str] = {}
    for template, text in sorted(rendered.items()):
        name = template.split("/templates/", 1)[1]
        if not name.endswith(".yaml") or name.startswith("helm-"):
            continue
        if name == "policies.yaml":
            # split() with a group: [before, file1, text1, file2, text2, ...]
            parts = FILE_MARKER.split(text)
            for relative, section in zip(parts[1::2], parts[2::2], strict=True):
                files[DEPLOY / relative] = _tidy(section.rstrip().removesuffix("---"))
        elif _has_objects(text):
            files[DEPLOY / name] = HEADER.format(name=name) + _tidy(text)
    return files


def plain_manifests() -> list[Path]:
    """The YAML files of deploy/ that the chart renders (all but the chart's own)."""
    return sorted([*DEPLOY.glob("*.yaml"), *(DEPLOY / "policies").glob("*.yaml")])


def main() -> int:
    """Rewrite deploy/ from the chart, or (--check) say which files differ; exit 1 then."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 if a file differs")
    args = parser.parse_args()
    helm_python.disable_logging()  # its INFO lines about the chart's links into deploy/
    files = render()
    stale = [path for path in plain_manifests() if path not in files]
    differ = [path for path, text in files.items()
              if not path.exists() or significant(path.read_text()) != significant(text)]  # fmt: skip
    for path in stale:
        print(f"{path.relative_to(ROOT)}: no template of the chart renders it", file=sys.stderr)
    if args.check:
        for path in differ:
            print(f"{path.relative_to(ROOT)}: differs from the chart; run scripts/render-manifests.py", file=sys.stderr)
        return 1 if differ or stale else 0
    for path, text in files.items():
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
