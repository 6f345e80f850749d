"""An inline request and a claim written by hand follow the same rules: what `pod_claims` accepts,
the CRD accepts as a claim, and the values it refuses the CRD refuses too (against the server)."""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from elasticgpu.api import names, pod_claims
from elasticgpu.api.errors import InvalidPodClaims

INLINE = f"{names.ANNOTATION_INLINE_REQUEST_PREFIX}main"
CLAIMS = names.PLURAL_CLAIM


def _create_claim(api_client: client.ApiClient, namespace: str, name: str, spec: dict[str, object]) -> None:
    body = {"apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM, "metadata": {"name": name}, "spec": spec}
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        names.GROUP, names.VERSION, namespace, CLAIMS, body
    )


@pytest.mark.parametrize(
    "text", ["gpu-core=30,gpu-memory=10Gi", "gpu-memory=1536", "gpu=2", "gpu-core=200,gpu-memory=40Gi,class=fast"]
)
def test_accepted_inline_requests_make_claims_the_crd_accepts(
    api_client: client.ApiClient, crds_installed: object, namespace: str, text: str
) -> None:
    claims = pod_claims.parse_pod_claims({INLINE: text}, containers=["main"], pod="web-1")
    (request,) = claims.inline
    _create_claim(api_client, namespace, request.claim_name("web-1"), request.spec.to_dict())


@pytest.mark.parametrize(
    ("text", "requests"),
    [
        ("gpu-core=150", {names.RESOURCE_CORE: 150}),
        ("gpu-core=0", {names.RESOURCE_CORE: 0}),
        ("gpu-core=+30", {names.RESOURCE_CORE: "+30"}),
        ("gpu-memory=0", {names.RESOURCE_MEMORY: 0}),
        ("gpu-memory=10Gb", {names.RESOURCE_MEMORY: "10Gb"}),
        ("gpu=0", {names.RESOURCE_NVIDIA_GPU: 0}),
        ("gpu=2,gpu-core=100", {names.RESOURCE_NVIDIA_GPU: 2, names.RESOURCE_CORE: 100}),
    ],
)
def test_refused_inline_values_are_refused_by_the_crd_too(
    api_client: client.ApiClient, crds_installed: object, namespace: str, text: str, requests: dict[str, object]
) -> None:
    with pytest.raises(InvalidPodClaims):
        pod_claims.parse_pod_claims({INLINE: text}, containers=["main"])
    with pytest.raises(ApiException) as caught:
        _create_claim(api_client, namespace, "refused", {"resources": {"requests": requests}})
    assert caught.value.status == 422, json.loads(caught.value.body)["message"]
