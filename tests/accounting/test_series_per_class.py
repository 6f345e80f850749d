"""What the controller's /metrics carries at fleet size (issue 49): per-claim series only for the
classes annotated `elasticgpu.io/per-claim-metrics: "true"`, namespace totals always, and totals
that never go down (a counter that went down would read as a reset and be counted again).

The controller's own picture and collectors, fed bodies as the watch delivers them; no API
server is needed to decide what a scrape exports."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from elasticgpu.api import names, timestamps
from elasticgpu.controller.metrics import ControllerMetrics
from elasticgpu.controller.picture.picture import Picture

T0 = 1_800_000_000
PLAIN, OPTED = "plain", "detailed"
TOTAL = "elasticgpu_namespace_reserved_core_seconds_total"


class Clock:
    def __init__(self) -> None:
        self.now = float(T0)

    def __call__(self) -> float:
        return self.now


def _klass(name: str, *, opted: bool) -> dict[str, Any]:
    return {"apiVersion": names.API_VERSION, "kind": names.KIND_CLASS,
            "metadata": {"name": name, "resourceVersion": "1",
                         "annotations": {names.ANNOTATION_PER_CLAIM_METRICS: "true"} if opted else {}},
            "provisioner": names.PROVISIONER_GPUSHARE, "parameters": {}}


def _egpu(index: int, *, class_name: str, namespace: str = "team", cores: int = 30, since: float = T0,
          phase: str = "Bound", closed: int = 0, version: int = 1) -> dict[str, Any]:
    capacity = {names.RESOURCE_CORE: cores, names.RESOURCE_MEMORY: "1Gi"}
    stamp = timestamps.format_epoch(since)
    return {
        "apiVersion": names.API_VERSION, "kind": names.KIND_ELASTIC_GPU,
        "metadata": {"name": f"egpu-{index}", "uid": f"e{index}", "resourceVersion": str(version),
                     "creationTimestamp": stamp},
        "spec": {"capacity": capacity, "gpuShare": {"gpuName": "gpu-0"}, "elasticGPUClassName": class_name,
                 "claimRef": {"namespace": namespace, "name": f"claim-{index}", "uid": f"c{index}"}},
        "status": {"phase": phase, "capacity": capacity,
                   "accounting": {"coreSeconds": closed, "memoryMibSeconds": 0, "cardSeconds": 0,
                                  "since": stamp if phase == "Bound" else None}},
    }


def _exporting(picture: Picture, clock: Clock) -> tuple[ControllerMetrics, CollectorRegistry]:
    metrics = ControllerMetrics(CollectorRegistry(), process=False)
    picture.on_egpu_gone = metrics.watch_accounting(picture.elastic_gpus_changed, clock=clock,
                                                    per_claim=picture.per_claim_metric_classes)
    metrics.watch_claim_sizes(list, per_claim=picture.per_claim_metric_classes)
    metrics.leading(True)
    return metrics, metrics.registry


def _samples(registry: CollectorRegistry, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for family in registry.collect() for s in family.samples
            if s.name == name}


def test_a_class_without_the_annotation_exports_namespace_totals_and_no_series_per_claim() -> None:
    clock, picture = Clock(), Picture()
    picture.observe("class", "ADDED", _klass(PLAIN, opted=False))
    picture.observe("class", "ADDED", _klass(OPTED, opted=True))
    for index in range(200):
        picture.observe("egpu", "ADDED", _egpu(index, class_name=PLAIN if index % 2 else OPTED))
    _, registry = _exporting(picture, clock)
    clock.now += 10
    per_claim = _samples(registry, "elasticgpu_reserved_core_seconds_total")
    assert {dict(labels)["class"] for labels in per_claim} == {OPTED}, "only the opted-in class has per-claim series"
    assert len(per_claim) == 100 and all(value == 300 for value in per_claim.values())
    totals = _samples(registry, TOTAL)
    # Since the tenure began (at T0): 100 ElasticGPUs x 30 cores x 10 s per class.
    assert totals == {(("class", OPTED), ("namespace", "team")): 30_000.0,
                      (("class", PLAIN), ("namespace", "team")): 30_000.0}


def test_the_series_of_a_scrape_do_not_grow_with_the_claims() -> None:
    counts = []
    for claims in (100, 2_000):
        clock, picture = Clock(), Picture()
        picture.observe("class", "ADDED", _klass(PLAIN, opted=False))
        for index in range(claims):
            picture.observe("egpu", "ADDED", _egpu(index, class_name=PLAIN, namespace=f"ns-{index % 10}"))
        _, registry = _exporting(picture, clock)
        counts.append(sum(len(family.samples) for family in registry.collect()))
    assert counts[0] == counts[1], f"series at 100 and 2,000 claims in 10 namespaces: {counts}"


def test_annotating_a_class_later_adds_its_series_and_the_totals_go_on() -> None:
    clock, picture = Clock(), Picture()
    picture.observe("class", "ADDED", _klass(PLAIN, opted=False))
    picture.observe("egpu", "ADDED", _egpu(1, class_name=PLAIN))
    _, registry = _exporting(picture, clock)
    clock.now += 5
    assert not _samples(registry, "elasticgpu_reserved_core_seconds_total")
    picture.observe("class", "MODIFIED", {**_klass(PLAIN, opted=True), "metadata": {
        **_klass(PLAIN, opted=True)["metadata"], "resourceVersion": "2"}})
    clock.now += 5
    assert list(_samples(registry, "elasticgpu_reserved_core_seconds_total").values()) == [300]
    assert list(_samples(registry, TOTAL).values()) == [300]


# One step of the world: ("bind", i), ("resize", i), ("release", i), ("delete", i), ("vanish", i)
# (deleted with no last body, as after a missed watch event), ("tick", seconds), ("lose"/"lead").
steps = st.lists(st.one_of(
    st.tuples(st.sampled_from(["bind", "resize", "release", "delete", "vanish"]), st.integers(0, 5)),
    st.tuples(st.just("tick"), st.integers(1, 50)),
    st.tuples(st.sampled_from(["lose", "lead"]), st.just(0)),
), max_size=40)


@settings(max_examples=200, deadline=None)
@given(steps=steps)
@example(steps=[("bind", 1), ("tick", 10), ("delete", 1), ("tick", 5)])
@example(steps=[("bind", 1), ("tick", 10), ("resize", 1), ("tick", 5), ("vanish", 1), ("bind", 2), ("tick", 3)])
@example(steps=[("bind", 1), ("tick", 10), ("lose", 0), ("tick", 7), ("lead", 0), ("tick", 4), ("release", 1)])
def test_namespace_totals_never_go_down_within_a_tenure_and_count_what_accrued_in_it(
        steps: list[tuple[str, int]]) -> None:
    clock, picture = Clock(), Picture()
    picture.observe("class", "ADDED", _klass(PLAIN, opted=False))
    metrics, registry = _exporting(picture, clock)
    live: dict[int, dict[str, Any]] = {}
    version = 1
    accrued_in_tenure = 0  # what the world reserved since the tenure began (the expected total)
    last, leading = 0.0, True
    for action, arg in steps:
        version += 1
        body = live.get(arg)
        if action == "tick":
            cores = sum(b["spec"]["capacity"][names.RESOURCE_CORE] for b in live.values()
                        if b["status"]["phase"] == "Bound")
            clock.now += arg
            accrued_in_tenure += cores * arg if leading else 0
        elif action == "bind" and body is None:
            live[arg] = _egpu(arg, class_name=PLAIN, since=clock.now, version=version)
            picture.observe("egpu", "ADDED", live[arg])
        elif action in ("resize", "release") and body is not None and body["status"]["phase"] == "Bound":
            since = timestamps.epoch_seconds(body["status"]["accounting"]["since"]) or T0
            old = body["spec"]["capacity"][names.RESOURCE_CORE]
            closed = body["status"]["accounting"]["coreSeconds"] + old * int(clock.now - since)
            new = _egpu(arg, class_name=PLAIN, cores=old + 10 if action == "resize" else old, since=clock.now,
                        phase="Bound" if action == "resize" else "Released", closed=closed, version=version)
            live[arg] = new
            picture.observe("egpu", "MODIFIED", new)
        elif action in ("delete", "vanish") and body is not None:
            del live[arg]
            if action == "delete":
                picture.observe("egpu", "DELETED", {**body, "metadata": {**body["metadata"],
                                                                           "resourceVersion": str(version)}})
            else:
                picture.on_egpu_gone, hook = None, picture.on_egpu_gone
                picture.observe("egpu", "DELETED", body)
                picture.on_egpu_gone = hook
        elif action == "lose":
            metrics.leading(False)
            assert not _samples(registry, TOTAL), "a standby exports no totals"
            last, accrued_in_tenure, leading = 0.0, 0, False
            continue
        elif action == "lead":
            metrics.leading(True)
            leading = True
        if not leading:
            continue
        total = sum(_samples(registry, TOTAL).values())
        assert total >= last, f"the total went down after {action} {arg}: {last} -> {total}"
        last = total
    if leading and all(a != "vanish" for a, _ in steps):
        # Vanished ones are counted to their last scrape only; without them, the total is exact.
        assert sum(_samples(registry, TOTAL).values()) == accrued_in_tenure
