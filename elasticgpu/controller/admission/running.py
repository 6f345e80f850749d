"""The webhook as one component: its HTTPS server, its certificate keeper and, when asked for,
its plain-HTTP probes and metrics (`elasticgpu/probe_server.py`).

`Webhook` starts and stops both (the controller can run it beside its own work);
`run_webhook` is the blocking entry point of `elasticgpu webhook`.
"""

from __future__ import annotations

import functools
import logging
import signal
import threading
from types import FrameType

from elasticgpu import probe_server
from elasticgpu.controller.admission import publishing, reviewing
from elasticgpu.controller.admission.keeping import CertificateKeeper
from elasticgpu.controller.admission.metrics import WebhookMetrics
from elasticgpu.controller.admission.mounting import MountedCertificate
from elasticgpu.controller.admission.publishing import AdmissionApi
from elasticgpu.controller.admission.serving import HttpsServer, Reviewer
from elasticgpu.controller.admission.settings import WebhookSettings
from elasticgpu.controller.admission.translating import Translator

logger = logging.getLogger(__name__)


class Webhook:
    """The pod admission webhook: HTTPS server + certificate keeper, started and stopped together."""

    def __init__(self, *, api: AdmissionApi | None, settings: WebhookSettings) -> None:
        """`api` may be None only with `settings.cert_dir`: the mounted certificate needs no API."""
        self._api = api
        self.settings = settings
        self.metrics = WebhookMetrics()
        reviewer: Reviewer = reviewing.review
        self.translator: Translator | None = None
        if settings.translate:
            if api is None:
                raise ValueError("Webhook: translation reads the cluster: an AdmissionApi is needed")
            self.translator = Translator(reader=api, table=settings.translation_table(),
                                         cache_s=settings.translation_cache_s,
                                         namespace_cache_s=settings.translation_namespace_cache_s)
            reviewer = functools.partial(reviewing.review, translate=self.translator.translate)
        self.server = HttpsServer(
            host=settings.listen_host, port=settings.port, path=settings.path, reviewer=reviewer,
            metrics=self.metrics,
        )
        self.probes: list[probe_server.Endpoints] = []
        self.keeper: CertificateKeeper | MountedCertificate
        if settings.cert_dir:
            # cert-manager's files; its CA injector owns the caBundle, so we publish nothing.
            self.keeper = MountedCertificate(server=self.server, directory=settings.cert_dir)
        elif api is None:
            raise ValueError("Webhook: an AdmissionApi is needed unless settings.cert_dir is set")
        else:
            self.keeper = CertificateKeeper(api=api, server=self.server, settings=settings)

    @property
    def port(self) -> int:
        """The port the HTTPS server listens on."""
        return self.server.port

    def start(self) -> None:
        """Keep the certificate in the background and listen once it is loaded (connections are
        refused until then; the port was bound at construction). The probe servers bind first: a
        taken port fails before anything runs."""
        self.probes = probe_server.servers(
            health=self.settings.health_probe_bind_address, metrics=self.settings.metrics_bind_address,
            registry=self.metrics.registry, healthz={"https": self._accepting}, readyz={
                "https": self._accepting, "certificate": self._certificate},
        )  # fmt: skip
        self.server.start()
        self.keeper.start()
        for server in self.probes:
            server.start()
            logger.info("webhook serving %s over plain HTTP on port %d", ", ".join(server.paths), server.port)
        logger.info(
            "webhook listening on %s:%d%s; API server reaches it as %s",
            self.settings.listen_host,
            self.port,
            self.settings.path,
            self.settings.client_host,
        )

    def _accepting(self) -> str | None:
        # Waiting for the first certificate is alive (readyz's `certificate` says it is not ready).
        return self.server.problem()

    def _certificate(self) -> str | None:
        return None if self.server.serial is not None else "no serving certificate loaded yet"

    def wait_ready(self, timeout_s: float) -> bool:
        """True once a certificate is served (and, when we make it, published); False after `timeout_s`."""
        return self.keeper.ready.wait(timeout_s)

    def stop(self) -> None:
        """Stop both; the configuration stays (pods with our annotations are refused meanwhile,
        failurePolicy Fail, and every other pod is admitted as always)."""
        for server in self.probes:
            server.shutdown()
        self.keeper.stop()
        self.server.stop()


def run_webhook(settings: WebhookSettings, *, kubeconfig: str | None = None, context: str | None = None) -> None:
    """Run the webhook until SIGTERM or SIGINT."""
    api = (None if settings.cert_dir and not settings.translate  # a mounted certificate: nothing to read or write
           else AdmissionApi(publishing.api_client(kubeconfig=kubeconfig, context=context), settings=settings))
    webhook = Webhook(api=api, settings=settings)
    stopping = threading.Event()

    def _stop(signum: int, _frame: FrameType | None) -> None:
        logger.info("signal %d: stopping the webhook", signum)
        stopping.set()

    webhook.start()  # first: a taken port fails here, with the default signal handlers still in place
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        stopping.wait()
    finally:
        webhook.stop()
        if api is not None:
            api.close()
