"""A loop that fails the same way again and again says so once: the first failure (and each new kind
of failure) at WARNING with what failed, the same failure again at DEBUG, and the end of the failures
at INFO. A runtime or API server that is down for an hour is one line, not 360.

`describe` names a failure by what stays the same from one attempt to the next: a gRPC error by its
status code and details, not its text (which carries a timestamp and the connection's debug string,
so no two attempts ever read the same), anything else by its type and message.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass


def describe(error: BaseException) -> str:
    """What failed, in words that repeat when the same thing fails again."""
    code, details = getattr(error, "code", None), getattr(error, "details", None)
    if callable(code) and callable(details):  # a grpc.Call (without importing grpc: no runtime here)
        status = code()
        return f"{getattr(status, 'name', status)}: {details() or ''}".rstrip(": ")
    return f"{type(error).__name__}: {error}"


@dataclass
class RepeatedFailure:
    """The log of one loop's failures in a row (see the module docstring)."""

    what: str
    """What the loop does, for the log lines ("reconciling with the runtime at /run/...")."""
    log: logging.Logger
    failures: int = 0
    said: str | None = None

    def failed(self, error: BaseException, *, retry_in_s: float, trace: bool = False) -> None:
        """One more failure; the loop tries again in `retry_in_s`. `trace`: the WARNING carries the
        traceback (an error no one expected: a bug's)."""
        self.failures += 1
        text = describe(error)
        if text != self.said:
            self.log.warning("%s failed (%s); retrying with backoff (next in %.1f s)", self.what, text, retry_in_s,
                             exc_info=error if trace else None)
            self.said = text
        else:
            self.log.debug("%s failed again (%s); next in %.1f s", self.what, text, retry_in_s)

    def worked(self) -> None:
        """The loop succeeded: after failures, said once at INFO."""
        if self.failures:
            self.log.info("%s works again after %d failed attempt(s)", self.what, self.failures)
        self.failures, self.said = 0, None
