"""The namespace label that gives a namespace the node's GPUs (19.3), against the test API server:
deploy/policies/node-gpu-access.yaml lets only the platform team set, change or remove it, and the
agent's view reads it (by name, cached) and records a Warning Event about a refused pod."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from elasticgpu.agent import kube as agent_api
from elasticgpu.agent.injecting import claim_view, injection
from tests.kube_cluster import REPO_ROOT, TestCluster, server_side_apply

POLICY_FILE = REPO_ROOT / "deploy" / "policies" / "node-gpu-access.yaml"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
LABEL = injection.NODE_GPU_ACCESS_LABEL


def as_identity(kube_cluster: TestCluster, user: str, group: str) -> client.ApiClient:
    """A client of the cluster admin impersonating `user` of `group` (what RBAC would let through
    is not the point here: the policy must refuse by group, whatever RBAC allows)."""
    api = config.new_client_from_config(config_file=str(kube_cluster.kubeconfig))
    api.set_default_header("Impersonate-User", user)
    api.set_default_header("Impersonate-Group", group)
    return api


@pytest.fixture(scope="module")
def node_gpu_access_policy(api_client: client.ApiClient, kube_cluster: TestCluster) -> Iterator[None]:
    """The policy and binding from deploy/, installed and in force (the API server's informers)."""
    documents = [doc for doc in yaml.safe_load_all(POLICY_FILE.read_text()) if doc]
    for doc in documents:
        plural = ("validatingadmissionpolicies" if doc["kind"] == "ValidatingAdmissionPolicy"
                  else "validatingadmissionpolicybindings")
        server_side_apply(api_client, f"{ADMISSION}/{plural}/{doc['metadata']['name']}", doc)
    core = client.CoreV1Api(as_identity(kube_cluster, "probe", "probers"))
    deadline = time.monotonic() + 30
    while True:  # in force once a probe is refused
        name = f"vap-probe-{uuid.uuid4().hex[:6]}"
        try:
            core.create_namespace({"metadata": {"name": name, "labels": {LABEL: "true"}}})
        except ApiException as e:
            if "node-gpu-access" in str(e.body):
                break
            raise
        client.CoreV1Api(api_client).delete_namespace(name)
        assert time.monotonic() < deadline, "the node-gpu-access policy did not come into force in 30 s"
        time.sleep(0.3)
    yield
    admission = client.AdmissionregistrationV1Api(api_client)
    for doc in reversed(documents):  # other tests' namespaces must not meet the policy
        if doc["kind"] == "ValidatingAdmissionPolicy":
            admission.delete_validating_admission_policy(doc["metadata"]["name"])
        else:
            admission.delete_validating_admission_policy_binding(doc["metadata"]["name"])


def labels_patch(value: str | None) -> dict[str, Any]:
    return {"metadata": {"labels": {LABEL: value}}}


def refusal(call: Any) -> str:
    with pytest.raises(ApiException) as refused:
        call()
    assert refused.value.status == 403, refused.value.body
    return str(refused.value.body)


def test_only_the_platform_team_sets_changes_or_removes_the_label(
    node_gpu_access_policy: None, api_client: client.ApiClient, kube_cluster: TestCluster
) -> None:
    developer = client.CoreV1Api(as_identity(kube_cluster, "alice", "team-a"))
    platform = client.CoreV1Api(as_identity(kube_cluster, "bob", "elasticgpu:platform"))
    admin = client.CoreV1Api(api_client)  # system:masters
    name = f"gpu-tools-{uuid.uuid4().hex[:6]}"

    message = refusal(lambda: developer.create_namespace({"metadata": {"name": name, "labels": {LABEL: "true"}}}))
    assert f"namespace {name}: only the platform team" in message and "elasticgpu:platform" in message
    developer.create_namespace({"metadata": {"name": name, "labels": {"team": "a"}}})
    try:
        refusal(lambda: developer.patch_namespace(name, labels_patch("true")))
        developer.patch_namespace(name, {"metadata": {"labels": {"team": "b"}}})  # other labels: RBAC's business
        platform.patch_namespace(name, labels_patch("true"))
        refusal(lambda: developer.patch_namespace(name, labels_patch(None)))  # removing it is a change too
        refusal(lambda: developer.patch_namespace(name, labels_patch("false")))
        developer.patch_namespace(name, {"metadata": {"labels": {"team": "c"}}})  # the label unchanged: fine
        admin.patch_namespace(name, labels_patch(None))
        assert LABEL not in (admin.read_namespace(name).metadata.labels or {})
    finally:
        admin.delete_namespace(name)


def test_agent_view_reads_the_label_and_records_events(
    node_gpu_access_policy: None, api_client: client.ApiClient, kube_cluster: TestCluster, tmp_path: Path
) -> None:
    admin = client.CoreV1Api(api_client)
    suffix = uuid.uuid4().hex[:6]
    exempt, plain = f"gpu-operator-{suffix}", f"team-{suffix}"
    admin.create_namespace({"metadata": {"name": exempt, "labels": {LABEL: "true"}}})
    admin.create_namespace({"metadata": {"name": plain}})
    agent_kube = agent_api.AgentKube(agent_api.load_api_client(str(kube_cluster.kubeconfig), None),
                                     node_name="node-a", field_manager="test-agent")
    view = claim_view.ClaimView(kube=agent_kube, node_name="node-a", cards=lambda: [])
    try:
        agent_kube.probe()  # the view asks only an API server that answered recently
        assert view.node_gpu_access(exempt) is True
        assert view.node_gpu_access(plain) is False
        assert view.node_gpu_access(f"missing-{suffix}") is False

        pod = injection.PodRef(plain, "tool", str(uuid.uuid4()))
        view.warn(pod, injection.PRIVILEGED_REASON, "privileged without a claim")
        view.warn(pod, injection.PRIVILEGED_REASON, "privileged without a claim")  # kubelet's retry: no second Event
        view.close()
        events = admin.list_namespaced_event(plain).items
        assert [(e.type, e.reason, e.involved_object.name, e.involved_object.uid) for e in events] == [
            ("Warning", injection.PRIVILEGED_REASON, "tool", pod.uid)
        ]
    finally:
        agent_kube.close()
        admin.delete_namespace(exempt)
        admin.delete_namespace(plain)


def test_view_does_not_wait_on_a_silent_api_server() -> None:
    class Silent:
        answered_at = None
        last_failure = "no answer"

        def read_namespace(self, name: str) -> dict[str, Any]:
            raise AssertionError("asked a server that has not answered")

    view = claim_view.ClaimView(kube=Silent(), node_name="n", cards=lambda: [])  # type: ignore[arg-type]
    assert view.node_gpu_access("team") is None
