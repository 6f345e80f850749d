"""Whether the API server answers: one WARNING when it stops, one INFO when it is back.

`KubeApi` reports every call: `answered()` when any HTTP answer came back (even an error
status: the server is there), `failed(err)` when none did (connection refused or reset, a
timeout). Everything else that notices the outage (the worker's retries, the watches) logs it
at DEBUG only, so an outage reads as two lines in the log, not one per call.
"""

from __future__ import annotations

import logging
import threading
import time

logger = logging.getLogger(__name__)


class Reachability:
    """The API server's reachability as the calls of one `KubeApi` saw it."""

    def __init__(self, server: str) -> None:
        self._server = server
        self._down_since: float | None = None
        self._lock = threading.Lock()

    @property
    def reachable(self) -> bool:
        """False from the first call that got no answer until the next one that did."""
        return self._down_since is None

    def failed(self, err: BaseException) -> None:
        """A call got no answer."""
        with self._lock:
            if self._down_since is not None:
                return
            self._down_since = time.monotonic()
        logger.warning("API server %s is unreachable (%s); retrying, with backoff, until it answers",
                       self._server, err)

    def answered(self) -> None:
        """A call got an answer. (Called on every call: one attribute read when nothing changed.)"""
        if self._down_since is None:
            return
        with self._lock:
            since, self._down_since = self._down_since, None
        if since is not None:
            logger.info("API server %s answers again after %.0fs", self._server, time.monotonic() - since)
