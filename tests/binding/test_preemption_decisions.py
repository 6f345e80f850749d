"""The pure preemption decisions (`decisions.preemption`): a claim's priority from its class (or its
PriorityClass), the plan in status, whether a plan still holds, and which Bound claims may be victims."""

from __future__ import annotations

from typing import Any

import pytest

from elasticgpu.api import ElasticGPU, ElasticGPUClaim, ElasticGPUClass, names
from elasticgpu.controller.decisions import preemption
from elasticgpu.controller.decisions.preemption import ClaimPriority, PriorityClassValue

UID = "0c3b1a6e-1111-4222-8333-944455556666"


def _class(**fields: Any) -> ElasticGPUClass:
    return ElasticGPUClass.model_validate({"metadata": {"name": "c"}, "provisioner": names.PROVISIONER_GPUSHARE,
                                           **fields})


PRIORITY_CLASSES = {"prod": PriorityClassValue(value=1000, preempts=True),
                    "gentle": PriorityClassValue(value=500, preempts=False)}


@pytest.mark.parametrize(("fields", "expected"), [
    ({}, ClaimPriority(0, True)),
    ({"priority": 7}, ClaimPriority(7, True)),
    ({"priority": 7, "preemptionPolicy": "Never"}, ClaimPriority(7, False)),
    ({"priorityClassName": "prod"}, ClaimPriority(1000, True)),
    ({"priorityClassName": "gentle"}, ClaimPriority(500, False)),  # the PriorityClass's policy
    ({"priorityClassName": "gentle", "preemptionPolicy": "PreemptLowerPriority"}, ClaimPriority(500, True)),
    ({"priorityClassName": "prod", "preemptionPolicy": "Never"}, ClaimPriority(1000, False)),  # the class's own
])
def test_priority_of_a_class(fields: dict[str, Any], expected: ClaimPriority) -> None:
    assert preemption.priority_of(_class(**fields), PRIORITY_CLASSES.get) == expected


def test_a_missing_priority_class_gives_zero_and_no_preemption_and_says_so() -> None:
    found = preemption.priority_of(_class(priorityClassName="typo"), PRIORITY_CLASSES.get)
    assert (found.value, found.preempts) == (0, False)
    assert "PriorityClass typo" in found.note and "does not exist" in found.note


def test_the_plan_round_trips_through_status_and_annotations_are_never_a_plan() -> None:
    victims = [preemption.Victim(elastic_gpu="egpu-1", namespace="ns", name="a", uid="u1"),
               preemption.Victim(elastic_gpu="egpu-2", namespace="ns", name="b", uid="u2")]
    status = preemption.plan_status(victims, node="node-1", card="GPU-1", where="node-1 card 0")
    plan = preemption.plan_of(_claim({}, status={"preemption": status}))
    assert plan == preemption.Plan(node="node-1", card="GPU-1", where="node-1 card 0", victims=victims)
    # What a tenant may write (its claim's annotations) is no plan and no mark (issue 33).
    forged = _claim({key: '{"on": "x", "victims": [{"elasticGPU": "egpu-1", "claim": "ns/a", "uid": "u1"}]}'
                     for key in preemption.FORMER_ANNOTATIONS})
    assert preemption.plan_of(forged) is None and preemption.preempted_by(forged) == ""
    assert preemption.plan_of(_claim({})) is None


def test_a_plan_is_stale_once_its_class_may_not_preempt_or_a_victim_is_no_longer_lower() -> None:
    victim = preemption.Victim(elastic_gpu="egpu-1", namespace="ns", name="a", uid="u1")
    assert preemption.stale_reason(ClaimPriority(10, True), "high", [(victim, 5)]) == ""
    assert "may not preempt" in preemption.stale_reason(ClaimPriority(10, False), "high", [(victim, 5)])
    assert "no longer of lower priority" in preemption.stale_reason(ClaimPriority(10, True), "high", [(victim, 10)])


def _claim(annotations: dict[str, str], *, phase: str = "Bound", deleting: bool = False,
           status: dict[str, Any] | None = None) -> ElasticGPUClaim:
    meta: dict[str, Any] = {"name": "a", "namespace": "ns", "uid": UID, "annotations": annotations,
                            "creationTimestamp": "2026-01-01T00:00:10Z"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    return ElasticGPUClaim.model_validate({
        "metadata": meta,
        "spec": {"resources": {"requests": {names.RESOURCE_CORE: 30}},
                 "elasticGPUName": names.elastic_gpu_name_for_claim(UID)},
        "status": {"phase": phase, **(status or {})}})


def _egpu(*, phase: str | None = "Bound", name: str | None = None) -> ElasticGPU:
    body: dict[str, Any] = {
        "metadata": {"name": name or names.elastic_gpu_name_for_claim(UID)},
        "spec": {"capacity": {names.RESOURCE_CORE: 30}, "gpuShare": {"gpuName": "gpu-0"},
                 "claimRef": {"namespace": "ns", "name": "a", "uid": UID}}}
    if phase is not None:
        body["status"] = {"phase": phase}
    return ElasticGPU.model_validate(body)


def test_a_bound_claim_is_a_candidate_even_before_its_elastic_gpu_says_bound() -> None:
    """The ElasticGPU's Bound status comes after its claim's (binder step 3 first): a claim the user sees
    Bound is a victim at once. (Before, it was not, and a preemptor created in that moment waited 30 s for
    the resync: bench/preemption.py found it.)"""
    for phase in ("Bound", None):
        candidate = preemption.candidate_of(_egpu(phase=phase), _claim({}), 3)
        assert candidate is not None and (candidate.key, candidate.priority) == (
            names.elastic_gpu_name_for_claim(UID), 3)
        assert candidate.created == pytest.approx(1767225610.0)


@pytest.mark.parametrize("case", ["claim pending", "being deleted", "already preempted", "failed", "static",
                                  "no claim"])
def test_what_is_never_a_candidate(case: str) -> None:
    claim: ElasticGPUClaim | None = _claim({})
    egpu = _egpu()
    if case == "claim pending":
        claim = _claim({}, phase="Pending")
    elif case == "being deleted":
        claim = _claim({}, deleting=True)
    elif case == "already preempted":
        claim = _claim({}, status={"preemptedBy": "ns/other"})
    elif case == "failed":
        egpu = _egpu(phase="Failed")
    elif case == "static":
        egpu = _egpu(name="admins-slice")  # an admin's ElasticGPU is never failed to make room
    else:
        claim = None
    assert preemption.candidate_of(egpu, claim, 0) is None


def test_a_stale_mark_does_not_protect_a_claim() -> None:
    marked = _claim({}, status={"preemptedBy": "ns/gone"})
    assert preemption.candidate_of(_egpu(), marked, 0) is None  # a mark stands unless told otherwise
    assert preemption.candidate_of(_egpu(), marked, 0, marked=True) is None
    assert preemption.candidate_of(_egpu(), marked, 0, marked=False) is not None
