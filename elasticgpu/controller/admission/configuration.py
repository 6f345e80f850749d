"""The MutatingWebhookConfiguration of the pod webhook, as a plain body. Pure: no I/O.

Only pods that carry our annotations reach the webhook: `matchConditions` (CEL, evaluated by
the API server) test the annotations of the new object (and of the old one, which only an
UPDATE has; updates are no longer registered, see `webhook_configuration`). So a pod without
them never depends on the webhook being up, while for the pods that do `failurePolicy: Fail`
makes sure none of them slips through ungated.
"""

from __future__ import annotations

import base64
from typing import Any

from elasticgpu.api import names
from elasticgpu.controller.admission.settings import WebhookSettings

ADMISSION_REGISTRATION = "admissionregistration.k8s.io/v1"


def _has_our_annotations(var: str) -> str:
    # `has()` first: a pod without annotations has no `metadata.annotations` at all.
    return (
        f"{var} != null && has({var}.metadata.annotations) && {var}.metadata.annotations.exists(k,"
        f" k.startsWith('{names.ANNOTATION_CLAIM_PREFIX}') || k.startsWith('{names.ANNOTATION_INLINE_REQUEST_PREFIX}'))"
    )


MATCH_EXPRESSION = f"({_has_our_annotations('object')}) || ({_has_our_annotations('oldObject')})"
"""CEL: the pod (or, on UPDATE, its previous version) names a claim or asks for one."""


def translation_expression(resource_names: list[str]) -> str:
    """CEL: a container or init container of the pod asks one of `resource_names` (limits or requests)."""
    listed = "[" + ", ".join(f"'{name}'" for name in sorted(resource_names)) + "]"
    asks = (f"has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(k, k in {listed})) ||"
            f" (has(c.resources.requests) && c.resources.requests.exists(k, k in {listed})))")
    return (f"object != null && ((has(object.spec.initContainers) && object.spec.initContainers.exists(c, {asks}))"
            f" || object.spec.containers.exists(c, {asks}))")


def client_config(settings: WebhookSettings, ca_bundle: bytes) -> dict[str, Any]:
    """How the API server reaches the webhook: `url`, else the Service."""
    bundle = base64.b64encode(ca_bundle).decode()
    if settings.url:
        return {"url": settings.url.rstrip("/") + settings.path, "caBundle": bundle}
    service = {
        "namespace": settings.namespace,
        "name": settings.service_name,
        "port": settings.service_port,
        "path": settings.path,
    }
    return {"service": service, "caBundle": bundle}


def _webhook(settings: WebhookSettings, ca_bundle: bytes, *, name: str, operation: str, failure: str,
             condition: tuple[str, str] = ("uses-elasticgpu-claims", MATCH_EXPRESSION),
             namespaces: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": client_config(settings, ca_bundle),
        "rules": [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": [operation],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ],
        "matchConditions": [{"name": condition[0], "expression": condition[1]}],
        "failurePolicy": failure,
        "matchPolicy": "Equivalent",
        "sideEffects": "None",
        "timeoutSeconds": settings.timeout_s,
        # Another webhook may add containers or annotations after us: look again then.
        "reinvocationPolicy": "IfNeeded",
        "namespaceSelector": namespaces or {},
        "objectSelector": {},
    }


def webhook_configuration(settings: WebhookSettings, ca_bundle: bytes) -> dict[str, Any]:
    """The whole MutatingWebhookConfiguration, every defaulted field spelled out so that the
    stored object can be compared with it field by field.

    One webhook, for CREATE, failing closed (`Fail`): a pod that uses claims must never start
    ungated. Updates are not sent here: the claim annotations and the label are kept immutable
    by the ValidatingAdmissionPolicy deploy/policies/pod-claims-immutable.yaml, which the API
    server evaluates itself (never down), so no update of such a pod waits for us (the
    controller's gate lift, a Job controller removing its finalizer, the garbage collector).
    """
    webhooks = [_webhook(settings, ca_bundle, name=settings.webhook_name, operation="CREATE", failure="Fail")]
    if settings.translate:
        # After the claims webhook: a pod asking only `nvidia.com/gpu` does not match that one, so its translation
        # (which answers with the gate and the label too, by the same rules) is its only call; the API server
        # reinvokes only webhooks already called, so the claims webhook looks again only at a pod that also
        # carried claim annotations. Only opted-in namespaces, only pods asking a translated name; failing closed,
        # since an untranslated pod would wait for a device plugin without a word.
        table = settings.translation_table()
        webhooks.append(_webhook(
            settings, ca_bundle, name=f"translate.{settings.webhook_name}", operation="CREATE", failure="Fail",
            condition=("asks-translated-gpu-resources", translation_expression(list(table.resources))),
            namespaces={"matchLabels": {names.LABEL_TRANSLATE_RESOURCES: "true"}}))
    return {
        "apiVersion": ADMISSION_REGISTRATION,
        "kind": "MutatingWebhookConfiguration",
        "metadata": {
            "name": settings.configuration_name,
            "labels": {"app.kubernetes.io/name": "elasticgpu", "app.kubernetes.io/component": "webhook"},
        },
        "webhooks": webhooks,
    }


def is_current(stored: dict[str, Any] | None, desired: dict[str, Any]) -> bool:
    """True when `stored` already says everything `desired` says (fields the server added, such
    as managedFields, do not count)."""
    if stored is None:
        return False
    stored_hooks = stored.get("webhooks") or []
    desired_hooks = desired["webhooks"]
    if len(stored_hooks) != len(desired_hooks):
        return False
    for have, want in zip(stored_hooks, desired_hooks, strict=True):
        if any(have.get(key) != value for key, value in want.items()):
            return False
    labels = (stored.get("metadata") or {}).get("labels") or {}
    return all(labels.get(key) == value for key, value in desired["metadata"]["labels"].items())


def ca_bundle_of(stored: dict[str, Any] | None, webhook_name: str) -> bytes:
    """The caBundle of webhook `webhook_name` in a stored configuration (b"" if none)."""
    for hook in (stored or {}).get("webhooks") or []:
        if hook.get("name") == webhook_name:
            return base64.b64decode((hook.get("clientConfig") or {}).get("caBundle") or "")
    return b""
