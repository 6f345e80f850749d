"""The NRI front: the agent's side of its NRI plugin, over the injection core.

The plugin (nri-plugin/main.go, run by supervising.py) relays NRI's events to `NriFront` on a
local unix socket, one JSON line each way; every decision is the core's (agent/injecting):

    synchronize  (the plugin registered: at its start, and again after the runtime restarted)
                 the containers the runtime has, with their environment, whole (the plugin's NRI
                 stub joins a Synchronize the runtime split past ttrpc's 4 MiB, containerd/nri#111,
                 so the ledger is never settled against a part). It is answered at once: the
                 runtime gives the plugin 2 s for all of it (plugin_request_timeout), and what
                 follows may take longer (MPS daemons stopped, folders removed); `synchronized`
                 is set once it is done, and claims are refused as retryable until then (the
                 core's gate). Then, off the answer's path:
                   - the core's reconcile (the start-up one, which rebuilds a ledger that replaced a
                     corrupt one, from these containers);
                   - the sweep (sweeping.py): every running container that names a claim but
                     carries no elasticgpu.io/claim annotation, and every running container without
                     a claim that can reach a card (its NVIDIA_VISIBLE_DEVICES, our device nodes),
                     was created while no plugin was registered (NRI fails open): it is stopped with
                     a Warning Event, retried until the runtime's channel answers; kubelet restarts
                     it, this time through the plugin. Privileged containers without a claim (CNI,
                     CSI, the GPU Operator) and namespaces the platform team gave the node's GPUs
                     (elasticgpu.io/node-gpu-access) are left alone, as at their creation.
    create       prepare_create (one pass: the request in, one edit out) -> the adjustment
                 (translating.adjustment); NRI names the container's id here, so the ledger row
                 is written `created` at once, with it, in the one durable write before the
                 answer (the container is listed first, for a reconcile in between). A refusal
                 answers {"error": message}: the runtime fails the CreateContainer with the
                 core's words, and kubelet shows them and retries, as through the CRI proxy (the
                 same Event, from the same core). An edit NRI cannot carry out (our devices the
                 runtime already added, a key named twice: translating.NotAdjustable) is refused
                 too, with a Warning Event that says what to change.
    stop         the container exited: it holds no card any more (card_sharing.holds_card)
    remove       the core's `removed` (the ledger row released). A creation that failed after
                 the plugin answered reaches here as a remove too (NRI undoes its create).
    resync       (the agent, every minute: no plugin request) the runtime's containers as its CRI
                 lists them replace what the events said (a lost stop or remove event would keep
                 a row open and its card counted), then the core's reconcile and the sweep again.

What is lost while the plugin or the agent is away is settled at the next synchronize: a row
of a container that is gone is released, a `started` row without a container is rolled back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socketserver
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc

from elasticgpu.agent import private_socket
from elasticgpu.agent.injecting import cdi, hooks, injection
from elasticgpu.agent.nri import sweeping, translating

log = logging.getLogger(__name__)

UNINJECTED_REASON = sweeping.UNINJECTED_REASON
NOT_ADJUSTABLE_REASON = "NotAdjustableThroughNri"
"""The Warning Event of a container refused because NRI cannot carry out the agent's edit on it."""
CREATE_GRACE_S = 120.0
"""How long a container answered at its CreateContainer counts as present while the runtime has not listed it
yet (a resync between the answer and the runtime's creation must not release its row); once listed, its
absence from a later listing means it is gone."""

_Container = hooks.RuntimeContainer
Evict = sweeping.Evict


class NriFront:
    """The agent's side of the NRI plugin (see the module docstring)."""

    def __init__(self, *, hooks: hooks.ContainerHooks, view: injection.AgentView, cdi_dir: Path,
                 evict: Evict | None = None,
                 settings: injection.InjectionSettings | None = None,
                 evict_for_s: float = sweeping.EVICT_FOR_S) -> None:  # fmt: skip
        """`hooks`: the core's (gated.GatedHooks in the agent); `view`: for the Events; `cdi_dir`: where
        the specs of our CDI devices are (resolved into device nodes); `evict`: how to stop a container
        (None: it is only reported); `settings`: the core's (whether containers without a claim are kept
        from the cards); `evict_for_s`: how long a stop that fails is tried again."""
        self._hooks = hooks
        self._view = view
        self._cdi_dir = cdi_dir
        self._lock = threading.Lock()
        self._containers: dict[str, _Container] = {}
        self._raw: dict[str, Mapping[str, Any]] = {}  # NRI's containers, for the sweep
        self._pods: dict[str, Mapping[str, Any]] = {}  # NRI's pod sandboxes by id
        self._answered: dict[str, float] = {}  # container id -> when its create was answered (monotonic)
        self._attached = False
        self._settling = threading.Lock()  # one reconcile and sweep at a time
        self._sweeper = sweeping.Sweeper(
            view=view, settings=settings or injection.InjectionSettings(), evict=evict, evict_for_s=evict_for_s,
            still_running=self._running)
        self.synchronized = threading.Event()
        """Set once a synchronize was answered and settled (the plugin is registered and the ledger settled)."""
        self.synchronizations = 0
        """How many synchronizes were settled (for tests and logs: each registration of the plugin is one)."""

    @property
    def evicted(self) -> list[str]:
        """Ids of the containers stopped for running without their cards or with cards they may not have."""
        return self._sweeper.evicted

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
                    self._raw[known.id] = {**container, "state": 4}
            return {}
        if op == "remove":
            self._forget(container.get("id", ""))
            self._hooks.removed(container.get("id", ""))
            return {}
        return {"error": f"elasticgpu agent: unknown request {op!r} from its NRI plugin (versions apart?)"}

    def _card_nodes(self) -> dict[tuple[str, int, int], str]:
        return cdi.card_nodes(self._cdi_dir)

    def _create(self, pod: Mapping[str, Any], container: Mapping[str, Any]) -> dict[str, Any]:
        request = translating.container_request(pod, container, card_nodes=self._card_nodes())
        container_id = container.get("id", "")
        # Listed before the core records its row (`created` at once, NRI naming the id): a reconcile in
        # between must find the container, or it would release the row of a container being created.
        with self._lock:
            self._containers[container_id] = translating.runtime_container(container)
            self._raw[container_id] = container
            self._answered[container_id] = time.monotonic()
            if pod.get("id"):
                self._pods[pod["id"]] = pod
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
            adjust = translating.adjustment(container, prepared.edit, self._cdi_dir, request=request)
        except cdi.UnresolvedDevice as e:
            self._hooks.create_failed(prepared, grpc.StatusCode.FAILED_PRECONDITION)
            self._forget(container_id)
            return {"error": f"pod {request.pod}, container {request.container!r}: the elasticgpu agent cannot "
                             f"give its devices ({e}); kubelet retries"}
        except translating.NotAdjustable as e:
            self._hooks.create_failed(prepared, grpc.StatusCode.FAILED_PRECONDITION)
            self._forget(container_id)
            message = f"pod {request.pod}, container {request.container!r}: {e.message}"
            log.info("CreateContainer refused: %s", message)
            self._view.warn(request.pod, NOT_ADJUSTABLE_REASON, message)
            return {"error": message}
        if prepared.edit is not None:
            with self._lock:
                self._containers[container_id] = translating.runtime_container(
                    {**container, "annotations": {**(container.get("annotations") or {}), **prepared.edit.annotations}})
                self._raw[container_id] = {**container, "annotations": {
                    **(container.get("annotations") or {}), **prepared.edit.annotations}}
        self._hooks.created(prepared, container_id)
        if prepared.details:
            log.info("CreateContainer %s/%s -> %s: %s", request.pod, request.container, container_id,
                     prepared.details)
        return {"adjust": adjust}

    def _forget(self, container_id: str) -> None:
        with self._lock:
            self._containers.pop(container_id, None)
            self._raw.pop(container_id, None)
            self._answered.pop(container_id, None)

    def _running(self, container_id: str) -> bool:
        with self._lock:
            known = self._containers.get(container_id)
        return known is not None and not known.exited

    def _synchronize(self, containers: list[Mapping[str, Any]], pods: list[Mapping[str, Any]]) -> dict[str, Any]:
        listed = translating.runtime_containers(containers)
        with self._lock:
            self._containers = {c.id: c for c in listed}
            self._raw = {c.get("id", ""): c for c in containers}
            self._pods = {pod.get("id", ""): pod for pod in pods}
            self._answered.clear()
        first = not self._attached
        if first:
            self._hooks.attach_runtime(self.list_containers)
            self._attached = True
        # Answered now, settled after: the runtime's deadline for the whole Synchronize is 2 s.
        threading.Thread(target=self._settle, kwargs={"starting": first, "synchronizing": True},
                         name="nri-synchronize", daemon=True).start()
        return {}

    def resync(self, listed: Sequence[hooks.RuntimeContainer] | None = None) -> None:
        """The periodic settling (see the module docstring): `listed`, the runtime's containers as its CRI lists
        them, replaces what the events said first (None: the front's own listing is kept). Nothing before the
        first synchronize."""
        if not self.synchronized.is_set():
            return
        if listed is not None:
            self._refresh(listed)
        self._settle(starting=False, synchronizing=False)

    def _refresh(self, listed: Sequence[hooks.RuntimeContainer]) -> None:
        by_id = {c.id: c for c in listed}
        now = time.monotonic()
        with self._lock:
            for container_id, known in list(self._containers.items()):
                found = by_id.get(container_id)
                if found is None:
                    answered = self._answered.get(container_id)
                    if answered is not None and now - answered < CREATE_GRACE_S:
                        continue  # answered, not created yet: its row must stay
                    log.info("container %s is gone though no remove event said so; forgotten", container_id)
                    self._containers.pop(container_id, None)
                    self._raw.pop(container_id, None)
                    self._answered.pop(container_id, None)
                elif found.exited and not known.exited:
                    log.info("container %s has exited though no stop event said so", container_id)
                    self._containers[container_id] = translating.runtime_container(
                        {**self._raw.get(container_id, {"id": container_id}), "state": 4})
                    if container_id in self._raw:
                        self._raw[container_id] = {**self._raw[container_id], "state": 4}
            for container_id, found in by_id.items():
                self._answered.pop(container_id, None)  # the runtime has it: its absence will mean it is gone
                if container_id not in self._containers:
                    self._containers[container_id] = found  # created while no event reached us
            self._answered = {k: v for k, v in self._answered.items() if now - v < CREATE_GRACE_S}

    def _settle(self, *, starting: bool, synchronizing: bool) -> None:
        with self._settling:
            # The sweep first: it needs no ledger, and what it stops runs with every card (or without its own).
            with self._lock:
                raw, pods = list(self._raw.values()), dict(self._pods)
            self._sweeper.sweep(raw, pods, self._card_nodes())
            try:
                # The first synchronize is the start-up reconciliation: no create has reached this front yet,
                # so `started` rows are settled too (a kill -9 between the ledger write and the runtime's answer).
                self._hooks.reconcile(self.list_containers(), starting=starting)
            except Exception:
                log.exception("the reconciliation of the ledger with the runtime's containers failed; the next "
                              "resync tries again")
            if synchronizing:
                self.synchronizations += 1
                self.synchronized.set()


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
        with private_socket.binding(socket_path) as staged:  # never open to others, without a process-wide umask
            self._server = _Server(str(staged), front)
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
