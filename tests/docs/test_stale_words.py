"""Statements of the READMEs that drift as the code moves on (issue 36, item 10), checked against
what they describe: testcluster/README.md said `scripts/test.sh` does not build the cluster long
after it did, and described a strict xfail that no longer existed; README.md said "four kinds"
once there were five. Each check reads the thing itself (the script, the test files, the kinds the
CRDs are generated from), so the next drift fails here until the words follow.
"""

from __future__ import annotations

import re
from pathlib import Path

from elasticgpu.api import kinds
from tests.docs import named

ROOT = named.ROOT
READMES = [ROOT / "README.md", *sorted(ROOT.glob("*/README.md")), *sorted((ROOT / "docs").glob("*.md"))]
NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}


def _text(page: Path) -> str:
    """The page with its lines joined: a statement may break across lines."""
    return " ".join(page.read_text().split())


def test_every_count_of_the_kinds_is_the_number_of_kinds() -> None:
    wrong = []
    for page in READMES:
        for word in re.findall(r"\bthe (\w+) kinds\b", _text(page), re.I):
            if NUMBERS.get(word.lower(), len(kinds.KINDS)) != len(kinds.KINDS):
                wrong.append(f"{page.relative_to(ROOT)}: 'the {word} kinds' (there are {len(kinds.KINDS)})")
    assert not wrong, wrong


def test_the_readme_s_table_of_kinds_lists_every_kind_with_its_short_name_and_scope() -> None:
    text = (ROOT / "README.md").read_text()
    table = text[text.index("## The kinds"):]
    for info in kinds.KINDS:
        scope = "namespaced" if info.namespaced else "cluster"
        row = re.search(rf"^\| {info.kind} \| `{info.short_names[0]}` \| {scope} \|", table, re.M)
        assert row, f"README.md, The kinds: no row `| {info.kind} | `{info.short_names[0]}` | {scope} |`"


def test_what_the_readmes_say_scripts_test_sh_builds_is_what_it_builds() -> None:
    """"`scripts/test.sh` does not build it" (or "builds it") on the page of a folder with a build.sh,
    against the build scripts test.sh runs."""
    script = (ROOT / "scripts" / "test.sh").read_text()
    built = set(re.findall(r"bash (\w+)/build\.sh", script))
    wrong = []
    for page in READMES:
        text = _text(page)
        for match in re.finditer(r"`scripts/test\.sh`\s+(does \*{0,2}not\*{0,2} )?build", text):
            folder = page.parent.name if page.parent != ROOT else ""
            if folder not in {"testcluster", "testserver", "testruntime"}:
                continue  # a sentence about another folder's build names it; only the builders' own pages say "it"
            says_built = match.group(1) is None
            if says_built != (folder in built):
                wrong.append(f"{page.relative_to(ROOT)}: '{match.group(0)}', but scripts/test.sh"
                             f" {'does not run' if folder not in built else 'runs'} {folder}/build.sh")
    assert not wrong, wrong


def test_every_xfail_the_docs_describe_is_in_its_test_file() -> None:
    """A table row or sentence naming `test_x.py` with an xfail: that file must still have one."""
    wrong = []
    for page in READMES:
        for line in page.read_text().splitlines():
            if "xfail" not in line.lower():
                continue
            for test_file in re.findall(r"`(test_\w+\.py)`", line):
                found = list((ROOT / "tests").rglob(test_file))
                if not found or not any("xfail" in path.read_text() for path in found):
                    wrong.append(f"{page.relative_to(ROOT)}: {test_file} is said to xfail, and has no xfail")
    assert not wrong, wrong
