"""Which Nodes exist, as the node list and watch tell, and since when a GPU's Node is gone.

A GPU object names its node (`spec.nodeName`); its agent also makes the Node its owner (an
ownerReference with the Node's uid, which a real cluster's garbage collector follows). When that
Node is gone, the agent's last `status.runningClaims` describe containers that no longer exist
(`running_holders` stops believing them), and after a grace the GPU object is deleted
(`gpu_sync`), as the pod garbage collector deletes the pods of a deleted Node.

A GPU's Node is gone when
- the GPU has an ownerReference to a Node, and no Node of that name and uid exists (deleted, or
  deleted and registered again: another uid), exactly the garbage collector's rule; or
- it has none (written by hand or by another tool), and this process saw that Node exist and
  then saw it go: a GPU written for a node that never existed is taken as it is, as a GPU
  without a heartbeat is.

"Gone" is said only from a complete view: until one node list has succeeded (RBAC may not grant
nodes, a list may fail) nothing is gone, so a controller that cannot read Nodes never frees a
reservation or deletes a GPU because of them. When a Node went missing is taken from this
process's clock (monotonic) when it first learns it: a restarted controller waits the whole grace
again, which only delays a deletion.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from elasticgpu.api import GPU


def owner_node(gpu: GPU) -> tuple[str, str] | None:
    """(name, uid) of the Node in the GPU's ownerReferences, or None when it has none."""
    for ref in gpu.metadata.owner_references:
        if ref.get("kind") == "Node" and ref.get("apiVersion") == "v1" and ref.get("name") and ref.get("uid"):
            return str(ref["name"]), str(ref["uid"])
    return None


class NodePresence:
    """Nodes present (by name, with their uid), those seen go, and since when (see the module docstring)."""

    def __init__(self, lock: threading.RLock, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = lock
        self._clock = clock
        self._complete = False
        self._present: dict[str, str] = {}
        self._seen: set[str] = set()
        self._missing_since: dict[tuple[str, str], float] = {}

    def put(self, body: dict[str, Any], *, deleted: bool) -> None:
        """A watch event of a Node."""
        meta = body.get("metadata") or {}
        name, uid = str(meta.get("name", "")), str(meta.get("uid", ""))
        with self._lock:
            if deleted:
                if self._present.get(name) in (uid, "", None) or not uid:
                    self._present.pop(name, None)
            else:
                self._present[name] = uid
                self._seen.add(name)

    def merge(self, bodies: Iterable[dict[str, Any]]) -> None:
        """A complete list of the Nodes (the view is complete from now on)."""
        present = {str((b.get("metadata") or {}).get("name", "")): str((b.get("metadata") or {}).get("uid", ""))
                   for b in bodies}
        with self._lock:
            self._complete = True
            self._present = present
            self._seen |= set(present)

    def gone_for(self, gpu: GPU) -> float | None:
        """Seconds the Node of `gpu` has been gone (see the module docstring), or None while it is not."""
        owner = owner_node(gpu)
        with self._lock:
            if not self._complete:
                return None
            if owner is not None:
                name, uid = owner
                gone = self._present.get(name) != uid
            else:
                name, uid = gpu.spec.node_name, ""
                gone = name in self._seen and name not in self._present
            key = (name, uid)
            if not gone:
                self._missing_since.pop(key, None)
                return None
            now = self._clock()
            return now - self._missing_since.setdefault(key, now)
