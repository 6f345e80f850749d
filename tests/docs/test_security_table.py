"""docs/security.md's table can be checked against the code (issue 33 item 2): every `elasticgpu.io/`
key the code defines as a constant (annotations, labels, finalizers, the gate, the condition, resource
names, provisioners, CDI kinds) is named in it, every row names a test, every test it names exists,
and every test of the modules written for the table is cited in it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "security.md"
TABLE_MODULES = ("tests/realcluster/test_tenant_roles.py", "tests/security/test_container_fields.py")
"""The tests written for the table: each must be cited in it."""
KEY = re.compile(r"^(egpuc\.)?elasticgpu\.io/")
TEST_ID = re.compile(r"(tests/[\w/]+\.py)::(test_\w+)")

pytestmark = pytest.mark.timeout(60)


def code_keys() -> dict[str, list[str]]:
    """Each `elasticgpu.io/...` string a module of elasticgpu/ binds to a module-level name -> where."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "elasticgpu").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            if isinstance(value, ast.Constant) and isinstance(value.value, str) and KEY.match(value.value):
                for target in targets:
                    if isinstance(target, ast.Name):
                        found.setdefault(value.value, []).append(f"{path.relative_to(ROOT)}:{target.id}")
    return found


def table_rows(text: str) -> list[list[str]]:
    """The cells of each row of the table under "## The table" (header and rule lines left out)."""
    body = text.split("## The table", 1)[1]
    rows = []
    for line in body.splitlines():
        if not line.startswith("|") or set(line) <= {"|", "-", " "}:
            continue
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows[1:]  # the header


def missing_keys(text: str, keys: dict[str, list[str]]) -> list[str]:
    """Keys no code span of `text` names exactly (`elasticgpu.io/gpu` is not named by `elasticgpu.io/gpu-core`)."""
    spans = re.findall(r"`([^`]+)`", text)
    missing = []
    for key, where in sorted(keys.items()):
        exact = re.compile(r"(?<![\w.-])" + re.escape(key) + r"(?![\w-])")
        if not any(exact.search(span) for span in spans):
            missing.append(f"{key} ({', '.join(where)})")
    return missing


def unknown_tests(text: str) -> list[str]:
    """Test ids of `text` whose file has no module-level function of that name."""
    unknown = []
    for path, name in sorted(set(TEST_ID.findall(text))):
        source = ROOT / path
        defined = {n.name for n in ast.parse(source.read_text()).body
                   if isinstance(n, ast.FunctionDef)} if source.is_file() else set()  # fmt: skip
        if name not in defined:
            unknown.append(f"{path}::{name}")
    return unknown


def test_every_key_the_code_defines_is_in_the_table() -> None:
    keys = code_keys()
    # The scan must keep seeing the kinds of keys it is for (a broken scan would pass vacuously).
    assert {"elasticgpu.io/group", "egpuc.elasticgpu.io/", "elasticgpu.io/node-gpu-access",
            "elasticgpu.io/selected-node", "elasticgpu.io/claim"} <= set(keys), sorted(keys)  # fmt: skip
    missing = missing_keys(DOC.read_text(), keys)
    assert not missing, "keys the code reads or writes that docs/security.md does not name:\n" + "\n".join(missing)


def test_every_row_names_a_test_and_every_test_named_exists() -> None:
    text = DOC.read_text()
    rows = table_rows(text)
    assert len(rows) >= 25, rows
    untested = [row[0] for row in rows if not TEST_ID.search(row[-1])]
    assert not untested, f"rows of docs/security.md whose last cell names no test: {untested}"
    unknown = unknown_tests(text)
    assert not unknown, f"tests docs/security.md names that do not exist: {unknown}"


def test_every_test_written_for_the_table_is_cited() -> None:
    cited = {f"{path}::{name}" for path, name in TEST_ID.findall(DOC.read_text())}
    uncited = []
    for module in TABLE_MODULES:
        for node in ast.parse((ROOT / module).read_text()).body:
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
                continue
            if f"{module}::{node.name}" not in cited:
                uncited.append(f"{module}::{node.name}")
    assert not uncited, f"tests of the table's modules that docs/security.md does not cite: {uncited}"


def test_the_checks_see_a_key_left_out_and_a_test_that_is_not_there() -> None:
    """The checks can fail: a key named only as the prefix of a longer one, or a renamed test, is caught."""
    keys = {"elasticgpu.io/gpu": ["here"], "elasticgpu.io/gpu-core": ["there"]}
    assert missing_keys("`elasticgpu.io/gpu-core`", keys) == ["elasticgpu.io/gpu (here)"]
    assert missing_keys("`elasticgpu.io/gpu=<uuid>`, `elasticgpu.io/gpu-core`", keys) == []
    renamed = "`tests/docs/test_security_table.py::test_no_such_test`"
    assert unknown_tests(renamed) == ["tests/docs/test_security_table.py::test_no_such_test"]
    assert unknown_tests("`tests/docs/test_security_table.py::test_every_key_the_code_defines_is_in_the_table`") == []
