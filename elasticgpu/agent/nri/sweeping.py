"""The sweep of the NRI front: running containers that the runtime created while no plugin was registered.

NRI fails open: while the agent's plugin is not registered (an agent restart or rollout, the plugin's
backoff, a runtime restart) the runtime creates containers untouched. What such a container got is
found at the next synchronize, and again at every resync, from the container as the runtime has it:

    names a claim, no elasticgpu.io/claim annotation      it runs without its cards: stopped
    no claim, not privileged, can reach a card            the image's NVIDIA_VISIBLE_DEVICES=all (or our
      (translating.sees_a_card), its namespace not one     device nodes): every card of the node: stopped
      the platform team gave the node's GPUs, and the
      agent keeps unclaimed containers from the cards
      (--neutralise-unclaimed, on by default)
    no claim, privileged                                  left alone, as at its creation (CNI, CSI, the
                                                           GPU Operator run so; a privileged container has
                                                           every device of the node whatever the env says)
    no claim, namespace label unreadable now              left for the next resync

Each is stopped (the runtime's StopContainer, through the agent's CRI channel) with a Warning Event;
kubelet restarts it, this time through the plugin, with its cards or with `void` (or refuses it,
saying why). A stop that fails (the channel not open yet: the agent is starting) is tried again with
backoff while the container runs, for up to `evict_for_s`, so the window is the agent's start, not
the next synchronize's.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from elasticgpu.agent.injecting import hooks, injection
from elasticgpu.agent.nri import translating

log = logging.getLogger(__name__)

UNINJECTED_REASON = "ClaimContainerWithoutCards"
"""The Warning Event of a claim container found running without its cards (created while NRI had no plugin)."""
UNCLAIMED_REASON = "UnclaimedContainerWithCards"
"""The Warning Event of a container without a claim found able to reach the node's cards (created while NRI
had no plugin)."""
EVICT_FOR_S = 300.0
"""How long a stop that fails is tried again (the next resync finds the container again after that)."""

Evict = Callable[[hooks.RuntimeContainer, str], None]
"""Stop a container (the runtime's StopContainer; kubelet restarts it), given it and why."""


class Sweeper:
    """Finds the containers to stop and stops them, off the caller's path (see the module docstring)."""

    def __init__(self, *, view: injection.AgentView, settings: injection.InjectionSettings, evict: Evict | None,
                 still_running: Callable[[str], bool], evict_for_s: float = EVICT_FOR_S) -> None:  # fmt: skip
        """`still_running`: whether the front still knows the container as running (a stop is not retried
        for one that is gone or exited)."""
        self._view = view
        self._settings = settings
        self._evict = evict
        self._still_running = still_running
        self._evict_for_s = evict_for_s
        self._lock = threading.Lock()
        self._stopping: set[str] = set()  # ids being stopped now: one thread each
        self.evicted: list[str] = []
        """Ids of the containers stopped (for tests and logs)."""

    def sweep(self, containers: list[Mapping[str, Any]], pods: Mapping[str, Mapping[str, Any]],
              card_nodes: Mapping[tuple[str, int, int], str]) -> None:  # fmt: skip
        """Stop, each in a thread of its own, the running `containers` (NRI's) that must not run as they are."""
        for raw in containers:
            pod = pods.get(raw.get("podSandboxId", ""))
            container = translating.runtime_container(raw)
            if pod is None or container.exited:
                continue
            found = self._why(pod, raw, container, card_nodes)
            if found is None:
                continue
            request, reason, message = found
            with self._lock:
                if container.id in self._stopping:
                    continue
                self._stopping.add(container.id)
            log.warning("%s (container %s)", message, container.id)
            self._view.warn(request.pod, reason, message)
            threading.Thread(target=self._stop, args=(container, message), name="nri-evict", daemon=True).start()

    def _why(self, pod: Mapping[str, Any], raw: Mapping[str, Any], container: hooks.RuntimeContainer,
             card_nodes: Mapping[tuple[str, int, int], str]) -> tuple[injection.ContainerRequest, str, str] | None:
        request = translating.container_request(pod, raw, card_nodes=card_nodes)
        try:
            claim = injection.claim_of(request)
        except hooks.Refused:
            return None  # an annotation naming no claim: never created through us, and no card given
        if claim is not None:
            if injection.CLAIM_ANNOTATION in container.annotations:
                return None
            return request, UNINJECTED_REASON, (
                f"pod {request.pod}, container {request.container!r} names an ElasticGPUClaim but was created while "
                "the elasticgpu agent's NRI plugin was not registered (the runtime then creates containers "
                "untouched), so it runs without its cards: it is stopped, and kubelet creates it again with them")
        if request.privileged or not self._settings.neutralise_unclaimed:
            return None
        if self._view.node_gpu_access(request.pod.namespace) is not False:
            return None  # the namespace may use the node's GPUs, or cannot be read now (the next resync)
        if not translating.sees_a_card(raw, card_nodes):
            return None
        return request, UNCLAIMED_REASON, (
            f"pod {request.pod}, container {request.container!r} uses no ElasticGPUClaim but can reach the node's "
            "cards (its NVIDIA_VISIBLE_DEVICES, or the agent's device nodes): it was created while the elasticgpu "
            "agent's NRI plugin was not registered (the runtime then creates containers untouched), so it is "
            "stopped, and kubelet creates it again without them")

    def _stop(self, container: hooks.RuntimeContainer, message: str) -> None:
        try:
            if self._evict is None:
                return
            deadline = time.monotonic() + self._evict_for_s
            wait = 0.2
            while True:
                try:
                    self._evict(container, message)
                    self.evicted.append(container.id)
                    return
                except Exception as e:
                    if not self._still_running(container.id) or time.monotonic() + wait > deadline:
                        log.warning("container %s could not be stopped (%s); the next resync tries again",
                                    container.id, e)
                        return
                    log.info("container %s could not be stopped yet (%s); trying again in %.1f s",
                             container.id, e, wait)
                time.sleep(wait)
                wait = min(wait * 2, 5.0)
        finally:
            with self._lock, contextlib.suppress(KeyError):
                self._stopping.remove(container.id)
