"""Answers of the webhook to AdmissionReviews (elasticgpu.controller.admission.reviewing): pure."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from elasticgpu.api import names
from elasticgpu.controller.admission import reviewing

CLAIMED = {f"{names.ANNOTATION_CLAIM_PREFIX}main": "c"}


def _review(operation: str, pod: dict[str, Any], old: dict[str, Any] | None = None) -> dict[str, Any]:
    request = {"uid": "u-1", "kind": {"kind": "Pod"}, "operation": operation, "object": pod, "oldObject": old}
    answer = reviewing.review({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["response"]["uid"] == "u-1"
    return dict(answer["response"])


def _patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    assert response["allowed"] and response.get("patchType", "JSONPatch") == "JSONPatch"
    return list(json.loads(base64.b64decode(response["patch"]))) if "patch" in response else []


def _pod(annotations: dict[str, str] | None = None, **metadata: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", **({"annotations": annotations} if annotations else {}), **metadata},
        "spec": {"containers": [{"name": "main"}]},
    }


def test_create_adds_gate_and_label_in_one_patch() -> None:
    assert _patch(_review("CREATE", _pod(CLAIMED))) == [
        {"op": "add", "path": "/metadata/labels", "value": {names.LABEL_USES_CLAIMS: "true"}},
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": names.SCHEDULING_GATE}]},
    ]


def test_reinvocation_adds_nothing_twice() -> None:
    pod = _pod(CLAIMED, labels={names.LABEL_USES_CLAIMS: "true"})
    pod["spec"]["schedulingGates"] = [{"name": names.SCHEDULING_GATE}]
    assert _patch(_review("CREATE", pod)) == []


def test_update_puts_the_label_back_and_never_adds_a_gate() -> None:
    pod = _pod(CLAIMED, labels={"app": "x"})
    assert _patch(_review("UPDATE", pod, old=pod)) == [
        {"op": "add", "path": "/metadata/labels/elasticgpu.io~1uses-claims", "value": "true"}
    ]


def test_refusal_carries_status_422_and_the_message() -> None:
    response = _review("CREATE", _pod({f"{names.ANNOTATION_INLINE_REQUEST_PREFIX}main": "gpu-core=0"}))
    assert response["allowed"] is False
    assert response["status"]["code"] == 422
    assert (
        "metadata.annotations[elasticgpu.io/request.main]: gpu-core: must be at least 1"
        in response["status"]["message"]
    )


def test_pods_without_claims_pass_unchanged() -> None:
    assert _review("CREATE", _pod({"a": "b"})) == {"uid": "u-1", "allowed": True}


@pytest.mark.parametrize(
    "document",
    [
        {},
        [],
        {"apiVersion": "admission.k8s.io/v1beta1", "request": {"uid": "x"}},
        {"apiVersion": "admission.k8s.io/v1"},
    ],
)
def test_anything_but_an_admission_review_v1_is_malformed(document: Any) -> None:
    with pytest.raises(reviewing.MalformedReview):
        reviewing.review(document)
