"""The Namespace feed of the picture: one annotation, the FairShare weight, and nothing else.

The informer lists and watches Namespaces and hands each body here
(`bind_order.ANNOTATION_FAIR_SHARE_WEIGHT`): the picture keeps namespace -> weight. A bad value
leaves the namespace at weight 1 and is said once per namespace and value (a Warning Event on
the Namespace, which the recorder logs at WARNING). Parsing and the Event happen here, outside
the picture's lock; a weight change queues no key (it frees no room: the next wake orders the
waiting claims with it).
"""

from __future__ import annotations

import logging
import threading

from elasticgpu.controller import errors
from elasticgpu.controller.decisions import bind_order
from elasticgpu.controller.flow.machinery.events import WARNING, EventRecorder
from elasticgpu.controller.picture import versions
from elasticgpu.controller.picture.picture import Body, Picture

logger = logging.getLogger(__name__)

REASON_INVALID_WEIGHT = "InvalidFairShareWeight"
"""Event reason on a Namespace whose FairShare weight annotation is not a number from 0.01 to 100."""


class NamespaceWeightFeed:
    """Turns Namespace bodies into the picture's weights (see the module docstring)."""

    def __init__(self, *, picture: Picture, events: EventRecorder | None = None) -> None:
        """`events` writes the Warning Event of a bad annotation (None: it is only logged)."""
        self.picture = picture
        self.events = events
        self._lock = threading.Lock()
        self._bad: dict[str, str] = {}
        """The bad annotation value said of each namespace, until it changes (said once)."""

    def observe(self, event_type: str | None, body: Body) -> None:
        """Take in one watch event of a Namespace."""
        meta = body.get("metadata") or {}
        weight = None if event_type == "DELETED" else self.weight_of(body)
        self.picture.weights.put(meta.get("name", ""), weight, version=versions.version_of(body))

    def merge(self, listed: tuple[list[Body], str]) -> None:
        """Replace the picture's weights with those of a list of Namespaces (items, resourceVersion)."""
        items, list_version = listed
        weights = {str((b.get("metadata") or {}).get("name", "")): (self.weight_of(b), versions.version_of(b))
                   for b in items}
        self.picture.weights.merge(weights, list_version)

    def weight_of(self, body: Body) -> float:
        """The FairShare weight of a Namespace body; a bad value is weight 1, said once per
        namespace and value."""
        meta = body.get("metadata") or {}
        name = str(meta.get("name", ""))
        value = (meta.get("annotations") or {}).get(bind_order.ANNOTATION_FAIR_SHARE_WEIGHT)
        try:
            weight = bind_order.parse_weight(value, namespace=name)
        except bind_order.InvalidWeight as err:
            with self._lock:
                said = self._bad.get(name) == value
                self._bad[name] = str(value)
            if not said:
                self._say(body, str(err))
            return 1.0
        with self._lock:
            self._bad.pop(name, None)
        return weight

    def _say(self, body: Body, message: str) -> None:
        """One Warning Event on the Namespace (the recorder logs it at WARNING), or the log line alone."""
        if self.events is None:
            logger.warning("%s", message)
            return
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": body.get("metadata") or {}}
        try:
            self.events.record(namespace, type_=WARNING, reason=REASON_INVALID_WEIGHT, message=message)
        except errors.ElasticGPUError as err:  # an Event is a courtesy: the log line was written
            logger.debug("event about namespace %s not written: %s", (body.get("metadata") or {}).get("name"), err)
