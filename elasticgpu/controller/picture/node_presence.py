"""Which Nodes exist, as the node list and watch tell, and since when a node named by a GPU is missing.

A GPU object names its node (`spec.nodeName`). When that Node is gone, its agent's last
`status.runningClaims` describe containers that no longer exist (`running_holders` stops
believing them), and after a grace its GPU objects are deleted (`gpu_sync`), as the node
lifecycle controller deletes the pods of a deleted node.

"Gone" is said only from a complete view: until one node list has succeeded (RBAC may not grant
nodes, a list may fail) every node counts as present, so a controller that cannot read Nodes never
frees a reservation or deletes a GPU because of them. The time a node went missing is taken from
this process's clock (monotonic) when it first learns it: a restarted controller waits the whole
grace again, which only delays a deletion.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable


class NodePresence:
    """Node names present, and when each missing one was first found missing (see the module docstring)."""

    def __init__(self, lock: threading.RLock, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = lock
        self._clock = clock
        self._complete = False
        self._present: set[str] = set()
        self._missing_since: dict[str, float] = {}

    def put(self, name: str, *, deleted: bool) -> None:
        """A watch event of Node `name`."""
        with self._lock:
            if deleted:
                self._present.discard(name)
                self._missing_since.setdefault(name, self._clock())
            else:
                self._present.add(name)
                self._missing_since.pop(name, None)

    def merge(self, names: Iterable[str]) -> None:
        """A complete list of the Nodes (the view is complete from now on)."""
        with self._lock:
            self._complete = True
            self._present = set(names)
            for name in [n for n in self._missing_since if n in self._present]:
                del self._missing_since[name]

    def gone_for(self, name: str) -> float | None:
        """Seconds Node `name` has been missing, or None when it exists or the view is not complete."""
        with self._lock:
            if not self._complete or name in self._present:
                return None
            now = self._clock()
            return now - self._missing_since.setdefault(name, now)
