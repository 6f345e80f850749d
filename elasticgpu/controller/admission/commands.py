"""`elasticgpu webhook`: flags -> `WebhookSettings` -> `run_webhook` (blocking)."""

from __future__ import annotations

import argparse

from elasticgpu import flags
from elasticgpu.api.translation import InvalidTranslationTable
from elasticgpu.controller.admission.running import run_webhook
from elasticgpu.controller.admission.settings import WebhookSettings
from elasticgpu.logs import configure_logging
from elasticgpu.user_errors import port_number

# Flags that set a `WebhookSettings` field of the same name (dashes for underscores).
_FIELDS = (
    "namespace",
    "secret_name",
    "configuration_name",
    "service_name",
    "service_port",
    "url",
    "listen_host",
    "port",
    "validity_s",
    "renew_before_s",
    "check_interval_s",
    "swap_delay_s",
    "cert_dir",
    "health_probe_bind_address",
    "metrics_bind_address",
    "translate",
    "translate_resources",
    "translation_cache_s",
    "translation_namespace_cache_s",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `elasticgpu webhook`; defaults are `WebhookSettings`'s."""
    d = WebhookSettings()
    parser.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, then $KUBECONFIG, ~/.kube/config)")
    parser.add_argument("--context", help="kubeconfig context")
    parser.add_argument("--namespace", help=f"namespace of the Secret and the Service (default {d.namespace})")
    parser.add_argument("--secret-name", help=f"Secret holding the certificate (default {d.secret_name})")
    parser.add_argument(
        "--configuration-name", help=f"MutatingWebhookConfiguration kept current (default {d.configuration_name})"
    )
    parser.add_argument("--service-name", help=f"Service the API server calls (default {d.service_name})")
    parser.add_argument("--service-port", type=int, help=f"port of that Service (default {d.service_port})")
    parser.add_argument(
        "--url", help="https URL the API server calls instead of the Service, e.g. https://10.0.0.5:8443"
    )
    parser.add_argument("--listen-host", help=f"address to listen on (default {d.listen_host})")
    parser.add_argument("--port", type=port_number, help=f"HTTPS port (default {d.port}; 0: any free port)")
    parser.add_argument("--validity-s", type=float, help=f"certificate lifetime, seconds (default {d.validity_s:.0f})")
    parser.add_argument(
        "--renew-before-s", type=float, help=f"renew with this many seconds left (default {d.renew_before_s:.0f})"
    )
    parser.add_argument(
        "--check-interval-s", type=float, help=f"seconds between certificate checks (default {d.check_interval_s:.0f})"
    )
    parser.add_argument(
        "--swap-delay-s", type=float, help=f"seconds from publishing a new CA to serving it (default {d.swap_delay_s})"
    )
    parser.add_argument(
        "--webhook-cert-path",
        dest="cert_dir",
        metavar="DIR",
        help="serve tls.crt and tls.key from DIR (a mounted cert-manager Secret), reloaded when they change;"
        " then no Secret or caBundle is written (cert-manager's CA injector keeps the caBundle)",
    )
    parser.add_argument("--health-probe-bind-address", type=flags.bind_address,
                        help="[host]:port of plain-HTTP /healthz and /readyz (default 0: off;"
                        " /healthz over HTTPS on --port answers either way)")
    parser.add_argument("--metrics-bind-address", type=flags.bind_address,
                        help="[host]:port of plain-HTTP /metrics (default 0: off; the same address as"
                        " --health-probe-bind-address: one server)")
    parser.add_argument("--translate", action="store_true", default=None,
                        help="turn nvidia.com/gpu (and HAMi's names) of pods in namespaces labelled"
                        " elasticgpu.io/translate-resources=true into their inline claims (docs/translation.md)")
    parser.add_argument("--translate-resources", type=_translation_table, metavar="JSON",
                        help="the table of translated names: JSON name -> {meaning: cards|memoryMiB|memoryPercent|"
                        "corePercent|slice, cores, memory} (default: NVIDIA's and HAMi's names)")
    parser.add_argument("--translation-cache-s", type=float,
                        help=f"seconds classes, cards and DeviceClasses are reused (default {d.translation_cache_s})")
    parser.add_argument("--translation-namespace-cache-s", type=float,
                        help="seconds a namespace's label, class and quotas are reused"
                        f" (default {d.translation_namespace_cache_s}; 0: read for every pod)")
    flags.add_logging(parser)
    parser.set_defaults(handler=run)


def _translation_table(text: str) -> str:
    """Checked at start: a bad table stops the webhook with the entry and the fix, not at the first pod."""
    try:
        WebhookSettings(translate_resources=text).translation_table()
    except InvalidTranslationTable as error:
        raise argparse.ArgumentTypeError(str(error)) from error
    return text


def settings_from(args: argparse.Namespace) -> WebhookSettings:
    """`WebhookSettings` with every flag that was given."""
    given = {name: getattr(args, name) for name in _FIELDS if getattr(args, name, None) is not None}
    return WebhookSettings(**given)


def run(args: argparse.Namespace) -> int:
    """Handler of `elasticgpu webhook`."""
    configure_logging(level=flags.log_level(args), log_format=args.log_format)
    run_webhook(settings_from(args), kubeconfig=args.kubeconfig, context=args.context)
    return 0
