"""Events: one core/v1 Event for every transition a user should see (`kubectl describe`)."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from elasticgpu.controller.kube import KubeApi
from elasticgpu.controller.reservations import now_rfc3339

logger = logging.getLogger(__name__)

NORMAL = "Normal"
WARNING = "Warning"


class EventRecorder:
    """Writes Events about claims (in their namespace) and cluster objects (in `events_namespace`)."""

    def __init__(self, kube: KubeApi) -> None:
        self._kube = kube

    def record(self, obj: dict[str, Any], *, type_: str, reason: str, message: str) -> None:
        """Write one Event about `obj` and log the decision once (object, reason, message)."""
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace") or self._kube.settings.events_namespace
        name = meta.get("name", "")
        logger.info(
            "%s %s: %s: %s", obj.get("kind"), f"{meta.get('namespace')}/{name}" if meta.get("namespace") else name,
            reason, message,
        )
        now = now_rfc3339()
        component = self._kube.settings.component
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                "name": name,
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": component},
            "reportingComponent": component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self._kube.create_event(namespace, body)
