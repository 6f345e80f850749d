"""What the code can write, read from its source: Condition/Event reasons and Prometheus metrics.

Read with `ast`, not by importing, so that a reason or a metric added anywhere (a new module of
another change included) is found without anyone registering it in a list.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WRITERS = (ROOT / "elasticgpu" / "controller", ROOT / "elasticgpu" / "agent")
"""The controller (the webhook is `controller/admission`) and the agent: what writes objects."""

REASON_WORD = re.compile(r"^[A-Z][A-Za-z0-9]*$")


@dataclass(frozen=True)
class Reason:
    """A reason, or for an f-string the fixed text before its first placeholder (`Xid`)."""

    text: str
    prefix: bool
    where: str


def _modules() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text(), str(path))) for root in WRITERS for path in sorted(root.rglob("*.py"))]


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level `NAME = "text"` (and `NAME: Final = "text"`)."""
    found: dict[str, str] = {}
    for node in tree.body:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            for target in targets:
                if isinstance(target, ast.Name):
                    found[target.id] = value.value
    return found


def reasons() -> list[Reason]:
    """Every reason the controller, the webhook and the agent can write.

    Found as: module constants whose name says REASON (`REASON_BOUND`, `PRIVILEGED_REASON`); and
    whatever is given as a reason, as `reason=...` or as the value of a `"reason"` key: a string,
    a constant (of the module, or `module.NAME` of another), both arms of `a if c else b`, and the
    fixed start of an f-string.
    """
    modules = _modules()
    local = {path: _constants(tree) for path, tree in modules}
    everywhere: dict[str, str] = {}
    for constants in local.values():
        everywhere.update(constants)
    out: list[Reason] = []

    def given(expr: ast.expr, path: Path) -> None:
        where = f"{path.relative_to(ROOT)}:{expr.lineno}"
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            out.append(Reason(expr.value, False, where))
        elif isinstance(expr, ast.Name) and expr.id in local[path]:
            out.append(Reason(local[path][expr.id], False, where))
        elif isinstance(expr, ast.Attribute) and expr.attr in everywhere and expr.attr.isupper():
            out.append(Reason(everywhere[expr.attr], False, where))
        elif isinstance(expr, ast.IfExp):
            given(expr.body, path)
            given(expr.orelse, path)
        elif isinstance(expr, ast.JoinedStr) and expr.values and isinstance(expr.values[0], ast.Constant):
            out.append(Reason(str(expr.values[0].value), True, where))

    positions = _reason_positions([tree for _, tree in modules])
    for path, tree in modules:
        for name, text in local[path].items():
            if "REASON" in name and not name.startswith("MAX_"):
                out.append(Reason(text, False, f"{path.relative_to(ROOT)} {name}"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                for keyword in node.keywords:
                    if keyword.arg == "reason":
                        given(keyword.value, path)
                callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                for index in positions.get(callee, ()):
                    if index < len(node.args):
                        given(node.args[index], path)
            elif isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if isinstance(key, ast.Constant) and key.value == "reason":
                        given(value, path)
    # A condition's status is no reason, whatever position a helper takes it at.
    return [r for r in out if REASON_WORD.match(r.text) and r.text not in ("True", "False", "Unknown")]


def _reason_positions(trees: list[ast.Module]) -> dict[str, set[int]]:
    """Callee name -> the positions at which it takes a `reason`: functions and methods with a
    parameter `reason` (`self` not counted), and classes whose fields (dataclasses, in order) hold one,
    so that `Wait("QuotaExceeded", message)` and `_condition(HEALTHY, "False", VANISHED, ...)` count."""
    positions: dict[str, set[int]] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                params = [a.arg for a in node.args.posonlyargs + node.args.args]
                if params[:1] in (["self"], ["cls"]):
                    params = params[1:]
                if "reason" in params:
                    positions.setdefault(node.name, set()).add(params.index("reason"))
            elif isinstance(node, ast.ClassDef):
                fields = [
                    f.target.id for f in node.body
                    if isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name)
                    and "ClassVar" not in ast.unparse(f.annotation)
                ]
                if "reason" in fields:
                    positions.setdefault(node.name, set()).add(fields.index("reason"))
    return positions


@dataclass(frozen=True)
class Metric:
    """A metric as scraped: its name (counters with `_total`), type and label names."""

    name: str
    type: str
    labels: tuple[str, ...]
    where: str


_KINDS = {
    "Counter": "counter", "Gauge": "gauge", "Histogram": "histogram", "Summary": "summary", "Info": "info",
    "CounterMetricFamily": "counter", "GaugeMetricFamily": "gauge", "HistogramMetricFamily": "histogram",
    "SummaryMetricFamily": "summary", "InfoMetricFamily": "info",
}


def _text(expr: ast.expr, constants: dict[str, str]) -> str | None:
    """A string built of literals, module constants and `+`."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value
    if isinstance(expr, ast.Name):
        return constants.get(expr.id)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        left, right = _text(expr.left, constants), _text(expr.right, constants)
        return None if left is None or right is None else left + right
    return None


def metrics() -> list[Metric]:
    """Every metric the code registers with prometheus-client (`Counter(...)`, `GaugeMetricFamily(...)`)."""
    out: list[Metric] = []
    for path, tree in _modules():
        constants = _constants(tree)
        # Only prometheus-client's classes (collections.Counter is no metric).
        imported = {
            alias.asname or alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("prometheus_client")
            for alias in node.names
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Name) and node.func.id in imported:
                called = node.func.id
            elif isinstance(node.func, ast.Attribute) and "prometheus" in ast.unparse(node.func.value):
                called = node.func.attr
            else:
                continue
            if called not in _KINDS or not node.args:
                continue
            name = _text(node.args[0], constants)
            if name is None:
                raise AssertionError(f"{path}:{node.lineno}: a metric whose name this test cannot read")
            labels_expr = next((k.value for k in node.keywords if k.arg in ("labels", "labelnames")), None)
            if labels_expr is None and len(node.args) > 2:
                labels_expr = node.args[2]
            labels: tuple[str, ...] = ()
            if labels_expr is not None:
                if isinstance(labels_expr, ast.Name):  # a list named in the same function
                    labels_expr = _assigned(tree, labels_expr.id) or labels_expr
                if not isinstance(labels_expr, ast.List | ast.Tuple):
                    raise AssertionError(f"{path}:{node.lineno}: labels of {name} that this test cannot read")
                labels = tuple(str(_text(e, constants)) for e in labels_expr.elts)
            kind = _KINDS[called]
            # prometheus-client scrapes a counter as <name>_total (and strips a _total given).
            scraped = name.removesuffix("_total") + "_total" if kind == "counter" else name
            out.append(Metric(scraped, kind, labels, f"{path.relative_to(ROOT)}:{node.lineno}"))
    return out


def _assigned(tree: ast.Module, name: str) -> ast.expr | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node.value
    return None
