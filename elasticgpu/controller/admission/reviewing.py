"""Answers to AdmissionReviews of pods. Pure: an AdmissionReview in, an AdmissionReview out.

CREATE of a pod with claim annotations: the annotations are read by `api.pod_claims` (same
rules as a claim written by hand); if they are valid the pod gets the scheduling gate
`elasticgpu.io/claims` (the controller lifts it once its claims are bound and it knows the
node) and the label `elasticgpu.io/uses-claims: "true"` (the controller watches only pods with
it), as one JSONPatch. Otherwise it is refused with every problem, each naming the annotation
and the fix.

UPDATE: claim annotations are immutable once the pod exists (like a pod's volumes: the node
agent reads them at every container start, and the controller placed the pod for them), and so
is the label. The API server enforces both itself through the ValidatingAdmissionPolicy
deploy/policies/pod-claims-immutable.yaml, and the configuration (`configuration`) no longer
sends updates here. An update that still arrives (a configuration written by an earlier
version, until the webhook re-applies its own) is answered as before: a changed annotation is
refused, a removed label put back. No gate is ever added on UPDATE: kube-apiserver allows only
removing gates after creation.

Translation (issue 45, `translating`): when the webhook runs with `--translate`, a CREATE of a pod
whose containers ask a translated resource (`nvidia.com/gpu`, ...) is first handed to the
translator, which returns the JSONPatch that turns those resources into inline requests (and the
pod as patched) or refuses; the pod as patched then goes through the rules above like any other.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from elasticgpu.api import names, pod_claims
from elasticgpu.api.errors import InvalidPodClaims
from elasticgpu.controller.admission import errors

Translate = Callable[[Mapping[str, Any], str], "tuple[list[dict[str, Any]], dict[str, Any]] | None"]
"""(pod, namespace) -> (JSONPatch, the pod as patched), or None: untouched (`translating.Translator.translate`)."""

ADMISSION_REVIEW = "admission.k8s.io/v1"


class MalformedReview(ValueError):
    """The body is not an AdmissionReview v1 with a request (answered with HTTP 400)."""


@dataclass(frozen=True)
class Verdict:
    """What the webhook says about one request."""

    allowed: bool
    patch: list[dict[str, Any]] = field(default_factory=list)
    message: str = ""


def review(document: Mapping[str, Any], *, translate: Translate | None = None) -> dict[str, Any]:
    """Answer one AdmissionReview (the parsed JSON body the API server posted); `translate`: with `--translate`."""
    request = document.get("request") if isinstance(document, Mapping) else None
    if not isinstance(request, Mapping) or document.get("apiVersion") != ADMISSION_REVIEW or "uid" not in request:
        raise MalformedReview(f"expected an {ADMISSION_REVIEW} AdmissionReview with request.uid")
    verdict = decide(request, translate=translate)
    response: dict[str, Any] = {"uid": request["uid"], "allowed": verdict.allowed}
    if not verdict.allowed:
        # 422 like a field the API server itself refuses; kubectl shows the message after
        # `admission webhook "pods.elasticgpu.io" denied the request:`.
        response["status"] = {"code": 422, "reason": "Invalid", "message": verdict.message}
    elif verdict.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(verdict.patch).encode()).decode()
    return {"apiVersion": ADMISSION_REVIEW, "kind": "AdmissionReview", "response": response}


def decide(request: Mapping[str, Any], *, translate: Translate | None = None) -> Verdict:
    """The verdict on one admission request for a pod."""
    pod = request.get("object") or {}
    if request.get("kind", {}).get("kind") not in (None, "Pod") or not isinstance(pod, Mapping):
        return Verdict(allowed=True)  # not ours: the configuration's rules send only pods
    metadata = pod.get("metadata") or {}
    operation = request.get("operation")
    name = metadata.get("name") or metadata.get("generateName") or request.get("name") or ""
    translated: list[dict[str, Any]] = []
    if translate is not None and operation == "CREATE":
        try:
            outcome = translate(pod, str(request.get("namespace") or metadata.get("namespace") or ""))
        except errors.TranslationRefused as refused:
            return Verdict(allowed=False, message=str(refused))
        except errors.WebhookError as error:
            return Verdict(allowed=False, message=f"pod {name}: its GPU resources are translated into claims in this"
                           f" namespace, and the webhook could not read what it needs ({error}); create it again")
        if outcome is not None:
            translated, pod = outcome
            metadata = pod.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    if operation == "UPDATE":
        old_annotations = ((request.get("oldObject") or {}).get("metadata") or {}).get("annotations")
        old, new = pod_claims.claim_annotations(old_annotations), pod_claims.claim_annotations(annotations)
        changed = sorted(key for key in set(old) | set(new) if old.get(key) != new.get(key))
        if changed:
            return Verdict(
                allowed=False,
                message="; ".join(
                    f"pod {name}: {pod_claims.annotation_field(key)}: cannot change once the pod exists;"
                    " delete the pod and create it with the annotations it needs"
                    for key in changed
                ),
            )
    if not pod_claims.has_claim_annotations(annotations):
        return Verdict(allowed=True, patch=translated)
    try:
        pod_claims.read_pod_claims(pod)
    except InvalidPodClaims as error:
        return Verdict(allowed=False, message=str(error))
    patch = translated + _label_patch(metadata)
    if operation == "CREATE":
        if (pod.get("spec") or {}).get("nodeName"):
            return Verdict(
                allowed=False,
                message=f"pod {name}: spec.nodeName: a pod that uses claims is placed on the node of its claims;"
                " remove spec.nodeName (use a nodeSelector or node affinity to restrict the nodes)",
            )
        patch += _gate_patch(pod.get("spec") or {})
    return Verdict(allowed=True, patch=patch)


def _label_patch(metadata: Mapping[str, Any]) -> list[dict[str, Any]]:
    labels = metadata.get("labels")
    if labels is None:
        return [{"op": "add", "path": "/metadata/labels", "value": {names.LABEL_USES_CLAIMS: "true"}}]
    if labels.get(names.LABEL_USES_CLAIMS) == "true":
        return []
    # `add` on an existing member replaces it; `/` in the key is `~1` in a JSON pointer.
    key = names.LABEL_USES_CLAIMS.replace("~", "~0").replace("/", "~1")
    return [{"op": "add", "path": f"/metadata/labels/{key}", "value": "true"}]


def _gate_patch(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    gates = spec.get("schedulingGates")
    gate = {"name": names.SCHEDULING_GATE}
    if gates is None:
        return [{"op": "add", "path": "/spec/schedulingGates", "value": [gate]}]
    if any(existing.get("name") == names.SCHEDULING_GATE for existing in gates):
        return []  # reinvoked, or the user wrote it: one gate is enough
    return [{"op": "add", "path": "/spec/schedulingGates/-", "value": gate}]
