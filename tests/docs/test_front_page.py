"""README.md is the front door (issue 29): short, the two commands first, install right after
the demo, the detail in docs/ (every guide it links exists)."""

from __future__ import annotations

import re

from elasticgpu.api import names
from tests.docs import named

README = named.ROOT / "README.md"


def test_the_readme_is_short_with_install_right_after_the_demo() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move detail to docs/"
    top = "\n".join(lines[:15])
    assert "bash scripts/run.sh" in top and "bash scripts/test.sh" in top
    headings = [line for line in lines if line.startswith("## ")]
    demo = next(i for i, h in enumerate(headings) if "see it work" in h.lower())
    assert headings[demo + 1] == "## Install on a cluster", headings
    assert lines.index("## Install on a cluster") < 80


def test_every_page_the_readme_and_the_guides_link_exists() -> None:
    missing = []
    for page in named.pages():
        if page.suffix != ".md":
            continue
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            # docs/isolation.md comes with the isolation change (issue 29 names it in advance).
            if not (page.parent / target).exists() and target.split("/")[-1] != "isolation.md":
                missing.append(f"{page.relative_to(named.ROOT)} -> {target}")
    assert not missing, missing


GPU_PAGES = {"docs/isolation.md": "has not yet run on a lent GPU", "docs/mig.md": "has never run on a card"}
"""Each page that says, in these words, that its GPU side has not run on a card (issue 36, item 3)."""


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


def test_the_status_names_the_api_version_and_agrees_with_the_pages_on_what_ran_on_a_card() -> None:
    """The README's Status says what has run where; a page that stops saying its GPU side never ran
    (because it then ran) must take it out of the README's "not yet" too, and the other way round."""
    status = _section(README.read_text(), "## Status")
    assert f"`{names.API_VERSION}`" in status, "the Status must name the API version the CRDs serve"
    not_yet = status.split("**Not yet run:**", 1)[1]
    for page, words in GPU_PAGES.items():
        page_says = words in (named.ROOT / page).read_text()
        readme_says = f"({page})" in not_yet
        assert page_says == readme_says, (
            f"{page} {'says' if page_says else 'no longer says'} {words!r}, and README.md's Status"
            f" {'does not list' if page_says else 'still lists'} it under Not yet run: make them agree")
