"""When each object of a list first met a condition, seen through a watch (the benches' clock
for "bound" and "gate lifted": the moment the API server shows it, not when a client polls)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

Event = dict[str, Any]


class SeenClock:
    """`seen[name]`: the monotonic time an object was first seen meeting a condition; a subclass
    runs the watch in `_run` (on its own thread) and calls `note(name)`."""

    def __init__(self) -> None:
        self.seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        raise NotImplementedError

    def note(self, name: str) -> None:
        """`name` meets the condition now (the first time counts)."""
        now = time.monotonic()
        with self._cond:
            self.seen.setdefault(name, now)
            self._cond.notify_all()

    def wait(self, wanted: list[str], timeout_s: float) -> bool:
        """True once every name in `wanted` was seen; False after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not all(n in self.seen for n in wanted):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.5))
        return True

    def stop(self) -> None:
        self._stop.set()


class FirstSeen(SeenClock):
    """Watches the objects at `path` (a list path of the API server) through `kube` (the
    controller's KubeApi); `seen[name]` is the monotonic time the first event for which
    `condition(event)` held arrived."""

    def __init__(self, kube: Any, path: str, condition: Callable[[Event], bool]) -> None:
        self.kube, self.path, self.condition = kube, path, condition
        super().__init__()

    def _run(self) -> None:
        resource_version = ""
        while not self._stop.is_set():
            try:
                if not resource_version:
                    page = self.kube._call("GET", self.path, query={"limit": "1"})
                    resource_version = page["metadata"]["resourceVersion"]
                # Long: a reopened watch delays every event it would have seen in the meantime.
                for event in self.kube.watch(self.path, resource_version=resource_version, timeout_s=900):
                    obj = event.get("object") or {}
                    resource_version = obj.get("metadata", {}).get("resourceVersion", resource_version)
                    if event.get("type") == "ERROR":
                        resource_version = ""
                        break
                    if self.condition(event):
                        self.note(obj["metadata"]["name"])
                    if self._stop.is_set():
                        return
            except Exception as err:  # the watch is re-opened at once; the bench must not die of one drop
                print(f"  (watch re-opened: {err})", file=sys.stderr)
                time.sleep(0.01)
