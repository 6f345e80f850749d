"""The only module of the admission webhook that talks to the Kubernetes API.

It reads and writes two objects: the Secret with the certificates (created, or replaced under
its resourceVersion, so two replicas renewing at once cannot both win) and the
MutatingWebhookConfiguration (server-side apply, forced: the webhook owns it). Requests go
through the kubernetes client's configured urllib3 pool (kubeconfig or in-cluster: TLS,
client certificates, tokens); every failure becomes an `errors` exception.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import urllib3
from kubernetes import client, config

from elasticgpu.controller.admission import certificates, errors
from elasticgpu.controller.admission.settings import WebhookSettings

logger = logging.getLogger(__name__)
_CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


def api_client(*, kubeconfig: str | None = None, context: str | None = None) -> client.ApiClient:
    """A client from `kubeconfig`, else in-cluster credentials, else the default kubeconfig."""
    configuration = client.Configuration()
    if kubeconfig is None and context is None:
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return client.ApiClient(configuration)
        except config.ConfigException:
            pass  # not in a pod: fall back to $KUBECONFIG / ~/.kube/config
    config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=kubeconfig, context=context, client_configuration=configuration
    )
    return client.ApiClient(configuration)


class AdmissionApi:
    """Reads and writes the webhook's Secret and configuration."""

    def __init__(self, api: client.ApiClient, *, settings: WebhookSettings) -> None:
        self._api = api
        self._settings = settings

    def close(self) -> None:
        """Close the connections of the underlying client."""
        self._api.close()  # type: ignore[no-untyped-call]

    def read_secret(self) -> tuple[certificates.Material | None, str | None, str | None]:
        """(material or None if absent/incomplete, resourceVersion or None if absent, type)."""
        status, body = self._request("GET", self._secret_path(self._settings.secret_name))
        if status == 404:
            return None, None, None
        self._check(status, body, "read Secret")
        version = (body.get("metadata") or {}).get("resourceVersion")
        return certificates.Material.from_secret_data(body.get("data")), version, body.get("type")

    def write_secret(self, material: certificates.Material, *, resource_version: str | None, type_: str | None) -> None:
        """Create the Secret (resource_version None) or replace it under `resource_version`.

        Raises `Conflict` when someone else wrote it first."""
        s = self._settings
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": s.secret_name,
                "namespace": s.namespace,
                "labels": {"app.kubernetes.io/name": "elasticgpu", "app.kubernetes.io/component": "webhook"},
            },
            # A Secret's type is immutable: keep whatever an admin created it with.
            "type": type_ or certificates.SECRET_TYPE,
            "data": material.to_secret_data(),
        }
        if resource_version is None:
            status, answer = self._request("POST", self._secret_path(""), body)
        else:
            body["metadata"]["resourceVersion"] = resource_version
            status, answer = self._request("PUT", self._secret_path(s.secret_name), body)
        self._check(status, answer, "write Secret")

    def read_configuration(self) -> dict[str, Any] | None:
        """The stored MutatingWebhookConfiguration, or None."""
        status, body = self._request("GET", f"{_CONFIGURATIONS}/{self._settings.configuration_name}")
        if status == 404:
            return None
        self._check(status, body, "read MutatingWebhookConfiguration")
        return body

    def apply_configuration(self, body: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply of the whole configuration, forced (the webhook owns it)."""
        name = self._settings.configuration_name
        query = f"?fieldManager={self._settings.field_manager}&force=true"
        status, answer = self._request(
            "PATCH", f"{_CONFIGURATIONS}/{name}{query}", body, content_type="application/apply-patch+yaml"
        )
        self._check(status, answer, "apply MutatingWebhookConfiguration")
        return answer

    def delete_configuration(self) -> None:
        """Delete the configuration (uninstall); absent is fine."""
        status, body = self._request("DELETE", f"{_CONFIGURATIONS}/{self._settings.configuration_name}")
        if status != 404:
            self._check(status, body, "delete MutatingWebhookConfiguration")

    # --- reads of translation (`translating`): the namespace, its quotas, classes, cards, DeviceClasses

    def read_namespace(self, name: str) -> dict[str, Any] | None:
        """The Namespace `name`, or None when absent."""
        status, body = self._request("GET", f"/api/v1/namespaces/{name}")
        if status == 404:
            return None
        self._check_read(status, body, f"get Namespace {name}")
        return body

    def list_in_namespace(self, plural_path: str, namespace: str) -> list[dict[str, Any]]:
        """The items of `plural_path` (with `{namespace}` in it) in `namespace`; [] when the kind is not served."""
        return self.list_cluster(plural_path.format(namespace=namespace))

    def list_cluster(self, path: str) -> list[dict[str, Any]]:
        """The items of a list `path`; [] when the kind is not served (404: e.g. no DRA API)."""
        status, body = self._request("GET", path)
        if status == 404:
            return []
        self._check_read(status, body, f"list {path}")
        items = body.get("items")
        return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []

    def _check_read(self, status: int, body: dict[str, Any], what: str) -> None:
        if status < 300:
            return
        message = f"{what}: HTTP {status}: {body.get('message', body)}"
        if status == 403:
            raise errors.Forbidden(
                f"{message}; translation (--translate) reads namespaces, resourcequotas, elasticgpuquotas,"
                " elasticgpuclasses, gpus and deviceclasses: the chart's ClusterRole elasticgpu-webhook-translation"
                " grants it when translation.enabled is true")
        raise errors.ApiUnavailable(message)

    def _secret_path(self, name: str) -> str:
        base = f"/api/v1/namespaces/{self._settings.namespace}/secrets"
        return f"{base}/{name}" if name else base

    def _check(self, status: int, body: dict[str, Any], what: str) -> None:
        if status < 300:
            return
        s = self._settings
        what = what.replace("Secret", f"Secret {s.namespace}/{s.secret_name}")
        what = what.replace("Configuration", f"Configuration {s.configuration_name}")
        message = f"{what}: HTTP {status}: {body.get('message', body)}"
        if status == 409:
            raise errors.Conflict(message)
        if status == 403:
            chart = WebhookSettings()
            raise errors.Forbidden(
                f"{message}; the chart's Roles let the webhook's ServiceAccount read and update only the Secret"
                f" {chart.secret_name} and the MutatingWebhookConfiguration {chart.configuration_name} (resourceNames"
                " in deploy/chart/templates/webhook.yaml; the defaults of --secret-name and --configuration-name):"
                " run the webhook with those names, or add yours to the Roles")
        raise errors.ApiUnavailable(message)

    def _request(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json"
    ) -> tuple[int, dict[str, Any]]:
        cfg = self._api.configuration
        headers = {"Accept": "application/json", **self._api.default_headers}
        if getattr(cfg, "refresh_api_key_hook", None) is not None:
            cfg.refresh_api_key_hook(cfg)  # in-cluster tokens are rotated by the kubelet
        # The kubernetes package keeps the in-cluster token under "BearerToken" (older: "authorization").
        token = cfg.get_api_key_with_prefix("BearerToken", alias="authorization")
        if token:
            headers["Authorization"] = token
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        try:
            response = self._api.rest_client.pool_manager.request(
                method,
                cfg.host.rstrip("/") + path,
                body=data,
                headers=headers,
                timeout=urllib3.Timeout(total=self._settings.request_timeout_s),
                retries=False,
            )
        except urllib3.exceptions.HTTPError as error:
            raise errors.ApiUnavailable(f"{method} {path}: {error}") from error
        try:
            answer = json.loads(response.data) if response.data else {}
        except ValueError:
            answer = {"message": response.data[:200].decode(errors="replace")}
        return int(response.status), answer if isinstance(answer, dict) else {}
