"""No circles in the import graph of elasticgpu (issue 51): every import, at the top of a module, inside
a function or under TYPE_CHECKING, points one way, so each module can be read, tested and moved
knowing only what is below it.

The graph is grimp's (import-linter's own, installed with it). import-linter's contracts keep the
circles that issue 51 broke broken by name (pyproject.toml); this test finds any circle anywhere,
including one between modules that no contract names.

    .venv/bin/python -m tests.structure.test_import_cycles     # prints every circle, with its lines
"""

from __future__ import annotations

from pathlib import Path

import grimp
import pytest

PACKAGE = "elasticgpu"


def import_graph(package: str = PACKAGE) -> grimp.ImportGraph:
    """grimp's graph of the package (no cache written into the checkout)."""
    return grimp.build_graph(package, include_external_packages=False, cache_dir=None)


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module of the import graph, each sorted,
    largest first (Tarjan's algorithm, iterative: the graph has hundreds of modules)."""
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            recursed = False
            for j in range(i, len(edges[node])):
                nxt = edges[node][j]
                if nxt not in index:
                    work.append((node, j + 1))
                    work.append((nxt, 0))
                    recursed = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if recursed:
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return sorted(found, key=lambda c: (-len(c), c))


def describe(graph: grimp.ImportGraph, component: list[str]) -> str:
    """The imports inside one circle, a line each: `importer:line -> imported   the line`."""
    lines = []
    for importer in component:
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            if imported in component:
                for detail in graph.get_import_details(importer=importer, imported=imported):
                    lines.append(f"  {importer}:{detail['line_number']} -> {imported}   {detail['line_contents']}")
    return "\n".join(lines)


def test_the_import_graph_has_no_circle() -> None:
    graph = import_graph()
    found = circles(graph)
    assert not found, "import circles (break each so the data flows one way):\n" + "\n\n".join(
        describe(graph, c) for c in found
    )


def test_a_circle_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The finder itself: two modules that import each other (one of them only for typing) are one
    circle, and a module that only imports one of them is in none; the lines are named."""
    package = tmp_path / "circled"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from circled import b\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from circled import a\n")
    (package / "c.py").write_text("from circled import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = import_graph("circled")
    assert circles(graph) == [["circled.a", "circled.b"]]
    assert describe(graph, ["circled.a", "circled.b"]).splitlines() == [
        "  circled.a:1 -> circled.b   from circled import b",
        "  circled.b:4 -> circled.a   from circled import a",
    ]


if __name__ == "__main__":
    main_graph = import_graph()
    for component in circles(main_graph):
        print(describe(main_graph, component), end="\n\n")
