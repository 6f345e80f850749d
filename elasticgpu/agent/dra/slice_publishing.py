"""Keeps the node's ResourceSlice equal to what slice_content computes from the node's GPU objects.

A loop of its own: list this node's GPU objects (the same label-selected list and watch as the
rest of the agent: never the cluster), publish, then follow the watch and publish again on every
change, so a card whose spec.owner leaves DRA is withdrawn from the slice at the next event, before
the controller flips status.owner. Publishing compares with what the server holds and writes only
a change, with the pool's generation one higher (the scheduler takes the highest generation of a
pool); a node with no DRA card has no slice at all (deleted). A failure is logged once per kind
and retried with backoff; the loop never dies.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from elasticgpu.agent import errors, kube
from elasticgpu.agent.dra import slice_content

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 300
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0
NO_SLICE = "-"  # what is known of a node without DRA cards: no slice


class SlicePublisher:
    """Publishes one node's ResourceSlice through `api` (the agent's kube.AgentKube)."""

    def __init__(self, api: kube.AgentKube) -> None:
        self._api = api
        self._node = api.node_name
        self._name = slice_content.slice_name(api.node_name)
        # The digest of the devices last known on the server, NO_SLICE for none; None: unknown (read again).
        self._published: str | None = None
        self.publishes = 0
        """Writes made (applies and deletes), for tests and metrics."""

    def publish(self, gpus: list[dict[str, Any]]) -> bool:
        """Make the slice say what `gpus` (this node's GPU objects) offer; True when it wrote."""
        wanted = slice_content.devices(gpus)
        wanted_digest = slice_content.digest(wanted) if wanted else NO_SLICE
        if wanted_digest == self._published:
            return False
        try:
            current: dict[str, Any] | None = self._api.read_resource_slice(self._name)
        except errors.KubeNotFound:
            current = None
        on_server = ((current.get("metadata") or {}).get("annotations") or {}).get(
            slice_content.DIGEST_ANNOTATION, "") if current is not None else NO_SLICE
        if on_server == wanted_digest:
            self._published = wanted_digest
            return False
        if wanted_digest == NO_SLICE:
            with contextlib.suppress(errors.KubeNotFound):  # gone already: as wanted
                self._api.delete_resource_slice(self._name)
            log.info("ResourceSlice %s deleted: node %s has no card owned by DRA", self._name, self._node)
            self.publishes += 1
            self._published = NO_SLICE
            return True
        generation = int(((current or {}).get("spec", {}).get("pool") or {}).get("generation") or 0) + 1
        self._api.apply_resource_slice(slice_content.slice_body(self._node, wanted, generation=generation))
        self._published = wanted_digest
        self.publishes += 1
        log.info("ResourceSlice %s: %d DRA card(s) (%s), pool generation %d", self._name, len(wanted),
                 ", ".join(str(d["name"]) for d in wanted), generation)  # fmt: skip
        return True

    def forget(self) -> None:
        """Drop what is known of the server's slice (the next publish reads it again)."""
        self._published = None

    def run(self, stop: threading.Event) -> None:
        """List, publish, watch, publish on each change, until `stop`; failures back off and relist."""
        backoff = BACKOFF_START_S
        last_error = ""
        while not stop.is_set():
            try:
                items, version = self._api.list_gpus()
                gpus = {str(g.get("metadata", {}).get("name")): g for g in items}
                self.publish(list(gpus.values()))
                backoff, last_error = BACKOFF_START_S, ""
                for event in self._api.watch_gpus(version, timeout_s=WATCH_TIMEOUT_S):
                    if stop.is_set():
                        return
                    name = str(event.object.get("metadata", {}).get("name"))
                    if event.type in ("ADDED", "MODIFIED"):
                        gpus[name] = event.object
                    elif event.type == "DELETED":
                        gpus.pop(name, None)
                    else:
                        continue
                    self.publish(list(gpus.values()))
            except Exception as e:  # the loop never dies: a KubeError, or an object it cannot read
                if str(e) != last_error:
                    log.warning("DRA ResourceSlice of node %s: %s; retrying", self._node, e)
                    last_error = str(e)
                self.forget()
                stop.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
