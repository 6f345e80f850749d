"""Translation's refusals that need Kubernetes' own API server (issue 45): ResourceQuota (kube-apiserver's quota
admission runs after mutating webhooks, so a translated pod would no longer count against it) and DRA's
DeviceClass with `extendedResourceName` (KEP-5004). The local test server serves neither kind.

`elasticgpu webhook --translate` runs as a process that kube-apiserver calls over HTTPS on 127.0.0.1.
"""

from __future__ import annotations

import json
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from elasticgpu.api import names, translation
from tests.kube_cluster import TestCluster, kube_request
from tests.pods.conftest import WebhookProcess, remove_configuration, start_webhook, wait_until

pytestmark = pytest.mark.realcluster

MAPPED = "example.com/dra-mapped"
DENIED = 'admission webhook "translate.pods.elasticgpu.io" denied the request'


@pytest.fixture(scope="module")
def translating(kube_cluster: TestCluster, api_client: client.ApiClient, crds_installed: list[str]
                ) -> Iterator[WebhookProcess]:
    table = json.dumps({**translation.DEFAULT_TABLE, MAPPED: {"meaning": "cards"}})
    core = client.CoreV1Api(api_client)
    home = f"translate-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": home}})
    with tempfile.TemporaryDirectory() as logs:
        process = start_webhook(kube_cluster, api_client, namespace=home, log_dir=Path(logs), extra_args=(
            "--translate", "--translate-resources", table, "--translation-cache-s", "0",
            "--translation-namespace-cache-s", "0"))
        try:
            yield process
        finally:
            process.stop()
            remove_configuration(api_client, process.configuration_name)
            core.delete_namespace(home)


@pytest.fixture
def opted_in(api_client: client.ApiClient, namespace: str) -> Iterator[str]:
    """The test's namespace, opted in, with a default-less class of its own named by annotation."""
    custom = client.CustomObjectsApi(api_client)
    class_name = f"tr-{uuid.uuid4().hex[:8]}"
    custom.create_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL_CLASS, {
        "apiVersion": names.API_VERSION, "kind": names.KIND_CLASS, "metadata": {"name": class_name},
        "provisioner": names.PROVISIONER_PHYSICAL})
    client.CoreV1Api(api_client).patch_namespace(namespace, {"metadata": {
        "labels": {names.LABEL_TRANSLATE_RESOURCES: "true"},
        "annotations": {names.ANNOTATION_TRANSLATE_CLASS: class_name}}})
    try:
        yield namespace
    finally:
        custom.delete_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL_CLASS, class_name)


def _pod(resource: str = names.RESOURCE_NVIDIA_GPU) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "app-"},
            "spec": {"containers": [{"name": "main", "image": "busybox:1.36",
                                     "resources": {"limits": {resource: "1"}}}]}}


def _answer(api_client: client.ApiClient, namespace: str, body: dict[str, Any]) -> str:
    """'translated', or the refusal's message (a dry run: nothing is stored)."""
    try:
        created = client.CoreV1Api(api_client).create_namespaced_pod(namespace, body, dry_run="All")
    except ApiException as error:
        return str(json.loads(error.body)["message"])
    return "translated" if (created.metadata.annotations or {}).get(names.ANNOTATION_TRANSLATED) else "untouched"


def test_a_resource_quota_on_a_translated_name_needs_an_elastic_gpu_quota(
    translating: WebhookProcess, api_client: client.ApiClient, opted_in: str
) -> None:
    wait_until(lambda: _answer(api_client, opted_in, _pod()) == "translated", "the namespace's label to count",
               timeout=60)
    client.CoreV1Api(api_client).create_namespaced_resource_quota(opted_in, {
        "metadata": {"name": "gpus"}, "spec": {"hard": {"requests.nvidia.com/gpu": "1"}}})
    message = _answer(api_client, opted_in, _pod())
    assert message.startswith(DENIED), message
    assert f"ResourceQuota {opted_in}/gpus limits requests.nvidia.com/gpu" in message
    assert "create an ElasticGPUQuota" in message

    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        names.GROUP, names.VERSION, opted_in, names.PLURAL_QUOTA,
        {"apiVersion": names.API_VERSION, "kind": names.KIND_QUOTA, "metadata": {"name": "q"},
         "spec": {"hard": {names.RESOURCE_NVIDIA_GPU: 1}}})
    assert _answer(api_client, opted_in, _pod()) == "translated"  # the ElasticGPUQuota charges it instead


def test_a_name_a_dra_device_class_maps_is_refused(
    translating: WebhookProcess, api_client: client.ApiClient, opted_in: str
) -> None:
    name = f"mapped-{uuid.uuid4().hex[:6]}"
    path = "/apis/resource.k8s.io/v1/deviceclasses"
    response = kube_request(api_client, "POST", path, body={
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
        "spec": {"extendedResourceName": MAPPED}})
    if response.status == 404:
        pytest.skip("this control plane serves no resource.k8s.io/v1")
    assert response.status == 201, response.data
    try:
        if not (response.json().get("spec") or {}).get("extendedResourceName"):
            pytest.skip("DRAExtendedResource is off on this control plane: extendedResourceName was dropped")
        message = wait_until(lambda: (m := _answer(api_client, opted_in, _pod(MAPPED))).startswith(DENIED) and m,
                             "the refusal", timeout=60)
        assert f"{MAPPED}: DeviceClass {name} maps it (extendedResourceName, KEP-5004)" in message, message
        assert _answer(api_client, opted_in, _pod()) == "translated"  # a name no DeviceClass maps
    finally:
        kube_request(api_client, "DELETE", f"{path}/{name}")
