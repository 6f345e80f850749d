"""The NRI front: the agent's side of its NRI plugin, over the injection core.

The plugin (nri-plugin/main.go, run by supervising.py) relays NRI's events to `NriFront` on a
local unix socket, one JSON line each way; every decision is the core's (agent/injecting):

    synchronize  (the plugin registered: at its start, and again after the runtime restarted)
                 the containers the runtime has, with their environment -> the core's
                 reconcile (the start-up one, which rebuilds a ledger that replaced a corrupt
                 one, from these containers). Then every running container that its pod names a
                 claim for but that carries no elasticgpu.io/claim annotation was created while
                 no plugin was registered (NRI fails open): it runs without its cards, so it is
                 stopped (`evict`, off this call's path) with a Warning Event; kubelet restarts
                 it, this time through the plugin, with its cards (or refuses it, saying why).
    create       prepare_create (one pass: the request in, one edit out) -> the adjustment
                 (translating.adjustment); NRI names the container's id here, so the ledger row
                 is written `created` at once, with it, in the one durable write before the
                 answer (the container is listed first, for a reconcile in between). A refusal
                 answers {"error": message}: the runtime fails the CreateContainer with the
                 core's words, and kubelet shows them and retries, as through the CRI proxy (the
                 same Event, from the same core).
    stop         the container exited: it holds no card any more (card_sharing.holds_card)
    remove       the core's `removed` (the ledger row released). A creation that failed after
                 the plugin answered reaches here as a remove too (NRI undoes its create).

What is lost while the plugin or the agent is away is settled at the next synchronize: a row
of a container that is gone is released, a `started` row without a container is rolled back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socketserver
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import grpc

from elasticgpu.agent.injecting import hooks, injection
from elasticgpu.agent.injecting.cdi import UnresolvedDevice
from elasticgpu.agent.nri import translating

log = logging.getLogger(__name__)

UNINJECTED_REASON = "ClaimContainerWithoutCards"
"""The Warning Event of a claim container found running without its cards (created while NRI had no plugin)."""

_Container = hooks.RuntimeContainer
Evict = Callable[[hooks.RuntimeContainer, str], None]
"""Stop a container (the runtime's StopContainer; kubelet restarts it), given it and why."""


class NriFront:
    """The agent's side of the NRI plugin (see the module docstring)."""

    def __init__(self, *, hooks: hooks.ContainerHooks, view: injection.AgentView, cdi_dir: Path,
                 evict: Evict | None = None) -> None:
        """`hooks`: the core's (gated.GatedHooks in the agent); `view`: for the Events; `cdi_dir`: where
        the specs of our CDI devices are (resolved into device nodes); `evict`: how to stop a container
        (None: it is only reported)."""
        self._hooks = hooks
        self._view = view
        self._cdi_dir = cdi_dir
        self._evict = evict
        self._lock = threading.Lock()
        self._containers: dict[str, _Container] = {}
        self._attached = False
        self.synchronized = threading.Event()
        """Set once a synchronize was answered (the plugin is registered and the ledger settled)."""
        self.evicted: list[str] = []
        """Ids of the containers stopped for running without their cards (for tests and logs)."""

    def list_containers(self) -> list[hooks.RuntimeContainer]:
        """The runtime's containers as NRI reported them (synchronize, then the events)."""
        with self._lock:
            return list(self._containers.values())

    def handle(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """One request of the plugin -> its answer."""
        op = message.get("op")
        if op == "create":
            return self._create(message.get("pod") or {}, message.get("container") or {})
        if op == "synchronize":
            return self._synchronize(message.get("containers") or [], message.get("pods") or [])
        container = message.get("container") or {}
        if op == "stop":
            with self._lock:
                if (known := self._containers.get(container.get("id", ""))) is not None:
                    self._containers[known.id] = translating.runtime_container({**container, "state": 4})
            return {}
        if op == "remove":
            with self._lock:
                self._containers.pop(container.get("id", ""), None)
            self._hooks.removed(container.get("id", ""))
            return {}
        return {"error": f"elasticgpu agent: unknown request {op!r} from its NRI plugin (versions apart?)"}

    def _create(self, pod: Mapping[str, Any], container: Mapping[str, Any]) -> dict[str, Any]:
        request = translating.container_request(pod, container)
        container_id = container.get("id", "")
        # Listed before the core records its row (`created` at once, NRI naming the id): a reconcile in
        # between must find the container, or it would release the row of a container being created.
        with self._lock:
            self._containers[container_id] = translating.runtime_container(container)
        try:
            prepared = self._hooks.prepare_create(request)
        except hooks.Refused as refusal:
            self._forget(container_id)
            log.info("CreateContainer %s/%s refused: %s", request.pod, request.container, refusal.message)
            return {"error": refusal.message}
        except Exception:
            self._forget(container_id)
            log.exception("CreateContainer %s/%s: the injection hook failed", request.pod, request.container)
            return {"error": "elasticgpu agent: internal error while preparing this container; kubelet retries "
                             "(see the elasticgpu agent's log on this node)"}
        try:
            adjust = translating.adjustment(container, prepared.edit, self._cdi_dir)
        except UnresolvedDevice as e:
            self._hooks.create_failed(prepared, grpc.StatusCode.FAILED_PRECONDITION)
            self._forget(container_id)
            return {"error": f"pod {request.pod}, container {request.container!r}: the elasticgpu agent cannot "
                             f"give its devices ({e}); kubelet retries"}
        if prepared.edit is not None:
            with self._lock:
                self._containers[container_id] = translating.runtime_container(
                    {**container, "annotations": {**(container.get("annotations") or {}), **prepared.edit.annotations}})
        self._hooks.created(prepared, container_id)
        if prepared.details:
            log.info("CreateContainer %s/%s -> %s: %s", request.pod, request.container, container_id,
                     prepared.details)
        return {"adjust": adjust}

    def _forget(self, container_id: str) -> None:
        with self._lock:
            self._containers.pop(container_id, None)

    def _synchronize(self, containers: list[Mapping[str, Any]], pods: list[Mapping[str, Any]]) -> dict[str, Any]:
        listed = translating.runtime_containers(containers)
        with self._lock:
            self._containers = {c.id: c for c in listed}
        first = not self._attached
        if first:
            self._hooks.attach_runtime(self.list_containers)
            self._attached = True
        # The first synchronize is the start-up reconciliation: no create has reached this front yet, so
        # `started` rows are settled too (a kill -9 between the ledger write and the runtime's answer).
        self._hooks.reconcile(listed, starting=first)
        pods_by_id = {pod.get("id", ""): pod for pod in pods}
        uninjected = []
        for raw, container in zip(containers, listed, strict=True):
            pod = pods_by_id.get(raw.get("podSandboxId", ""))
            if pod is None or container.exited or injection.CLAIM_ANNOTATION in container.annotations:
                continue
            with contextlib.suppress(hooks.Refused):  # an annotation naming no claim: never created through us
                if injection.claim_of(translating.container_request(pod, raw)) is not None:
                    uninjected.append((container, translating.container_request(pod, raw)))
        if uninjected:
            threading.Thread(target=self._stop_uninjected, args=(uninjected,), name="nri-evict", daemon=True).start()
        self.synchronized.set()
        return {}

    def _stop_uninjected(self, found: list[tuple[hooks.RuntimeContainer, injection.ContainerRequest]]) -> None:
        for container, request in found:
            message = (f"pod {request.pod}, container {request.container!r} names an ElasticGPUClaim but was created "
                       "while the elasticgpu agent's NRI plugin was not registered (the runtime then creates "
                       "containers untouched), so it runs without its cards: it is stopped, and kubelet creates it "
                       "again with them")
            log.warning("%s (container %s)", message, container.id)
            self._view.warn(request.pod, UNINJECTED_REASON, message)
            if self._evict is None:
                continue
            try:
                self._evict(container, message)
                self.evicted.append(container.id)
            except Exception:
                log.exception("container %s could not be stopped; the next synchronize tries again", container.id)


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        for line in self.rfile:
            try:
                answer = self.server.front.handle(json.loads(line))
            except Exception as e:  # a bug of ours, or a line that is not JSON: the plugin decides (claim: refused)
                log.exception("request of the NRI plugin failed")
                answer = {"error": f"elasticgpu agent: internal error ({type(e).__name__}); kubelet retries"}
            self.wfile.write(json.dumps(answer, separators=(",", ":")).encode() + b"\n")


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, front: NriFront) -> None:
        self.front = front
        super().__init__(path, _Handler)


class FrontServer:
    """`NriFront` served on a unix socket (mode 0600, for the plugin the agent starts as itself)."""

    def __init__(self, front: NriFront, socket_path: Path) -> None:
        self.front = front
        self.socket_path = socket_path
        socket_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            socket_path.unlink()  # a socket of an agent before (kill -9) would refuse the bind
        old = os.umask(0o177)
        try:
            self._server = _Server(str(socket_path), front)
        finally:
            os.umask(old)
        self._thread = threading.Thread(target=self._server.serve_forever, name="nri-front", daemon=True)

    def start(self) -> FrontServer:
        """Serve in a thread."""
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and remove the socket."""
        self._server.shutdown()
        self._server.server_close()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
