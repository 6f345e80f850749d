"""Settings of the pod admission webhook: where it listens, where it keeps its certificate,
how the API server reaches it, and when the certificate is renewed.

Built once (from flags by `elasticgpu webhook`, or by the controller) and passed down.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import urlsplit

from elasticgpu import flags
from elasticgpu.api import translation


@dataclass(frozen=True, kw_only=True)
class WebhookSettings:
    """Everything the webhook needs to know; every default suits an in-cluster Deployment."""

    listen_host: str = "0.0.0.0"
    """Address the HTTPS server binds; `127.0.0.1` when the API server runs on the same host."""
    port: int = 8443
    """Port of the HTTPS server (0: any free port, as tests use). Not 443: no root needed."""
    path: str = "/mutate-pods"
    """Path the API server posts AdmissionReviews to."""
    namespace: str = "elasticgpu-system"
    """Namespace of the Secret holding the certificate (and of the Service, if any)."""
    secret_name: str = "elasticgpu-webhook-tls"
    """Secret with the CA and the serving certificate, shared by every replica of the webhook."""
    configuration_name: str = "elasticgpu-pods"
    """MutatingWebhookConfiguration the webhook creates and keeps current (caBundle included)."""
    webhook_name: str = "pods.elasticgpu.io"
    """Name of the webhook inside that configuration (a qualified name, shown in API errors)."""
    service_name: str = "elasticgpu-webhook"
    """Service the API server calls when `url` is empty (`<name>.<namespace>.svc`)."""
    service_port: int = 443
    """Port of that Service."""
    url: str = ""
    """When set, the API server calls this URL instead of the Service (a webhook outside the
    cluster, or tests where the API server runs on this host): `https://127.0.0.1:8443`. The
    path is appended; the host goes into the certificate."""
    timeout_s: int = 10
    """`timeoutSeconds` of the webhook: the API server gives up (and, failurePolicy Fail,
    refuses the pod) after this long. Our answer is computed from the request alone, in
    microseconds; the bound only matters when the process is stuck."""
    validity_s: float = 365 * 86400.0
    """Lifetime of a generated CA and serving certificate (seconds)."""
    renew_before_s: float = 30 * 86400.0
    """Renew the certificate when it has less than this left (seconds), long before expiry so
    that a webhook that was down for days still renews in time."""
    check_interval_s: float = 60.0
    """Seconds between checks of the Secret and the configuration: picks up a certificate
    another replica renewed, repairs a caBundle someone changed, renews when due."""
    swap_delay_s: float = 2.0
    """Seconds between publishing a new CA in the caBundle and serving the certificate it
    signed: the API server reads webhook configurations through an informer, so it needs a
    moment before it trusts the new CA. The previous CA stays in the bundle until it expires."""
    request_timeout_s: float = 10.0
    """Seconds one call to the API server may take."""
    cert_dir: str = ""
    """When set (`--webhook-cert-path`, controller-runtime's name), serve `tls.crt` and `tls.key`
    from this directory, reloaded when they change, and write nothing to the API: cert-manager
    keeps the files and its CA injector the configuration's caBundle. Empty: generate, store in
    the Secret and publish the caBundle ourselves."""
    field_manager: str = "elasticgpu-webhook"
    """Field manager of the webhook's writes."""
    health_probe_bind_address: flags.BindAddress | None = None
    """Where plain-HTTP /healthz and /readyz are served (`probe_server.py`); None (`0`, the default): nowhere,
    as before (the HTTPS port's /healthz still answers), so existing installs change nothing."""
    metrics_bind_address: flags.BindAddress | None = None
    """Where plain-HTTP /metrics is served; None (`0`, the default): nowhere. The same address as
    `health_probe_bind_address`: one server for all three paths."""

    translate: bool = False
    """`--translate` (chart `translation.enabled`): turn the GPU extended resources of pods in namespaces labelled
    `elasticgpu.io/translate-resources: "true"` into their inline claims (docs/translation.md). Off: no such pod
    reaches the webhook."""
    translate_resources: str = ""
    """`--translate-resources` (chart `translation.resources`): the table, JSON name -> {meaning, cores, memory};
    empty: `api.translation.DEFAULT_TABLE` (NVIDIA's and HAMi's names)."""
    translation_cache_s: float = 10.0
    """Seconds the cluster-wide facts of translation (classes, cards, DeviceClasses) are reused before they are
    read again; a namespace's own labels and quotas are read for every translated pod."""

    translation_namespace_cache_s: float = 2.0
    """Seconds a namespace's opt-in label, class annotation and quotas are reused for its next translated pods
    (0: read for every pod). Short: a ResourceQuota made now refuses translated pods from this long on."""

    def translation_table(self) -> translation.TranslationTable:
        """The parsed table; raises `InvalidTranslationTable` naming the entry and the fix."""
        if not self.translate_resources.strip():
            return translation.default_table()
        try:
            document = json.loads(self.translate_resources)
        except ValueError as error:
            raise translation.InvalidTranslationTable(
                field="--translate-resources", rule=f"is not JSON ({error})", value=self.translate_resources[:80],
                fix='write a JSON map such as {"nvidia.com/gpu": {"meaning": "cards"}}') from error
        return translation.parse_table(document, field="--translate-resources")

    @property
    def client_host(self) -> str:
        """The host name the API server connects to (goes into the certificate's names)."""
        if self.url:
            return urlsplit(self.url).hostname or ""
        return f"{self.service_name}.{self.namespace}.svc"

    def certificate_hosts(self) -> list[str]:
        """DNS names and IP addresses the serving certificate must carry."""
        if self.url:
            return [self.client_host]
        short = f"{self.service_name}.{self.namespace}"
        return [f"{short}.svc", f"{short}.svc.cluster.local", short, self.service_name]
