"""A pod's claim annotations and its `elasticgpu.io/uses-claims` label cannot change after the
pod is created: deploy/policies/pod-claims-immutable.yaml, evaluated by the API server itself, so
it holds with no webhook running (none runs in this file).

Every refused update is also made in a namespace the policy's binding leaves out (the fixture
`pod_update_policies` installs the deploy binding with that one exclusion): there it passes, so
the refusal comes from the policy and from nothing else.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from elasticgpu.api import names
from tests.pods.conftest import CLAIMS_POLICY, UNGUARDED_LABEL, pod_body

pytestmark = pytest.mark.usefixtures("pod_update_policies")

CLAIM = f"{names.ANNOTATION_CLAIM_PREFIX}main"
INLINE = f"{names.ANNOTATION_INLINE_REQUEST_PREFIX}side"
LABEL = names.LABEL_USES_CLAIMS
LABEL_POINTER = LABEL.replace("/", "~1")
ANNOTATION_RULE = "claim annotations cannot be added, changed or removed once the pod exists"
LABEL_RULE = f"metadata.labels[{LABEL}]: cannot be added, changed or removed once the pod exists"


@pytest.fixture
def unguarded_namespace(api_client: client.ApiClient) -> Iterator[str]:
    """A namespace the claims policy does not cover."""
    core = client.CoreV1Api(api_client)
    name = f"unguarded-{uuid.uuid4().hex[:10]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"elasticgpu-test": "1", UNGUARDED_LABEL: "1"}}})
    try:
        yield name
    finally:
        with contextlib.suppress(ApiException):
            core.delete_namespace(name)


def _claimed_pod(core: client.CoreV1Api, namespace: str, name: str) -> None:
    # What the webhook leaves at CREATE: the annotations and the label (set at create: allowed).
    body = pod_body(name, annotations={CLAIM: "c", INLINE: "gpu-core=5"})
    body["metadata"]["labels"] = {LABEL: "true", "app": "x"}
    core.create_namespaced_pod(namespace, body)


UPDATES: list[Any] = [
    pytest.param({"metadata": {"annotations": {CLAIM: "other"}}}, f"metadata.annotations[{CLAIM}]", id="change-claim"),
    pytest.param({"metadata": {"annotations": {CLAIM: None}}}, f"metadata.annotations[{CLAIM}]", id="remove-claim"),
    pytest.param({"metadata": {"annotations": {f"{names.ANNOTATION_CLAIM_PREFIX}side": "d"}}},
                 f"metadata.annotations[{names.ANNOTATION_CLAIM_PREFIX}side]", id="add-claim"),
    pytest.param({"metadata": {"annotations": {INLINE: "gpu-core=50"}}}, f"metadata.annotations[{INLINE}]",
                 id="change-inline-request"),
    pytest.param({"metadata": {"annotations": {INLINE: None}}}, f"metadata.annotations[{INLINE}]",
                 id="remove-inline-request"),
    pytest.param([{"op": "remove", "path": f"/metadata/labels/{LABEL_POINTER}"}], LABEL_RULE, id="remove-label"),
    pytest.param({"metadata": {"labels": {LABEL: "false"}}}, LABEL_RULE, id="change-label"),
]  # fmt: skip


@pytest.mark.parametrize(("patch", "says"), UPDATES)
def test_claim_keys_cannot_change_after_create(
    api_client: client.ApiClient, namespace: str, unguarded_namespace: str, patch: Any, says: str
) -> None:
    core = client.CoreV1Api(api_client)
    _claimed_pod(core, namespace, "p")
    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_pod("p", namespace, patch)
    assert caught.value.status == 422, caught.value.body
    message = str(json.loads(caught.value.body)["message"])
    assert CLAIMS_POLICY in message and says in message, message
    assert "delete the pod and create it" in message, message
    if says != LABEL_RULE:
        assert ANNOTATION_RULE in message, message
    # Nothing else refuses it: where the policy is not bound, the same update goes through.
    _claimed_pod(core, unguarded_namespace, "p")
    core.patch_namespaced_pod("p", unguarded_namespace, patch)


def test_the_label_cannot_be_added_to_a_pod_created_without_it(
    api_client: client.ApiClient, namespace: str, unguarded_namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    for where in (namespace, unguarded_namespace):
        core.create_namespaced_pod(where, pod_body("plain"))
    patch = {"metadata": {"labels": {LABEL: "true"}}}
    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_pod("plain", namespace, patch)
    assert caught.value.status == 422 and LABEL_RULE in caught.value.body, caught.value.body
    assert core.patch_namespaced_pod("plain", unguarded_namespace, patch).metadata.labels == {LABEL: "true"}


def test_claim_annotations_cannot_be_added_to_a_pod_through_its_status(
    api_client: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(namespace, pod_body("plain"))
    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_pod_status("plain", namespace, {"metadata": {"annotations": {CLAIM: "c"}}})
    assert caught.value.status == 422 and f"metadata.annotations[{CLAIM}]" in caught.value.body, caught.value.body


def test_unrelated_updates_of_a_pod_with_claims_pass(api_client: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(api_client)
    _claimed_pod(core, namespace, "p")
    pod = core.patch_namespaced_pod("p", namespace, {"metadata": {"annotations": {"example.com/note": "x"},
                                                                  "labels": {"app": "y"}}})  # fmt: skip
    assert pod.metadata.annotations == {CLAIM: "c", INLINE: "gpu-core=5", "example.com/note": "x"}
    assert pod.metadata.labels == {LABEL: "true", "app": "y"}
    # The same value written again is no change.
    core.patch_namespaced_pod("p", namespace, {"metadata": {"annotations": {CLAIM: "c"}, "labels": {LABEL: "true"}}})
    status = {"status": {"conditions": [{"type": "example.com/Checked", "status": "True"}]}}
    core.patch_namespaced_pod_status("p", namespace, status)
    core.patch_namespaced_pod("p", namespace, {"metadata": {"finalizers": ["example.com/keep"]}})
    core.patch_namespaced_pod("p", namespace, {"metadata": {"finalizers": None}})
