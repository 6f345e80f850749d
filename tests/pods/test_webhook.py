"""The pod admission webhook, called by the API server over real HTTPS (AdmissionReview v1).

One `elasticgpu webhook` process serves every test of this module; tests/pods/test_webhook_lifecycle.py
starts and stops its own.
"""

from __future__ import annotations

import base64
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from elasticgpu.api import names
from elasticgpu.controller.admission import configuration
from tests.kube_cluster import TestCluster
from tests.pods.conftest import (
    CLAIMS_POLICY,
    WebhookProcess,
    fresh_namespace,
    pod_body,
    remove_configuration,
    start_webhook,
)

CLAIM = names.ANNOTATION_CLAIM_PREFIX
INLINE = names.ANNOTATION_INLINE_REQUEST_PREFIX
DENIED = 'admission webhook "pods.elasticgpu.io" denied the request'


@pytest.fixture(scope="module")
def webhook(
    kube_cluster: TestCluster, api_client: client.ApiClient, pod_update_policies: list[str]
) -> Iterator[WebhookProcess]:
    if kube_cluster.external:
        pytest.skip("the API server must reach a webhook on 127.0.0.1: local test server only")
    with fresh_namespace(api_client, "webhook") as home, tempfile.TemporaryDirectory() as logs:
        process = start_webhook(kube_cluster, api_client, namespace=home, log_dir=Path(logs))
        try:
            yield process
        finally:
            process.stop()
            remove_configuration(api_client, process.configuration_name)


def _create(api_client: client.ApiClient, namespace: str, body: dict[str, Any]) -> client.V1Pod:
    return client.CoreV1Api(api_client).create_namespaced_pod(namespace, body)


def _refusal(api_client: client.ApiClient, namespace: str, body: dict[str, Any]) -> str:
    with pytest.raises(ApiException) as caught:
        _create(api_client, namespace, body)
    assert caught.value.status == 422, caught.value.body
    message = str(json.loads(caught.value.body)["message"])
    assert message.startswith(DENIED), message
    return message


def test_pod_with_claims_gets_the_gate_and_the_label(
    webhook: WebhookProcess, api_client: client.ApiClient, namespace: str
) -> None:
    annotations = {f"{CLAIM}main": "shared-a100", f"{INLINE}side": "gpu-core=30,gpu-memory=10Gi"}
    pod = _create(api_client, namespace, pod_body("uses", annotations=annotations))
    assert [gate.name for gate in pod.spec.scheduling_gates] == [names.SCHEDULING_GATE]
    assert pod.metadata.labels == {names.LABEL_USES_CLAIMS: "true"}
    assert pod.metadata.annotations == annotations  # untouched


def test_gates_and_labels_of_the_pod_are_kept(
    webhook: WebhookProcess, api_client: client.ApiClient, namespace: str
) -> None:
    body = pod_body("keeps", annotations={f"{CLAIM}main": "c"}, schedulingGates=[{"name": "example.com/other"}])
    body["metadata"]["labels"] = {"app": "web", names.LABEL_USES_CLAIMS: "no"}
    pod = _create(api_client, namespace, body)
    assert [gate.name for gate in pod.spec.scheduling_gates] == ["example.com/other", names.SCHEDULING_GATE]
    assert pod.metadata.labels == {"app": "web", names.LABEL_USES_CLAIMS: "true"}


def test_generated_names_are_gated_too(webhook: WebhookProcess, api_client: client.ApiClient, namespace: str) -> None:
    # A ReplicaSet's pods reach admission with generateName only.
    body = pod_body("ignored", annotations={f"{INLINE}main": "gpu-core=10"})
    body["metadata"] = {"generateName": "web-", "annotations": body["metadata"]["annotations"]}
    pod = _create(api_client, namespace, body)
    assert pod.metadata.name.startswith("web-")
    assert [gate.name for gate in pod.spec.scheduling_gates] == [names.SCHEDULING_GATE]


def test_pod_without_claims_is_not_touched(
    webhook: WebhookProcess, api_client: client.ApiClient, namespace: str
) -> None:
    pod = _create(api_client, namespace, pod_body("plain", annotations={"example.com/note": "x"}))
    assert not pod.spec.scheduling_gates
    assert not pod.metadata.labels


@pytest.mark.parametrize(
    ("annotations", "says"),
    [
        pytest.param(
            {f"{CLAIM}mian": "c"},
            f"metadata.annotations[{CLAIM}mian]: the pod has no container 'mian' (its containers: main, side);"
            f" name one of its containers after '{CLAIM}'",
            id="unknown-container",
        ),
        pytest.param(
            {f"{INLINE}main": "cores:30"},
            f"metadata.annotations[{INLINE}main]: 'cores:30' is not KEY=VALUE",
            id="unparsable-inline-request",
        ),
        pytest.param(
            {f"{INLINE}main": "gpu-core=150,gpu-memory=10Gi"},
            f"metadata.annotations[{INLINE}main]: gpu-core: must be 1..100 (a share of one card) or a multiple of"
            " 100 (whole cards) (got 150); ask for 100 or 200",
            id="value-the-crd-refuses",
        ),
        pytest.param(
            {f"{CLAIM}main": "My_Claim"},
            f"metadata.annotations[{CLAIM}main]: must name a claim: a DNS-1123 name",
            id="claim-name-not-dns1123",
        ),
    ],
)
def test_refusals_name_the_annotation_and_the_fix(
    webhook: WebhookProcess, api_client: client.ApiClient, namespace: str, annotations: dict[str, str], says: str
) -> None:
    message = _refusal(api_client, namespace, pod_body("bad", annotations=annotations))
    assert says in message, message


def test_every_problem_is_in_one_refusal(webhook: WebhookProcess, api_client: client.ApiClient, namespace: str) -> None:
    annotations = {f"{CLAIM}mian": "c", f"{INLINE}main": "gpu-memory=0"}
    message = _refusal(api_client, namespace, pod_body("bad", annotations=annotations))
    assert f"[{CLAIM}mian]" in message and f"[{INLINE}main]: gpu-memory: must be more than 0 MiB" in message


def test_pod_on_a_named_node_is_refused(webhook: WebhookProcess, api_client: client.ApiClient, namespace: str) -> None:
    message = _refusal(api_client, namespace, pod_body("pinned", annotations={f"{CLAIM}main": "c"}, nodeName="n1"))
    assert "spec.nodeName: a pod that uses claims is placed on the node of its claims; remove spec.nodeName" in message


def test_claim_annotations_cannot_change_later(
    webhook: WebhookProcess, api_client: client.ApiClient, namespace: str
) -> None:
    # The webhook is no longer called for updates: the API server's own policy
    # (deploy/policies/pod-claims-immutable.yaml) refuses the change; tests/pods/test_claims_policy.py
    # covers every case, this checks it beside a running webhook.
    core = client.CoreV1Api(api_client)
    _create(api_client, namespace, pod_body("p", annotations={f"{CLAIM}main": "c"}))
    key = names.LABEL_USES_CLAIMS.replace("/", "~1")
    for patch in (
        {"metadata": {"annotations": {f"{CLAIM}main": "other"}}},
        {"metadata": {"annotations": {f"{CLAIM}main": None}}},
        {"metadata": {"annotations": {f"{INLINE}side": "gpu-core=5"}}},
        [{"op": "remove", "path": f"/metadata/labels/{key}"}],
    ):
        with pytest.raises(ApiException) as caught:
            core.patch_namespaced_pod("p", namespace, patch)
        assert caught.value.status == 422
        assert CLAIMS_POLICY in caught.value.body and "delete the pod and create it" in caught.value.body
    pod = core.patch_namespaced_pod("p", namespace, {"metadata": {"annotations": {"example.com/note": "x"}}})
    assert pod.metadata.annotations["example.com/note"] == "x"
    assert pod.metadata.labels == {names.LABEL_USES_CLAIMS: "true"}


def test_the_configuration_sends_only_pods_with_claims(webhook: WebhookProcess) -> None:
    stored = webhook.configuration()
    assert stored is not None
    # Only CREATE: updates are the API server's own policy's (deploy/policies/pod-claims-immutable.yaml).
    (create,) = stored["webhooks"]
    assert (create["name"], create["failurePolicy"]) == ("pods.elasticgpu.io", "Fail")
    for hook, operation in ((create, "CREATE"),):
        assert hook["sideEffects"] == "None"
        assert hook["matchConditions"] == [
            {"name": "uses-elasticgpu-claims", "expression": configuration.MATCH_EXPRESSION}
        ]
        assert hook["clientConfig"]["url"] == f"https://127.0.0.1:{webhook.port}/mutate-pods"
        assert base64.b64decode(hook["clientConfig"]["caBundle"]) == webhook.secret()["ca.crt"]
        assert hook["rules"] == [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": [operation],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ]
