"""deploy/policies/fair-share-weight.yaml against the test API server (issue 44): only the platform team
sets, changes or removes a namespace's `elasticgpu.io/fair-share-weight`, and only to a decimal number from
0.01 to 100, whatever RBAC lets the writer do with namespaces."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from elasticgpu.controller.decisions import bind_order
from tests.agent.cri.test_node_gpu_access_policy import as_identity
from tests.kube_cluster import REPO_ROOT, TestCluster, server_side_apply

POLICY_FILE = REPO_ROOT / "deploy" / "policies" / "fair-share-weight.yaml"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
KEY = bind_order.ANNOTATION_FAIR_SHARE_WEIGHT


def _plural(doc: dict[str, object]) -> str:
    return "validatingadmissionpolicies" if doc["kind"] == "ValidatingAdmissionPolicy" else (
        "validatingadmissionpolicybindings")  # fmt: skip


@pytest.fixture
def weight_policy(api_client: client.ApiClient, kube_cluster: TestCluster) -> Iterator[None]:
    """The policy and its binding as deployed, in force (a probe is refused); deleted afterwards."""
    documents = [doc for doc in yaml.safe_load_all(POLICY_FILE.read_text()) if doc]
    for doc in documents:
        server_side_apply(api_client, f"{ADMISSION}/{_plural(doc)}/{doc['metadata']['name']}", doc)
    prober = client.CoreV1Api(as_identity(kube_cluster, "probe", "probers"))
    deadline = time.monotonic() + 30
    try:
        while True:
            name = f"weight-probe-{uuid.uuid4().hex[:6]}"
            try:
                prober.create_namespace({"metadata": {"name": name, "annotations": {KEY: "2"}}})
            except ApiException as e:
                if KEY in str(e.body):
                    break
                raise
            client.CoreV1Api(api_client).delete_namespace(name)
            assert time.monotonic() < deadline, "the fair-share-weight policy did not come into force in 30 s"
            time.sleep(0.3)
        yield
    finally:
        admission = client.AdmissionregistrationV1Api(api_client)
        for doc in reversed(documents):
            with contextlib.suppress(ApiException):
                if doc["kind"] == "ValidatingAdmissionPolicy":
                    admission.delete_validating_admission_policy(doc["metadata"]["name"])
                else:
                    admission.delete_validating_admission_policy_binding(doc["metadata"]["name"])


def _refused(call: object, *says: str) -> None:
    with pytest.raises(ApiException) as refused:
        call()  # type: ignore[operator]
    assert refused.value.status in (403, 422), refused.value.body
    for text in says:
        assert text in str(refused.value.body), refused.value.body


def test_only_the_platform_team_weighs_a_namespace_and_only_within_bounds(
    weight_policy: None, api_client: client.ApiClient, kube_cluster: TestCluster
) -> None:
    admin = client.CoreV1Api(api_client)
    name = f"weighed-{uuid.uuid4().hex[:6]}"
    admin.create_namespace({"metadata": {"name": name}})
    developer = client.CoreV1Api(as_identity(kube_cluster, "alice", "team-a"))
    platform = client.CoreV1Api(as_identity(kube_cluster, "pat", "elasticgpu:platform"))
    try:
        _refused(lambda: developer.patch_namespace(name, {"metadata": {"annotations": {KEY: "3"}}}),
                 "only the platform team")
        for bad in ("1e308", "1000", "0", "0.001", "two", "-1"):
            _refused(lambda bad=bad: platform.patch_namespace(name, {"metadata": {"annotations": {KEY: bad}}}),
                     "a weight is a decimal number from 0.01 to 100")
        platform.patch_namespace(name, {"metadata": {"annotations": {KEY: "2.5"}}})
        assert admin.read_namespace(name).metadata.annotations[KEY] == "2.5"
        # Other changes of the namespace stay anyone's business (as RBAC allows).
        developer.patch_namespace(name, {"metadata": {"labels": {"team": "a"}}})
        _refused(lambda: developer.patch_namespace(name, {"metadata": {"annotations": {KEY: None}}}),
                 "only the platform team")
    finally:
        with contextlib.suppress(ApiException):
            admin.delete_namespace(name)
