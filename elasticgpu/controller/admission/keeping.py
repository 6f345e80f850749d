"""Keeps the webhook's certificate valid and its caBundle current. Runs in its own thread.

One pass (`sync`), every `check_interval_s`:
1. Read the Secret. If its certificate is missing, unreadable, for other names, or has less
   than `renew_before_s` left, generate a new CA and certificate (the old CA kept as
   `previous_ca`) and write them under the Secret's resourceVersion. A conflict means another
   replica renewed first: read again and adopt theirs.
2. Make the MutatingWebhookConfiguration say what it should, caBundle = current CA + previous
   CA (while valid). Someone who edited it gets it back at the next pass.
3. Serve the Secret's certificate. If its CA was not in the stored caBundle before step 2,
   wait `swap_delay_s` first, so the API server trusts the new CA before it sees it.
A failed pass (API server down, conflicts in a row) is logged once and retried with backoff;
the certificate being served stays in use meanwhile.
"""

from __future__ import annotations

import datetime
import logging
import threading

from elasticgpu.controller.admission import certificates, configuration, errors
from elasticgpu.controller.admission.publishing import AdmissionApi
from elasticgpu.controller.admission.serving import HttpsServer
from elasticgpu.controller.admission.settings import WebhookSettings

logger = logging.getLogger(__name__)
_CONFLICT_RETRIES = 5
_FIRST_BACKOFF_S = 0.5


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class CertificateKeeper:
    """Renews, publishes and serves the webhook's certificate."""

    def __init__(self, *, api: AdmissionApi, server: HttpsServer, settings: WebhookSettings) -> None:
        self._api = api
        self._server = server
        self._settings = settings
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.ready = threading.Event()
        """Set once a certificate is served and published."""

    def sync(self) -> None:
        """One pass: renew if due, publish the caBundle, serve the certificate."""
        s = self._settings
        for _ in range(_CONFLICT_RETRIES):
            material, version, secret_type = self._api.read_secret()
            reason = certificates.renewal_reason(
                material, hosts=s.certificate_hosts(), now=_now(), renew_before_s=s.renew_before_s
            )
            if reason is None and material is not None:
                break
            renewed = certificates.generate(
                hosts=s.certificate_hosts(), now=_now(), validity_s=s.validity_s, previous=material
            )
            try:
                self._api.write_secret(renewed, resource_version=version, type_=secret_type)
            except errors.Conflict:
                continue  # another replica renewed meanwhile: read theirs
            logger.info(
                "webhook certificate renewed (%s); valid until %s, stored in Secret %s/%s",
                reason,
                renewed.not_after().isoformat(),
                s.namespace,
                s.secret_name,
            )
            material = renewed
            break
        else:
            raise errors.Conflict(f"Secret {s.namespace}/{s.secret_name} changed {_CONFLICT_RETRIES} times in a row")

        desired = configuration.webhook_configuration(s, material.ca_bundle(now=_now()))
        stored = self._api.read_configuration()
        trusted_before = configuration.ca_bundle_of(stored, s.webhook_name)
        if not configuration.is_current(stored, desired):
            self._api.apply_configuration(desired)
            logger.info("MutatingWebhookConfiguration %s written (caBundle current)", s.configuration_name)

        if self._server.serial != material.serial():
            if self._server.serial is not None and material.ca_cert not in trusted_before:
                # The API server learns of the new caBundle through an informer: give it a moment.
                self._stopping.wait(s.swap_delay_s)
            self._server.use(material)
            logger.info("serving webhook certificate %x", material.serial())
        self.ready.set()

    def start(self) -> None:
        """Run `sync` now and every `check_interval_s` in a background thread."""
        self._thread = threading.Thread(target=self._run, name="webhook-certificates", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (an ongoing pass finishes first)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=self._settings.request_timeout_s * 3)

    def _run(self) -> None:
        backoff = _FIRST_BACKOFF_S
        last_error = ""
        while not self._stopping.is_set():
            try:
                self.sync()
            except Exception as error:
                # Never let the thread die: the next pass repairs what this one could not do.
                text = f"{type(error).__name__}: {error}"
                if text != last_error:
                    logger.warning("webhook certificate pass failed, retrying in %.1fs: %s", backoff, text)
                    last_error = text
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, self._settings.check_interval_s)
                continue
            if last_error:
                logger.info("webhook certificate pass succeeded again")
            backoff, last_error = _FIRST_BACKOFF_S, ""
            self._stopping.wait(self._settings.check_interval_s)
