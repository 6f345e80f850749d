"""The test server refuses the pod updates kube-apiserver refuses (tests/pods/pod_update_policies.yaml).

Each refused update here is one the test server's own pod validation lets through (it is
coarser than kube-apiserver's); the policies must catch it. Each rule also has the legitimate
update next to it, so a policy that refuses too much fails as well.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.pods.conftest import pod_body

pytestmark = pytest.mark.usefixtures("pod_update_policies")

GATE = {"name": "example.com/wait"}


def _term(*requirements: tuple[str, str]) -> dict[str, Any]:
    return {"matchExpressions": [{"key": key, "operator": "In", "values": [value]} for key, value in requirements]}


def _required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def _refused(core: client.CoreV1Api, namespace: str, patch: Any, policy: str, says: str) -> None:
    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_pod("p", namespace, patch)
    assert caught.value.status == 422
    assert policy in caught.value.body, caught.value.body
    assert says in caught.value.body, caught.value.body


def test_scheduling_gates_can_only_be_removed(api_client: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(namespace, pod_body("p", schedulingGates=[GATE, {"name": "example.com/two"}]))
    _refused(
        core,
        namespace,
        {"spec": {"schedulingGates": [GATE, {"name": "example.com/two"}, {"name": "example.com/new"}]}},
        "elasticgpu-test.pod-scheduling-gates",
        "only deletion is allowed, but found new scheduling gate(s) example.com/new",
    )
    core.patch_namespaced_pod("p", namespace, {"spec": {"schedulingGates": [GATE]}})  # one removed: fine
    core.patch_namespaced_pod("p", namespace, [{"op": "remove", "path": "/spec/schedulingGates"}])
    assert not core.read_namespaced_pod("p", namespace).spec.scheduling_gates
    _refused(
        core,
        namespace,
        {"spec": {"schedulingGates": [GATE]}},
        "elasticgpu-test.pod-scheduling-gates",
        "found new scheduling gate(s) example.com/wait",
    )


def test_node_affinity_may_be_added_and_tightened_while_gated(api_client: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(namespace, pod_body("p", schedulingGates=[GATE], nodeSelector={"pool": "gpu"}))
    # None before: any required affinity may be set; nodeSelector may gain keys.
    core.patch_namespaced_pod(
        "p", namespace, {"spec": {"affinity": _required(_term(("zone", "a"))), "nodeSelector": {"extra": "1"}}}
    )
    # Tightened: the term gains a requirement.
    tightened = _required(_term(("zone", "a"), ("kubernetes.io/hostname", "n1")))
    core.patch_namespaced_pod("p", namespace, [{"op": "replace", "path": "/spec/affinity", "value": tightened}])
    stored = core.read_namespaced_pod("p", namespace)
    assert stored.spec.node_selector == {"pool": "gpu", "extra": "1"}
    terms = stored.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms
    assert [[r.key for r in term.match_expressions] for term in terms] == [["zone", "kubernetes.io/hostname"]]

    policy = "elasticgpu-test.pod-gated-placement"
    changed = _required(_term(("zone", "b"), ("kubernetes.io/hostname", "n1")))
    _refused(core, namespace, [{"op": "replace", "path": "/spec/affinity", "value": changed}], policy, "only additions")
    loosened = _required(_term(("zone", "a")))
    _refused(
        core, namespace, [{"op": "replace", "path": "/spec/affinity", "value": loosened}], policy, "only additions"
    )
    two_terms = _required(_term(("zone", "a"), ("kubernetes.io/hostname", "n1")), _term(("zone", "c")))
    _refused(
        core,
        namespace,
        [{"op": "replace", "path": "/spec/affinity", "value": two_terms}],
        policy,
        "no additions/deletions to non-empty NodeSelectorTerms list",
    )
    _refused(
        core,
        namespace,
        [{"op": "remove", "path": "/spec/affinity"}],
        policy,
        "no additions/deletions to non-empty NodeSelectorTerms list",
    )
    _refused(
        core,
        namespace,
        [{"op": "replace", "path": "/spec/nodeSelector", "value": {"pool": "cpu", "extra": "1"}}],
        policy,
        "only additions to spec.nodeSelector",
    )


def test_gate_lifting_as_the_controller_does_it(api_client: client.ApiClient, namespace: str) -> None:
    """One update under the resourceVersion: the node requirement ANDed into each of the pod's
    own terms, and the gate removed. A real cluster accepts it; so must the policies."""
    core = client.CoreV1Api(api_client)
    own_terms = [_term(("zone", "a")), _term(("zone", "b"))]
    core.create_namespaced_pod(namespace, pod_body("p", schedulingGates=[GATE], affinity=_required(*own_terms)))
    pod = client.ApiClient().sanitize_for_serialization(core.read_namespaced_pod("p", namespace))
    lifted = copy.deepcopy(pod)
    node = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}
    required = lifted["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    for term in required["nodeSelectorTerms"]:
        term["matchExpressions"].append(node)
    del lifted["spec"]["schedulingGates"]
    stored = core.replace_namespaced_pod("p", namespace, lifted)
    assert not stored.spec.scheduling_gates
    # Once ungated, placement is frozen.
    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_pod("p", namespace, {"spec": {"nodeSelector": {"late": "1"}}})
    assert caught.value.status == 422


def test_the_rest_of_the_spec_is_immutable(api_client: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(api_client)
    toleration = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    core.create_namespaced_pod(namespace, pod_body("p", activeDeadlineSeconds=600, tolerations=[toleration]))
    policy = "elasticgpu-test.pod-spec-immutable"
    # spec.nodeName changes only through pods/binding on a real cluster.
    _refused(core, namespace, {"spec": {"nodeName": "n1"}}, policy, "spec.nodeName: pod updates may not change")
    _refused(core, namespace, {"spec": {"activeDeadlineSeconds": 900}}, policy, "never raised or removed")
    _refused(core, namespace, {"spec": {"tolerations": []}}, policy, "only additions to existing tolerations")
    # What a real cluster allows: a lower deadline, one more toleration, a new image.
    other = {"key": "other", "operator": "Exists", "effect": "NoSchedule"}
    core.patch_namespaced_pod(
        "p", namespace, {"spec": {"activeDeadlineSeconds": 300, "tolerations": [toleration, other]}}
    )
    core.patch_namespaced_pod("p", namespace, {"spec": {"containers": [{"name": "main", "image": "busybox:1.37"}]}})
    stored = core.read_namespaced_pod("p", namespace)
    assert stored.spec.active_deadline_seconds == 300
    assert [c.image for c in stored.spec.containers] == ["busybox:1.37", "busybox:1.36"]
    assert len(stored.spec.tolerations) == 2
