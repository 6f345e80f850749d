"""docs/metrics.md lists every metric the controller and the agent register, with type and labels."""

from __future__ import annotations

import re

from tests.docs import collect

PAGE = collect.ROOT / "docs" / "metrics.md"
ROW = re.compile(r"^\| `(?P<name>[a-z_:]+)` \| (?P<type>\w+) \|(?P<labels>[^|]*)\|", re.MULTILINE)


def _documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    rows = {}
    for match in ROW.finditer(PAGE.read_text()):
        labels = tuple(sorted(label.strip() for label in match["labels"].split(",") if label.strip()))
        rows[match["name"]] = (match["type"], labels)
    return rows


def test_every_registered_metric_is_documented_with_its_type_and_labels() -> None:
    registered = collect.metrics()
    names = {m.name for m in registered}
    # The collector must keep finding both processes' metrics.
    assert {"elasticgpu_leader", "elasticgpu_claims_bound_total", "elasticgpu_agent_gpu_healthy"} <= names
    documented = _documented()
    wrong = [
        f"{m.name} ({m.where}): registered as {m.type} with labels {sorted(m.labels)},"
        f" documented as {documented.get(m.name, 'nothing')}"
        for m in registered
        if documented.get(m.name) != (m.type, tuple(sorted(m.labels)))
    ]
    assert not wrong, f"fix the rows of {PAGE.relative_to(collect.ROOT)}: {wrong}"


def test_the_page_lists_no_metric_that_is_gone() -> None:
    stale = sorted(set(_documented()) - {m.name for m in collect.metrics()})
    assert not stale, f"{PAGE.relative_to(collect.ROOT)} lists metrics no code registers: {stale}"
