"""Shapes the code keeps (STYLE.md, issues 44 and 51): no class of elasticgpu/ past 400 lines, and no
process-wide `os.umask` (it changes the mode of every file any other thread creates meanwhile: files are made
with explicit modes instead)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_CLASS_LINES = 400
LONG_LEFT: dict[str, int] = {}
"""Classes past the limit (by name, wherever they live), at most their length today: they may only shrink, and
leave this list once they fit."""

pytestmark = pytest.mark.timeout(60)


def long_classes(source: str, where: str, limit: int = MAX_CLASS_LINES) -> list[str]:
    """`where:Class (n lines)` for each class of `source` (nested ones too) longer than `limit` lines, from its
    first decorator to its last line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            lines = (node.end_lineno or node.lineno) - first + 1
            if lines > limit:
                found.append(f"{where}:{node.name} ({lines} lines)")
    return found


def umask_calls(source: str) -> int:
    """How many calls of `os.umask` (or a bare `umask` imported from os) `source` makes."""
    return sum(1 for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call) and (
        (isinstance(node.func, ast.Attribute) and node.func.attr == "umask")
        or (isinstance(node.func, ast.Name) and node.func.id == "umask")))  # fmt: skip


def sources() -> list[tuple[str, str]]:
    return [(str(path.relative_to(ROOT)), path.read_text()) for path in sorted((ROOT / "elasticgpu").rglob("*.py"))]


def test_no_class_of_the_product_is_longer_than_400_lines() -> None:
    found = []
    seen = set()
    for where, source in sources():
        for line in long_classes(source, where):
            name, count = line.split(" (", 1)
            name = name.rsplit(":", 1)[1]
            seen.add(name)
            if int(count.split()[0]) > LONG_LEFT.get(name, MAX_CLASS_LINES):
                found.append(line)
    assert not set(LONG_LEFT) - seen, f"no longer past the limit, take them off LONG_LEFT: {set(LONG_LEFT) - seen}"
    assert not found, (f"classes past {MAX_CLASS_LINES} lines (split them by responsibility, as issue 39 split the "
                       f"controller's Picture):\n" + "\n".join(found))


def test_no_process_wide_umask() -> None:
    found = sorted(where for where, source in sources() if umask_calls(source))
    assert not found, ("os.umask changes the mode of files every other thread creates meanwhile; create the file "
                       f"with an explicit mode instead: {found}")


def test_the_checks_see_a_long_class_and_a_umask() -> None:
    """The checks can fail: a 401-line class (decorated, nested in another) and an os.umask call are caught."""
    body = "\n".join(f"    x{i} = {i}" for i in range(399))
    nested = f"class Outer:\n    @staticmethod\n    class Inner:\n{body.replace('    ', '        ')}\n"
    assert long_classes(nested, "f.py") == ["f.py:Outer (402 lines)", "f.py:Inner (401 lines)"]
    assert long_classes(f"class Fits:\n{body}\n", "f.py") == []
    assert umask_calls("import os\nold = os.umask(0o177)\n") == 1
    assert umask_calls("from os import umask\numask(0)\n") == 1
    assert umask_calls("import os\nos.chmod('x', 0o600)\n") == 0
