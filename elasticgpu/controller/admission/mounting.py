"""Serving a certificate that someone else keeps in a directory (`--webhook-cert-path`).

cert-manager writes the serving certificate into a Secret, kubelet mounts it as `tls.crt` and
`tls.key` (the names controller-runtime reads), and cert-manager's CA injector keeps the
MutatingWebhookConfiguration's caBundle current. In this mode the webhook makes no certificate
and writes nothing to the API: it serves the files and follows them when they change.

The files are checked before every TLS handshake (two `stat` calls, microseconds): a rotated
certificate is served from the very next connection, with no poll interval to wait out. Until the
first one is loaded nothing listens (serving.py), so a background check every `first_poll_s`
loads it, then ends.
kubelet swaps a Secret volume atomically (a `..data` symlink), but someone copying files by hand
may leave a moment where the new certificate sits beside the old key: loading fails then, the
previous certificate stays in use, and the next handshake tries again.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from elasticgpu.controller.admission.serving import HttpsServer

logger = logging.getLogger(__name__)

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"

_Signature = tuple[tuple[int, int, int], tuple[int, int, int]]


class MountedCertificate:
    """Keeps `server` serving `directory`/tls.crt and tls.key, reloading them when they change."""

    def __init__(self, *, server: HttpsServer, directory: str, first_poll_s: float = 0.5) -> None:
        """`first_poll_s`: seconds between checks for the files until the first certificate is loaded."""
        self._server = server
        self._first_poll_s = first_poll_s
        self._stopping = threading.Event()
        self._poller: threading.Thread | None = None
        self._cert = Path(directory) / CERT_FILE
        self._key = Path(directory) / KEY_FILE
        self._lock = threading.Lock()
        self._loaded: _Signature | None = None
        self._failed: _Signature | None = None
        self._missing_logged = False
        self.ready = threading.Event()
        """Set once a certificate from the directory is served."""

    def _signature(self) -> _Signature | None:
        # stat follows the symlinks kubelet puts there: a swap of `..data` changes inode and mtime.
        try:
            cert, key = os.stat(self._cert), os.stat(self._key)
        except OSError:
            return None
        return (cert.st_ino, cert.st_mtime_ns, cert.st_size), (key.st_ino, key.st_mtime_ns, key.st_size)

    def refresh(self) -> None:
        """Load the files if they changed since the last load; keep the current certificate if they
        cannot be loaded (logged once per change of the files)."""
        signature = self._signature()
        if signature is not None and signature == self._loaded:
            return
        with self._lock:
            signature = self._signature()
            if signature is None:
                if not self._missing_logged:
                    self._missing_logged = True
                    logger.warning("webhook certificate: %s or %s is missing; mount the certificate's Secret"
                                   " there (--webhook-cert-path)", self._cert, self._key)
                return
            if signature == self._loaded:
                return  # another connection's thread loaded it meanwhile
            try:
                self._server.use_files(cert=str(self._cert), key=str(self._key))
            except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
                if signature != self._failed:
                    self._failed = signature
                    logger.warning("webhook certificate: cannot load %s with %s (%s); still serving the previous"
                                   " one, retrying on the next connection", self._cert, self._key, error)
                return
            self._loaded, self._missing_logged = signature, False
            logger.info("serving webhook certificate %x from %s", self._server.serial or 0, self._cert.parent)
            self.ready.set()

    def start(self) -> None:
        """Load the certificate now, or as soon as it is there, and check the files before every handshake."""
        self._server.before_handshake = self.refresh
        self.refresh()
        if not self.ready.is_set():
            self._poller = threading.Thread(target=self._wait_for_files, name="webhook-cert-files", daemon=True)
            self._poller.start()

    def _wait_for_files(self) -> None:
        # No connection can trigger a check before the first certificate (nothing listens yet).
        while not self.ready.is_set() and not self._stopping.wait(self._first_poll_s):
            try:
                self.refresh()
            except Exception:  # a bug of ours: keep trying, the webhook must come up
                logger.exception("loading the mounted webhook certificate failed")

    def stop(self) -> None:
        """Stop waiting for the first certificate; after it, the checks ride on the connections."""
        self._stopping.set()
        if self._poller is not None:
            self._poller.join(timeout=5)
        self._server.before_handshake = None
