"""The GPU sync: keep a GPU's readiness in the picture and its `Ready` condition on the server
in step with its agent's heartbeat (`gpu_health` decides), and move its effective owner
(`status.owner`, `OwnerMove`) once nothing holds it on the old side (`owner_move` decides).

One sync reads one way: under the picture's lock it reads the GPU and asks the decisions once
(`gpu_step.decide`: the readiness, when to look again, the body to write) and keeps the
readiness in the picture (before the write: a card set aside takes no new reservation while
its `Ready` write is in flight); then it writes; then it records the answer (the picture, an
Event). Nothing it calls calls back into it.

A heartbeat expires with no event to say so, so each sync of a GPU with a fresh heartbeat
queues the GPU again for the moment its grace runs out (one delayed key per GPU at most: a
renewed heartbeat moves the moment later, and the earlier key finds it fresh and queues the
next). The `Ready` condition is written with the resourceVersion the picture holds (a PUT of
the status, as the reservation commit does), so the agent's conditions and the allocations are
written back exactly as they were read; a 409 re-reads the GPU and the key is retried.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from elasticgpu.api import GPU, dra_names, names, timestamps
from elasticgpu.controller import errors
from elasticgpu.controller.decisions import gpu_step, owner_move
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.machinery.events import NORMAL, WARNING, EventRecorder
from elasticgpu.controller.flow.machinery.workqueue import WorkQueue
from elasticgpu.controller.picture import node_presence
from elasticgpu.controller.picture.picture import Body, Picture
from elasticgpu.controller.settings import GPUHealthSettings, OwnerMoveSettings

logger = logging.getLogger(__name__)

REASON_OWNER_MOVED = "OwnerMoved"
"""Normal Event on a GPU whose effective owner (status.owner) the controller just moved (docs/dra.md)."""


class GPUSync:
    """Syncs one GPU's readiness at a time (see the module docstring)."""

    def __init__(self, *, kube: KubeApi, picture: Picture, queue: WorkQueue, events: EventRecorder,
                 settings: GPUHealthSettings, clock: Callable[[], float] = time.time,
                 dra: Callable[[str, int], owner_move.DraHolders] | None = None,
                 owner_settings: OwnerMoveSettings | None = None) -> None:
        """`clock`: seconds since the epoch (the heartbeat's clock; tests may pass their own). `dra`: what
        ResourceClaims hold of a card (pool, index); None: unknown, so no card moves back from DRA."""
        self.dra = dra
        self.owner_settings = owner_settings or OwnerMoveSettings()
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
        """Decide and carry out the readiness of GPU `name` (see the module docstring)."""
        picture = self.picture
        with picture.lock:
            held = picture.ledger.gpu_and_body(name)
            if held is None:
                picture.ledger.set_ready(name, True)  # gone: nothing to remember of it
                step, wake = None, []
            else:
                step = gpu_step.decide(*held, now=self._clock(), grace_s=self.settings.heartbeat_grace_s,
                                       now_rfc3339=timestamps.now_rfc3339(),
                                       node_gone_for_s=picture.nodes.gone_for(held[0]),
                                       node_gone_grace_s=self.settings.node_gone_grace_s)
                wake = picture.gpu_ready(name, step.ready)
        if step is None or step.delete:
            with self._lock:
                self._due.pop(name, None)
            if step is not None and held is not None:
                self._delete(name, held[0])
            return
        self.queue.add_all(wake)  # capacity came back: the waiting claims may fit now
        self._recheck(name, step.recheck_in_s)
        if step.condition is not None and step.body is not None:
            self._write(name, step.body, step.condition)
        self._move_owner(name)

    def _move_owner(self, name: str) -> None:
        """Decide the card's effective owner (`owner_move`) from the GPU as the picture holds it now and
        what DRA holds of it, and write it when it changes (with the picture's resourceVersion: a
        reservation or an agent write in between is a 409, and the retry decides again)."""
        picture = self.picture
        with picture.lock:
            held = picture.ledger.gpu_and_body(name)
            if held is None:
                return
            gpu, body = held
            dra = (self.dra(dra_names.pool_name(gpu.spec.node_name), gpu.spec.index) if self.dra is not None
                   else owner_move.DraHolders(known=False, why_unknown="this controller reads no ResourceClaims"))
            step = owner_move.decide(gpu, body, dra=dra, now=self._clock(), now_rfc3339=timestamps.now_rfc3339(),
                                     grace_s=self.owner_settings.unpublish_grace_s)
        if step.recheck_in_s is not None:
            self.queue.add(("gpu", name), delay_s=step.recheck_in_s, recheck=True)
        if step.body is None:
            return
        try:
            answer = self.kube.replace_gpu_status(step.body)
        except (errors.NotFound, errors.Conflict):
            try:  # as `_write`: read it again; the retry decides from what it finds
                self.picture.gpu_written(self.kube.get_gpu(name))
            except errors.NotFound:
                self.picture.forget_gpu(name)
                return
            raise
        self.picture.gpu_written(answer)
        if not step.moved:
            return
        logger.info("GPU %s: owner is now %s (%s)", name, step.owner, step.condition["message"])
        self.events.record(answer, type_=NORMAL, reason=REASON_OWNER_MOVED, message=step.condition["message"])
        if step.owner == names.OWNER_ELASTIC_GPU:
            self.queue.add_all(self.picture.pending_claim_keys())  # the card takes reservations again

    def _delete(self, name: str, gpu: GPU) -> None:
        """Delete GPU `name`, whose Node has been gone for the grace, once a live read confirms the Node
        is gone (the picture's node view may lag); only the incarnation the picture holds (its uid)."""
        owner = node_presence.owner_node(gpu)
        node = owner[0] if owner is not None else gpu.spec.node_name
        try:
            live = self.kube.get_node(node)
        except errors.NotFound:
            live = None
        if live is not None and (owner is None or (live.get("metadata") or {}).get("uid") == owner[1]):
            self.picture.observe("node", "ADDED", live)
            return  # it exists after all (the watch lags): nothing to collect
        try:
            self.kube.delete_gpu(name, uid=gpu.metadata.uid)
        except (errors.NotFound, errors.Conflict):
            return  # gone already, or another incarnation now: its own sync decides
        logger.info("GPU %s: deleted, its node %s is gone (reservations on it go with it)", name, node)
        message = (f"node {node} no longer exists: GPU {name} is deleted with it; the ElasticGPUs on it fail and"
                   " their claims become Lost")
        self.events.record(self.picture.ledger.gpu_body(name) or gpu.to_dict(), type_=WARNING,
                           reason=gpu_step.REASON_NODE_GONE, message=message)

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
        """PUT `body` (the decided status, with the picture's resourceVersion), then record the
        answer: the picture takes it in, and an Event says what changed."""
        try:
            answer = self.kube.replace_gpu_status(body)
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
