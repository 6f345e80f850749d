"""Kubernetes timestamps (RFC 3339 `metav1.Time` and `MicroTime`) read the one way every
component reads them: a value that is absent or unreadable is None, never an exception."""

from __future__ import annotations

from datetime import datetime


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
