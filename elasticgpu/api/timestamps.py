"""Kubernetes timestamps (RFC 3339 `metav1.Time` and `MicroTime`) read the one way every
component reads them: a value that is absent or unreadable is None, never an exception; and
written the way the API server writes them (`now_rfc3339`, whole seconds)."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime


def parse(text: str | None) -> datetime | None:
    """An RFC 3339 timestamp as an aware datetime; None when absent or unreadable."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def epoch_seconds(text: str | None) -> float | None:
    """An RFC 3339 timestamp as seconds since the epoch; None when absent or unreadable."""
    moment = parse(text)
    return None if moment is None else moment.timestamp()


def now_rfc3339() -> str:
    """The current time as the API server writes it (whole seconds)."""
    second = int(time.time())
    cached_second, stamp = _last_stamp[0]
    if cached_second != second:  # formatting is costly enough to show in a burst: once a second
        stamp = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        _last_stamp[0] = (second, stamp)  # one tuple: threads never see a half-updated pair
    return stamp


_last_stamp: list[tuple[int, str]] = [(0, "")]


def format_epoch(seconds: float) -> str:
    """Seconds since the epoch as RFC 3339 in whole seconds (UTC), as the API server writes them."""
    return datetime.fromtimestamp(math.floor(seconds), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
