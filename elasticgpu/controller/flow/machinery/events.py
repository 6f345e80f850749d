"""Events: one core/v1 Event for every transition a user should see (`kubectl describe`)."""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from typing import Any

from elasticgpu.api import timestamps
from elasticgpu.controller.edge.kube import KubeApi

logger = logging.getLogger(__name__)

NORMAL = "Normal"
WARNING = "Warning"


class EventRecorder:
    """Writes Events about claims (in their namespace) and cluster objects (in `events_namespace`)."""

    def __init__(self, kube: KubeApi, *, background: bool = False, backlog: int = 10_000) -> None:
        """`background`: Events are written by one daemon thread, off the binding path; when
        more than `backlog` wait (the API server is slower than binding), new ones are dropped
        (logged): an Event is a courtesy, the claim's status is the record."""
        self._kube = kube
        self._queue: queue.Queue[tuple[str, dict[str, Any]] | None] | None = None
        self._thread: threading.Thread | None = None
        if background:
            self._queue = queue.Queue(maxsize=backlog)
            self._thread = threading.Thread(target=self._write_loop, name="events", daemon=True)
            self._thread.start()

    @property
    def thread(self) -> threading.Thread | None:
        """The background writer (for the liveness check), or None when Events are written inline."""
        return self._thread

    def _write_loop(self) -> None:
        assert self._queue is not None
        while (item := self._queue.get()) is not None:
            try:
                self._kube.create_event(*item)
            except Exception:  # the writer must outlive any one Event; an Event is a courtesy
                logger.exception("event in %s not written", item[0])
            finally:
                self._queue.task_done()

    def idle(self) -> bool:
        """True when no Event waits to be written."""
        return self._queue is None or self._queue.unfinished_tasks == 0

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the background writer after the Events already queued."""
        if self._queue is not None and self._thread is not None:
            try:
                self._queue.put(None, timeout=timeout_s)
            except queue.Full:
                return
            self._thread.join(timeout_s)

    def record(self, obj: dict[str, Any], *, type_: str, reason: str, message: str, event_name: str = "") -> None:
        """Write one Event about `obj` and log the decision once (object, reason, message).
        `event_name`: a fixed name for an Event that must exist once (a second create is a 409,
        which `create_event` drops); else a fresh one."""
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace") or self._kube.settings.events_namespace
        name = meta.get("name", "")
        # A Warning Event is logged at WARNING: an operator filtering the log by level sees what
        # users see in `kubectl describe` as a warning.
        logger.log(
            logging.WARNING if type_ == WARNING else logging.INFO, "%s %s: %s: %s",
            obj.get("kind"), f"{meta.get('namespace')}/{name}" if meta.get("namespace") else name,
            reason, message,
        )
        now = timestamps.now_rfc3339()
        component = self._kube.settings.component
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": event_name or f"{name}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
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
        if self._queue is None:
            self._kube.create_event(namespace, body)
            return
        try:
            self._queue.put_nowait((namespace, body))
        except queue.Full:
            logger.debug("event dropped: backlog full", extra={"reason": reason})
