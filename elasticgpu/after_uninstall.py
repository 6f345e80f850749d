"""`elasticgpu after-uninstall`: what `helm uninstall` runs once the release's objects are gone (the
chart's post-delete hook Job, deploy/chart/templates/helm-uninstall-cleanup.yaml).

Helm deletes what the release rendered and keeps the CRDs of the chart's crds/ folder, so the
ElasticGPUClaims, ElasticGPUs and GPUs stay: they are the users' data, like PersistentVolumeClaims
after a CSI driver is removed, and a reinstall takes them up again. What the product made at run time
is no object of the release and would be left behind; this removes it:

* the MutatingWebhookConfiguration the webhook publishes (left, it refuses every pod with a claim:
  failurePolicy Fail with nobody to answer), the webhook's certificate Secret and the controller's
  leader Lease;
* the product's finalizers on claims and ElasticGPUs: nobody is left to remove them, so deleting a
  claim, or the CRDs, would hang for ever. A reinstalled controller puts them back.

Every step is idempotent (a second run finds nothing to do), retried with backoff on API errors, and
the run exits non-zero after its deadline, so the Job's own retries take over.
"""

from __future__ import annotations

import argparse
import functools
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from elasticgpu.api import names

logger = logging.getLogger(__name__)

OWN_FINALIZERS = (names.FINALIZER_CLAIM_PROTECTION, names.FINALIZER_EGPU_PROTECTION)
FINALIZED_PLURALS = (names.PLURAL_CLAIM, names.PLURAL_ELASTIC_GPU)
JSON_PATCH = "application/json-patch+json"
DEADLINE_S = 90.0
"""Below the hook Job's activeDeadlineSeconds (120), so that a failed run is the Job's to retry."""


class CleanupIncomplete(RuntimeError):
    """The cleanup did not finish within its deadline; the message names what is left."""


@dataclass(frozen=True)
class Leftovers:
    """The names of what the product makes at run time in the release's namespace."""

    namespace: str
    webhook_configuration: str = "elasticgpu-pods"
    webhook_secret: str = "elasticgpu-webhook-tls"
    leader_lease: str = "elasticgpu-controller"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namespace", required=True, help="the release's namespace (the webhook's Secret, the Lease)")
    parser.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, then $KUBECONFIG, ~/.kube/config)")
    defaults = Leftovers(namespace="")
    parser.add_argument("--webhook-configuration", default=defaults.webhook_configuration,
                        help="the MutatingWebhookConfiguration the webhook published (\"\": none, e.g. cert-manager's)")
    parser.add_argument("--webhook-secret", default=defaults.webhook_secret,
                        help="the webhook's self-signed certificate Secret (\"\": none)")
    parser.add_argument("--leader-lease", default=defaults.leader_lease)
    parser.set_defaults(handler=run)


def run(arguments: argparse.Namespace) -> int:
    from elasticgpu.controller.admission.publishing import api_client

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    leftovers = Leftovers(arguments.namespace, arguments.webhook_configuration, arguments.webhook_secret,
                          arguments.leader_lease)  # fmt: skip
    with api_client(kubeconfig=arguments.kubeconfig) as api:
        clean_up(api, leftovers)
    return 0


def clean_up(api: client.ApiClient, leftovers: Leftovers, *, deadline_s: float = DEADLINE_S) -> None:
    """Delete what the product made at run time and drop its finalizers; raises CleanupIncomplete."""
    deadline = time.monotonic() + deadline_s
    admission = client.AdmissionregistrationV1Api(api)
    core = client.CoreV1Api(api)
    leases = client.CoordinationV1Api(api)
    ns = leftovers.namespace
    if leftovers.webhook_configuration:  # "": the release's own (cert-manager), which helm deletes
        _deleted(f"MutatingWebhookConfiguration {leftovers.webhook_configuration}", deadline,
                 lambda: admission.delete_mutating_webhook_configuration(leftovers.webhook_configuration))
    if leftovers.webhook_secret:
        _deleted(f"Secret {ns}/{leftovers.webhook_secret}", deadline,
                 lambda: core.delete_namespaced_secret(leftovers.webhook_secret, ns))
    _deleted(f"Lease {ns}/{leftovers.leader_lease}", deadline,
             lambda: leases.delete_namespaced_lease(leftovers.leader_lease, ns))  # fmt: skip
    custom = client.CustomObjectsApi(api)
    for plural in FINALIZED_PLURALS:
        listing = functools.partial(custom.list_cluster_custom_object, names.GROUP, names.VERSION, plural)
        items = _retried(f"list {plural}", deadline, listing)
        dropped = sum(_drop_finalizers(custom, plural, item, deadline) for item in items["items"])  # fmt: skip
        logger.info("%s: dropped the product's finalizers of %d (of %d)", plural, dropped, len(items["items"]))


def _drop_finalizers(custom: client.CustomObjectsApi, plural: str, item: dict[str, Any], deadline: float) -> bool:
    """Remove OWN_FINALIZERS from one object, keeping everyone else's; a JSON patch that tests the list
    it read, so that a finalizer another controller adds meanwhile is not lost (re-read and retried)."""
    meta = item["metadata"]
    namespace, name = meta.get("namespace"), meta["name"]
    what = f"{plural} {namespace + '/' if namespace else ''}{name}"
    def get() -> Any:
        if namespace:
            return custom.get_namespaced_custom_object(names.GROUP, names.VERSION, namespace, plural, name)
        return custom.get_cluster_custom_object(names.GROUP, names.VERSION, plural, name)

    def patch(body: list[dict[str, Any]]) -> Any:
        if namespace:
            return custom.patch_namespaced_custom_object(names.GROUP, names.VERSION, namespace, plural, name, body,
                                                         _content_type=JSON_PATCH)  # fmt: skip
        return custom.patch_cluster_custom_object(names.GROUP, names.VERSION, plural, name, body,
                                                  _content_type=JSON_PATCH)  # fmt: skip

    while True:
        finalizers = list(meta.get("finalizers") or [])
        kept = [f for f in finalizers if f not in OWN_FINALIZERS]
        if kept == finalizers:
            return False
        body = [{"op": "test", "path": "/metadata/finalizers", "value": finalizers},
                {"op": "replace", "path": "/metadata/finalizers", "value": kept}]  # fmt: skip
        try:
            _retried(what, deadline, functools.partial(patch, body))
            return True
        except ApiException as e:
            if e.status == 404:
                return False
            if e.status not in (409, 422):  # 422: the test op failed, the list changed meanwhile
                raise
        meta = _retried(what, deadline, get)["metadata"]


def _deleted(what: str, deadline: float, delete: Callable[[], object]) -> None:
    try:
        _retried(what, deadline, delete)
        logger.info("deleted %s", what)
    except ApiException as e:
        if e.status != 404:
            raise
        logger.info("%s: already gone", what)


def _retried(what: str, deadline: float, call: Callable[[], Any]) -> Any:
    """`call()`, retried with capped, jittered backoff on errors that may pass (5xx, 429, no answer);
    4xx other than 429 are the caller's to judge."""
    delay = 0.5
    while True:
        try:
            return call()
        except ApiException as e:
            if e.status is not None and 400 <= e.status < 500 and e.status != 429:
                raise
            error: Exception = e
        except OSError as e:  # connection refused or reset: the API server restarting
            error = e
        except Exception as e:  # urllib3's own errors (timeouts, protocol errors)
            if type(e).__module__.split(".")[0] != "urllib3":
                raise
            error = e
        if time.monotonic() + delay > deadline:
            raise CleanupIncomplete(f"{what}: still failing after the cleanup's deadline: {error}") from error
        logger.info("%s: %s; retrying in %.1f s", what, error, delay)
        time.sleep(delay * random.uniform(0.5, 1.0))
        delay = min(delay * 2, 10.0)
