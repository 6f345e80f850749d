"""No example or doc promises that a slice's limits are enforced where nothing enforces them
(issue 29). The agent writes a slice's limits into the container's environment (MPS and
HAMi-core variables) and its limits folder; they hold only where the node runs MPS or HAMi-core,
or where a class sets `isolation` (docs/isolation.md). So:

- every slice class (gpushare) shipped in examples/ and deploy/ that sets no `isolation` says in its
  comments that its limits are advisory, and says nothing of enforcement otherwise;
- every sentence of README.md, docs/*.md and the chart's values.yaml that ties enforcement to
  MPS, HAMi-core or a slice's limits also says it is advisory or conditional (unless, only
  where, isolation), docs/isolation.md excepted: it describes the enforced modes.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.docs import named

ROOT = named.ROOT
CLAIM = re.compile(
    r"\b(enforc\w*|held to|guarantee\w*|isolat\w*|cannot exceed|limited to)\b[^.;]{0,80}\b(HAMi|MPS|limit)"
    r"|\b(HAMi|MPS|limits?)\b[^.;]{0,80}\b(enforc\w*|isolat\w*)",
    re.IGNORECASE,
)
QUALIFIED = re.compile(r"advisory|unless|only (where|when|if)|isolation|not enforced|nothing enforces|no enforcement",
                       re.IGNORECASE)
ISOLATION_PAGE = ROOT / "docs" / "isolation.md"


def _class_files() -> list[Path]:
    found = []
    for path in sorted([*(ROOT / "examples").rglob("*.yaml"), *(ROOT / "deploy").glob("*.yaml")]):
        # Slices only: a whole card is the container's alone, whatever runs on the node.
        # `isolation: None` (the field's advisory value, issue 29's enforcement change) counts as unset.
        if any(isinstance(d, dict) and d.get("kind") == "ElasticGPUClass" and d.get("isolation") in (None, "", "None")
               and d.get("provisioner") == "elasticgpu.io/gpushare" for d in yaml.safe_load_all(path.read_text())):
            found.append(path)
    return found


def _comments(text: str) -> str:
    return " ".join(line.partition("#")[2] for line in text.splitlines() if "#" in line)


def test_every_shipped_class_without_isolation_says_its_limits_are_advisory() -> None:
    files = _class_files()
    assert ROOT / "examples" / "class-gpushare.yaml" in files and ROOT / "deploy" / "default-class.yaml" in files
    wrong = []
    for path in files:
        comments = _comments(path.read_text())
        if "advisory" not in comments.lower():
            wrong.append(f"{path.relative_to(ROOT)}: no comment says its slices' limits are advisory")
        for sentence in re.split(r"(?<=[.;])\s", comments):
            if CLAIM.search(sentence) and not QUALIFIED.search(sentence):
                wrong.append(f"{path.relative_to(ROOT)}: claims enforcement: {sentence.strip()!r}")
    assert not wrong, wrong


def _sentences(text: str) -> list[str]:
    """Sentences of a page, table cells and list items apart, lines of one paragraph joined."""
    paragraphs = re.split(r"\n\s*\n|\n\s*[-*|] |\|", text)
    return [s for p in paragraphs for s in re.split(r"(?<=[.;])\s", " ".join(p.split()))]


def test_no_page_claims_enforcement_it_does_not_qualify() -> None:
    wrong = []
    for page in named.pages():
        if page == ISOLATION_PAGE:
            continue
        text = _comments(page.read_text()) if page.suffix == ".yaml" else page.read_text()
        for sentence in _sentences(text):
            if CLAIM.search(sentence) and not QUALIFIED.search(sentence):
                wrong.append(f"{page.relative_to(ROOT)}: {sentence[:200]!r}")
    assert not wrong, "say advisory (or where it holds) in: " + "\n".join(wrong)
