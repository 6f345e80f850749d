"""The GPU sync: keep a GPU's readiness in the picture and its `Ready` condition on the server
in step with its agent's heartbeat (`gpu_health` decides).

A heartbeat expires with no event to say so, so each sync of a GPU with a fresh heartbeat
queues the GPU again for the moment its grace runs out (one delayed key per GPU at most: a
renewed heartbeat moves the moment later, and the earlier key finds it fresh and queues the
next). The `Ready` condition is written with the resourceVersion the picture holds (a PUT of
the status, as the reservation commit does), so the agent's conditions and the allocations are
written back exactly as they were read; a 409 re-reads the GPU and the key is retried.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable

from elasticgpu.controller import errors
from elasticgpu.controller.decisions import gpu_health
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.events import NORMAL, WARNING, EventRecorder
from elasticgpu.controller.flow.workqueue import WorkQueue
from elasticgpu.controller.picture.picture import Body, Picture
from elasticgpu.controller.picture.reservations import now_rfc3339
from elasticgpu.controller.settings import GPUHealthSettings

logger = logging.getLogger(__name__)


class GPUSync:
    """Syncs one GPU's readiness at a time (see the module docstring)."""

    def __init__(self, *, kube: KubeApi, picture: Picture, queue: WorkQueue, events: EventRecorder,
                 settings: GPUHealthSettings, clock: Callable[[], float] = time.time) -> None:
        """`clock`: seconds since the epoch (the heartbeat's clock; tests may pass their own)."""
        self.kube = kube
        self.picture = picture
        self.queue = queue
        self.events = events
        self.settings = settings
        self._clock = clock
        self._due: dict[str, float] = {}
        """When the delayed key queued for each GPU comes due (monotonic seconds)."""
        self._lock = threading.Lock()

    def sync(self, name: str) -> None:
        """Decide and carry out the readiness of GPU `name`."""
        picture = self.picture
        with picture.lock:
            model = picture.ledger.gpu(name)
            if model is None:
                picture.ledger.set_ready(name, True)  # gone: nothing to remember of it
                with self._lock:
                    self._due.pop(name, None)
                return
            state = gpu_health.readiness(model, now=self._clock(), grace_s=self.settings.heartbeat_grace_s)
            changed = picture.ledger.set_ready(name, state.ready)
            wake = picture.pending_claim_keys() if changed and state.ready else []
            condition = gpu_health.condition_to_write(model, state, now_rfc3339=now_rfc3339())
            body = picture.ledger.gpu_body(name) if condition is not None else None
        self.queue.add_all(wake)  # capacity came back: the waiting claims may fit now
        self._recheck(name, state.recheck_in_s)
        if condition is not None and body is not None:
            self._write(name, body, condition)

    def _recheck(self, name: str, in_s: float | None) -> None:
        """Queue the GPU again in `in_s` seconds, unless an earlier key is already due for it
        (that one finds the heartbeat fresh and queues the next)."""
        now = time.monotonic()
        with self._lock:
            if in_s is None:
                self._due.pop(name, None)
                return
            due = self._due.get(name)
            if due is not None and now < due <= now + in_s:
                return
            self._due[name] = now + in_s
        self.queue.add(("gpu", name), delay_s=in_s, recheck=True)

    def _write(self, name: str, body: Body, condition: Body) -> None:
        status = dict(body.get("status") or {})
        status["conditions"] = gpu_health.with_condition(status.get("conditions") or [], condition)
        fresh = {**copy.copy(body), "status": status}
        try:
            answer = self.kube.replace_gpu_status(fresh)
        except (errors.NotFound, errors.Conflict):
            # 404: gone only if a read agrees (a write's 404 is not proof); 409: the agent (a
            # heartbeat) or a reservation wrote the card since. Either way read it again; the
            # retry decides from what it finds (a renewed heartbeat needs no write at all).
            try:
                self.picture.gpu_written(self.kube.get_gpu(name))
            except errors.NotFound:
                self.picture.forget_gpu(name)
                return
            raise
        self.picture.gpu_written(answer)
        kind = NORMAL if condition["status"] == "True" else WARNING
        self.events.record(answer, type_=kind, reason=condition["reason"], message=condition["message"])
