"""The pure parts of the pod sync, as tables (no server): `pod_gate.decide_gate` from a pod and
its claims, the lift patch, and `pod_placement`'s node filters and resource arithmetic."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elasticgpu.api import ElasticGPUClaim, names
from elasticgpu.controller.decisions import pod_gate
from elasticgpu.controller.pods import pod_placement

GATED = {"metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "7"},
         "spec": {"schedulingGates": [{"name": names.SCHEDULING_GATE}], "containers": [{"name": "main"}]}}


def _claim(name: str, *, phase: str | None = None, node: str | None = None, users: list[dict[str, str]] | None = None,
           deleting: bool = False, reason: str = "") -> ElasticGPUClaim:
    status: dict[str, Any] = {}
    if phase:
        status["phase"] = phase
    if node:
        status["nodeName"] = node
    if users is not None:
        status["users"] = users
    if reason:
        status["conditions"] = [{"type": phase or "Pending", "status": "True", "reason": reason, "message": "m"}]
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return ElasticGPUClaim.model_validate({"metadata": meta, "spec": {"resources": {"requests": {
        names.RESOURCE_CORE: 10}}}, "status": status})


ME = [{"name": "p", "uid": "u1"}]
View = pod_gate.ClaimView


@pytest.mark.parametrize(("views", "expected"), [
    # OBSERVATION: a referenced claim does not exist
    ([View("a", None)], pod_gate.Wait(pod_gate.REASON_CLAIM_NOT_FOUND, "", warning=True)),
    # an inline claim not made yet: quiet
    ([View("a", None, inline=True)], pod_gate.Wait(pod_gate.REASON_CLAIM_PENDING, "", quiet=True)),
    ([View("a", _claim("a", deleting=True))], pod_gate.Wait(pod_gate.REASON_CLAIM_DELETING, "", warning=True)),
    ([View("a", _claim("a", phase="Bound", node="n1"), other_user="q")],
     pod_gate.Wait(pod_gate.REASON_CLAIM_IN_USE, "", warning=True)),
    ([View("a", _claim("a", phase="Lost"))], pod_gate.Wait(pod_gate.REASON_CLAIM_LOST, "", warning=True)),
    # Bound, not yet reserved for this pod: reserve first
    ([View("a", _claim("a", phase="Bound", node="n1"))], pod_gate.ReserveUsers(("a",))),
    # a user of an earlier pod of the same name (other uid) is not this pod
    ([View("a", _claim("a", phase="Bound", node="n1", users=[{"name": "p", "uid": "old"}]))],
     pod_gate.ReserveUsers(("a",))),
    # an unbound inline claim: its bind writes the user, no write of our own
    ([View("a", _claim("a"), inline=True, waits_for_consumer=True)], pod_gate.Place(("a",), None)),
    ([View("a", _claim("a", phase="Bound", node="n1", users=ME))], pod_gate.Lift("n1")),
    ([View("a", _claim("a", phase="Bound", node="n1", users=ME)),
      View("b", _claim("b", phase="Bound", node="n2", users=ME))],
     pod_gate.Wait(pod_gate.REASON_FAILED_PLACEMENT, "", warning=True)),
    # an Immediate claim not bound yet will fix the node: the waiting ones are not placed before it
    ([View("a", _claim("a", users=ME)),
      View("b", _claim("b", users=ME), waits_for_consumer=True)],
     pod_gate.Wait(pod_gate.REASON_CLAIM_PENDING, "", quiet=True)),
    # a Bound claim fixes the node of the ones waiting for their consumer
    ([View("a", _claim("a", phase="Bound", node="n1", users=ME)),
      View("b", _claim("b", users=ME), waits_for_consumer=True)], pod_gate.Place(("b",), "n1")),
    # an Immediate claim still Pending with a reason: say it; without one yet: quiet
    ([View("a", _claim("a", phase="Pending", users=ME, reason="NoCapacity"))],
     pod_gate.Wait(pod_gate.REASON_CLAIM_PENDING, "", quiet=False)),
    ([View("a", _claim("a", users=ME))], pod_gate.Wait(pod_gate.REASON_CLAIM_PENDING, "", quiet=True)),
])
def test_decide_gate(views: list[pod_gate.ClaimView], expected: pod_gate.GateDecision) -> None:
    decision = pod_gate.decide_gate(GATED, views)
    if isinstance(expected, pod_gate.Wait):
        assert isinstance(decision, pod_gate.Wait), decision
        assert (decision.reason, decision.warning, decision.quiet) == (expected.reason, expected.warning,
                                                                       expected.quiet)
        assert decision.message
    else:
        assert decision == expected


def test_not_gated_terminated_or_deleting_pods_need_nothing() -> None:
    views = [View("a", _claim("a", phase="Bound", node="n1", users=ME))]
    lifted = {**GATED, "spec": {"containers": []}}
    done = {**GATED, "status": {"phase": "Succeeded"}}
    deleting = {**GATED, "metadata": {**GATED["metadata"], "deletionTimestamp": "x"}}
    for pod in (lifted, done, deleting):
        assert pod_gate.decide_gate(pod, views) == pod_gate.NotGated()


def test_lift_patch_ands_the_node_into_each_term_and_keeps_other_gates() -> None:
    terms = [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
             {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["bad"]}]}]
    pod = {"metadata": {"resourceVersion": "9"},
           "spec": {"schedulingGates": [{"name": "x"}, {"name": names.SCHEDULING_GATE}],
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": terms}}}}}
    patch = pod_gate.lift_patch(pod, "n1")
    pin = {"key": "metadata.name", "operator": "In", "values": ["n1"]}
    assert patch["metadata"] == {"resourceVersion": "9"}
    assert patch["spec"]["schedulingGates"] == [{"name": "x"}]
    assert patch["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{**terms[0], "matchFields": [pin]},
                              {"matchFields": [*terms[1]["matchFields"], pin]}]}
    assert pod_gate.pinned_node({"spec": {"affinity": patch["spec"]["affinity"]}}) == "n1"
    only = pod_gate.lift_patch({"metadata": {}, "spec": {"schedulingGates": [{"name": names.SCHEDULING_GATE}]}},
                               "n2")
    assert only["spec"]["schedulingGates"] is None  # merge patch: remove the field
    assert pod_gate.pinned_node({"spec": {"affinity": only["spec"]["affinity"]}}) == "n2"


NODE = {"metadata": {"name": "n1", "labels": {"zone": "a", "gpus": "8"}},
        "spec": {"taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"},
                            {"key": "soft", "effect": "PreferNoSchedule"}]},
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi"}}}
TOLERATE = [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]


def _pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"uid": "me"}, "spec": {"tolerations": TOLERATE, **spec}}


def _terms(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


@pytest.mark.parametrize(("pod", "why"), [
    (_pod(), ""),
    ({"metadata": {}, "spec": {}}, "has the taint gpu=yes:NoSchedule, which the pod does not tolerate"),
    ({"metadata": {}, "spec": {"tolerations": [{"operator": "Exists"}]}}, ""),
    ({"metadata": {}, "spec": {"tolerations": [{"key": "gpu", "value": "no", "effect": "NoSchedule"}]}},
     "has the taint gpu=yes:NoSchedule, which the pod does not tolerate"),
    (_pod(nodeSelector={"zone": "b"}), "does not match the pod's nodeSelector zone=b"),
    (_pod(affinity=_terms({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                          {"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["4"]}]})), ""),
    (_pod(affinity=_terms({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]})),
     "does not match the pod's required node affinity"),
    (_pod(affinity=_terms({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]})),
     "does not match the pod's required node affinity"),
    (_pod(affinity=_terms({"matchExpressions": [{"key": "x", "operator": "DoesNotExist"}],
                           "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]})), ""),
    (_pod(affinity=_terms({})), "does not match the pod's required node affinity"),  # an empty term matches nothing
])
def test_node_filter(pod: dict[str, Any], why: str) -> None:
    assert pod_placement.node_filter(pod, "n1", NODE) == why


def test_cordoned_node_unless_tolerated() -> None:
    cordoned = {**NODE, "spec": {"unschedulable": True}}
    assert "cordoned" in pod_placement.node_filter(_pod(), "n1", cordoned)
    tolerant = _pod(tolerations=[{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}])
    assert pod_placement.node_filter(tolerant, "n1", cordoned) == ""


@pytest.mark.parametrize(("value", "expected"), [
    ("500m", "0.5"), ("2", "2"), ("1.5Gi", str(1.5 * 2**30)), ("129e6", "129000000"), ("1k", "1000"),
    ("junk", "0"), ("1Zi", "0"),
])
def test_quantity(value: str, expected: str) -> None:
    assert float(pod_placement.quantity(value)) == float(expected)


def _container(cpu: str, memory: str = "0", **extra: Any) -> dict[str, Any]:
    return {"resources": {"requests": {"cpu": cpu, "memory": memory}}, **extra}


def test_pod_requests_count_init_containers_sidecars_and_overhead() -> None:
    pod = {"spec": {
        "initContainers": [_container("3", "1Gi"), _container("250m", "100Mi", restartPolicy="Always")],
        "containers": [_container("1", "512Mi"), _container("500m")],
        "overhead": {"cpu": "100m", "memory": "10Mi"},
    }}
    # max(containers 1.5 + sidecar 0.25, init 3 + sidecars before it 0) + overhead
    assert pod_placement.pod_requests(pod) == pod_placement.Resources(cpu_milli=3100, memory_mib=1034)


def test_fits_resources_skips_terminated_pods_and_itself() -> None:
    me = {"metadata": {"uid": "me"}, "spec": {"containers": [_container("2")]}}
    busy = {"metadata": {"uid": "b"}, "spec": {"containers": [_container("2500m")]}}
    done = {"metadata": {"uid": "d"}, "spec": {"containers": [_container("4")]}, "status": {"phase": "Failed"}}
    assert pod_placement.fits_resources(me, NODE, [me, done]) == ""
    assert pod_placement.fits_resources(me, NODE, [busy, done]) == "1.5 CPU free, the pod requests 2"
    assert pod_placement.fits_resources(me, {"status": {}}, [busy, busy]) == ""  # allocatable unknown: no check


def _node(**allocatable: str) -> dict[str, Any]:
    return {"metadata": {"name": "n"}, "status": {"allocatable": allocatable}}


def _requesting(uid: str, **requests: str) -> dict[str, Any]:
    return {"metadata": {"uid": uid}, "spec": {"containers": [{"resources": {"requests": requests}}]}}


def test_fits_resources_checks_every_resource_the_node_reports_and_the_pod_count() -> None:
    node = _node(cpu="8", memory="8Gi", pods="2", **{"ephemeral-storage": "10Gi", "example.com/fpga": "2"})
    storage = _requesting("me", **{"ephemeral-storage": "6Gi"})
    assert pod_placement.fits_resources(storage, node, []) == ""
    assert pod_placement.fits_resources(storage, node, [_requesting("o", **{"ephemeral-storage": "5Gi"})]) == (
        f"{5 * 2**30} ephemeral-storage free, the pod requests {6 * 2**30}")
    fpga = _requesting("me", **{"example.com/fpga": "3"})
    assert pod_placement.fits_resources(fpga, node, []) == "2 example.com/fpga free, the pod requests 3"
    asic = _requesting("me", **{"example.com/asic": "1"})
    assert pod_placement.fits_resources(asic, node, []) == "no example.com/asic on the node, the pod requests 1"
    full = [_requesting("a", cpu="1"), _requesting("b", cpu="1")]
    assert pod_placement.fits_resources(_requesting("me", cpu="1"), node, full) == "already runs 2 pods of at most 2"
    assert pod_placement.fits_resources(_requesting("me", cpu="1"), node, full[:1]) == ""


@settings(max_examples=500, deadline=None)
@given(
    capacity=st.fixed_dictionaries({"cpu": st.integers(0, 16), "example.com/fpga": st.integers(0, 4)}),
    max_pods=st.integers(0, 6),
    others=st.lists(st.tuples(st.integers(0, 8), st.integers(0, 3), st.booleans()), max_size=6),
    wanted=st.tuples(st.integers(0, 8), st.integers(0, 3)),
)
def test_a_pod_fits_exactly_when_every_resource_and_the_pod_count_leave_room(
    capacity: dict[str, int], max_pods: int, others: list[tuple[int, int, bool]], wanted: tuple[int, int]
) -> None:
    node = _node(pods=str(max_pods), **{name: str(amount) for name, amount in capacity.items()})

    def pod(uid: str, cpu: int, fpga: int, done: bool = False) -> dict[str, Any]:
        body = _requesting(uid, cpu=str(cpu), **({"example.com/fpga": str(fpga)} if fpga else {}))
        return {**body, "status": {"phase": "Succeeded"}} if done else body

    placed = [pod(f"o{i}", cpu, fpga, done) for i, (cpu, fpga, done) in enumerate(others)]
    running = [(cpu, fpga) for cpu, fpga, done in others if not done]
    # As the scheduler's NodeResourcesFit: only what the pod requests is checked, and the count.
    fits = ((wanted[0] == 0 or sum(c for c, _ in running) + wanted[0] <= capacity["cpu"])
            and (wanted[1] == 0 or sum(f for _, f in running) + wanted[1] <= capacity["example.com/fpga"])
            and len(running) + 1 <= max_pods)  # fmt: skip
    assert (pod_placement.fits_resources(pod("me", *wanted), node, placed) == "") == fits
