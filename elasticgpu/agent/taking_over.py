"""Whether the agent may take its node's GPUs: not while another GPU allocator is live there.

A node labelled for the agent may still run NVIDIA's device plugin (or HAMi's): the agent would then
neutralise every container it did not give a card (NVIDIA_VISIBLE_DEVICES=void), breaking the device
plugin's pods, and our controller would hand out the cards the plugin hands out too. So until the signs
of `elasticgpu.api.node_handover` are all gone (a GPU device plugin's socket that answers in kubelet's
device-plugin folder, a GPU resource the Node offers in its allocatable) the agent stands by: it stays
up (healthy and ready: a DaemonSet rollout is never stuck on a node that waits), registers no NRI
plugin, publishes no GPU object and no label, says which allocator in one log line and a Warning Event
on its Node, and looks again every `allocator_check_interval_s`. Then it takes over, once: it does not
give the node back by itself (containers may hold claims by then). An allocator that comes back after
that is reported (Event, and the GPU condition `GpuAllocatorConflict`), not acted on.
`--other-allocators ignore` takes over at once (a migration its operator manages).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from elasticgpu.agent import errors, node_checks
from elasticgpu.agent.kube import AgentKube
from elasticgpu.agent.settings import TakeOverSettings
from elasticgpu.api import node_handover

logger = logging.getLogger(__name__)

MODES = ("wait", "ignore")


def check_mode(settings: TakeOverSettings) -> None:
    """Raise `AgentError` for an --other-allocators that is not a mode."""
    if settings.other_allocators not in MODES:
        raise errors.AgentError(f"--other-allocators / ELASTICGPU_AGENT_OTHER_ALLOCATORS={settings.other_allocators!r}"
                                f" is not a mode; use one of {', '.join(MODES)}")  # fmt: skip


class TakeOver:
    """The check's state: `allowed` is set once the agent may take the node's GPUs (never cleared)."""

    def __init__(self, *, settings: TakeOverSettings, node_name: str, host_root: str, events_namespace: str,
                 clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self._settings = settings
        self._node = node_name
        self._host_root = host_root
        self._events_namespace = events_namespace
        self._clock = clock
        self._lock = threading.Lock()
        self._live: list[node_handover.LiveAllocator] = []
        self._said: tuple[str, ...] | None = None  # the signs last told (log + Event), so each change is told once
        self._checked = False  # a check has decided once
        self.allowed = threading.Event()

    @property
    def standing_by(self) -> bool:
        """True while the agent waits for another allocator to go (False before its first check: it does not
        know yet, and readiness says what it waits for then)."""
        return self._checked and not self.allowed.is_set()

    def live(self) -> list[node_handover.LiveAllocator]:
        """The other allocators seen at the last check."""
        with self._lock:
            return list(self._live)

    def look(self, node: dict[str, object]) -> list[node_handover.LiveAllocator]:
        """The other allocators live now: the Node's allocatable and kubelet's device-plugin folder."""
        folder = node_checks.under(self._host_root, self._settings.device_plugin_dir)
        return node_handover.from_node(node) + node_handover.from_sockets(
            node_checks.live_device_plugin_sockets(folder))

    def check(self, kube: AgentKube) -> None:
        """One check: read the Node, look, decide, tell what changed. Raises `KubeError` when the Node cannot be
        read (nothing decided: the agent keeps standing by until it can be)."""
        node = kube.read_node()
        live = self.look(node)
        with self._lock:
            self._live = live
        ignore = self._settings.other_allocators == "ignore"
        if not self.allowed.is_set() and (not live or ignore):
            why = ("no other GPU allocator is live here" if not live else
                   "--other-allocators ignore, beside " + "; ".join(sign.what for sign in live))
            if self._checked or live:  # it stood by, or takes over beside one: worth an Event; a plain start is not
                logger.info("node %s: taking over its GPUs (%s)", self._node, why)
                self._event(kube, node, "Normal", node_handover.EVENT_TAKING_OVER,
                            f"the elasticgpu agent takes this node's GPUs: {why}")
            else:
                logger.debug("node %s: taking over its GPUs (%s)", self._node, why)
            self.allowed.set()
            self._checked = True
            self._said = tuple(sign.what for sign in live)
            return
        self._checked = True
        signs = tuple(sign.what for sign in live)
        if signs == self._said:
            return
        self._said = signs
        if not live:
            logger.info("node %s: no other GPU allocator is live any more", self._node)
            return
        if self.allowed.is_set():
            line = (f"node {self._node}: another GPU allocator is live beside the elasticgpu agent ("
                    + "; ".join(signs) + "): both may hand out the same cards; stop it on this node"
                    f" ({node_handover.LABEL_DEVICE_PLUGIN_DEPLOY}=false with the GPU Operator) or hand the node"
                    f" back: kubectl egpu handover {self._node} --to device-plugin")
        else:
            line = node_handover.hand_over_line(self._node, live)
        logger.warning("%s", line)
        self._event(kube, node, "Warning", node_handover.EVENT_ALLOCATOR_LIVE, line)

    def _event(self, kube: AgentKube, node: dict[str, object], type_: str, reason: str, message: str) -> None:
        metadata = node.get("metadata")
        uid = metadata.get("uid") if isinstance(metadata, dict) else None
        try:
            kube.create_event(namespace=self._events_namespace,
                              involved={"apiVersion": "v1", "kind": "Node", "name": self._node, "uid": uid},
                              type_=type_, reason=reason, message=message[:1024],
                              now=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._clock())))  # fmt: skip
        except errors.KubeError as e:
            logger.warning("Event %s about Node %s not written: %s", reason, self._node, e)

    def run(self, kube: Callable[[], AgentKube | None], stop: threading.Event) -> None:
        """Check now, then every `allocator_check_interval_s`, until `stop`. Never dies."""
        failures = 0
        while not stop.is_set():
            client = kube()
            if client is None:
                stop.wait(0.5)  # the API client is not open yet (starting.py)
                continue
            try:
                self.check(client)
                failures = 0
                delay = self._settings.allocator_check_interval_s
            except Exception as e:
                failures += 1
                logger.warning("node %s: the check for other GPU allocators failed (%s); retrying", self._node, e)
                delay = min(self._settings.allocator_check_interval_s, 0.5 * 2**failures)
            stop.wait(delay)
