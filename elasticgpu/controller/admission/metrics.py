"""The webhook's Prometheus metrics, served on `/metrics` by `elasticgpu/probe_server.py`.

One `WebhookMetrics` per webhook holds its own `CollectorRegistry` (not the library's global one),
so two webhooks in one process (tests, or the controller running one beside itself) never collide.

    elasticgpu_webhook_reviews_total{outcome}   AdmissionReviews answered: allowed (untouched),
                                                patched (gate or label added), denied, malformed
                                                (HTTP 400), error (a bug of ours, HTTP 500)
    process_*                                   CPU, RSS, open files of this process
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, ProcessCollector

__all__ = ["OUTCOMES", "WebhookMetrics"]

OUTCOMES = ("allowed", "patched", "denied", "malformed", "error")


class WebhookMetrics:
    """Every metric of one webhook, in one registry."""

    def __init__(self) -> None:
        """Register the counter, each outcome at 0 (so a rate() has a series from the start)."""
        self.registry = CollectorRegistry()
        self.reviews = Counter(
            "elasticgpu_webhook_reviews", "AdmissionReviews answered, by outcome", ["outcome"], registry=self.registry
        )
        for outcome in OUTCOMES:
            self.reviews.labels(outcome=outcome)
        ProcessCollector(registry=self.registry)

    def reviewed(self, response: dict[str, Any]) -> None:
        """Count one answered AdmissionReview (`reviewing.review`'s return value)."""
        answer = response.get("response") or {}
        outcome = ("patched" if answer.get("patch") else "allowed") if answer.get("allowed") else "denied"
        self.reviews.labels(outcome=outcome).inc()

    def failed(self, outcome: str) -> None:
        """Count one review not answered: `malformed` or `error`."""
        self.reviews.labels(outcome=outcome).inc()
