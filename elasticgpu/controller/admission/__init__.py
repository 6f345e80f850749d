"""The pod admission webhook (DESIGN.md, "Pods"): real HTTPS, AdmissionReview v1.

Pods that name a claim or ask for one inline (and only those: `matchConditions` in CEL) get
the scheduling gate `elasticgpu.io/claims` and the label `elasticgpu.io/uses-claims`, or are
refused with a message naming the annotation and the fix. The certificate is generated at
start, kept in a Secret shared by every replica, renewed before expiry, and its CA kept in the
MutatingWebhookConfiguration's caBundle.

Modules: `reviewing` (pure: AdmissionReview in, AdmissionReview out), `configuration` (pure:
the MutatingWebhookConfiguration), `certificates` (pure: generate and check), `publishing`
(the only API user: Secret and configuration), `serving` (HTTPS server), `keeping` (renew,
publish, serve), `mounting` (serve a certificate mounted by cert-manager, `--webhook-cert-path`,
reloaded when its files change), `probes` (plain-HTTP /healthz, /readyz, /metrics; off by default),
`metrics`, `running` (the component and the blocking entry point), `settings`, `errors`, `translating`
(with `--translate`: `nvidia.com/gpu` and HAMi's names become the pod's inline claims, docs/translation.md).
"""

from __future__ import annotations

from elasticgpu.controller.admission.running import Webhook, run_webhook
from elasticgpu.controller.admission.settings import WebhookSettings

__all__ = ["Webhook", "WebhookSettings", "run_webhook"]
