"""The CRI proxy between kubelet and the container runtime: the agent's only runtime-socket user.

kubelet is pointed at our unix socket (`--container-runtime-endpoint`, mode 0600); every call of
RuntimeService and ImageService is forwarded to the real runtime's socket (containerd, CRI-O)
as raw bytes, without decoding, so fields and methods newer than our proto pass untouched:

    known unary method     -> unary raw forward (the fast path: Version, ListContainers, ...)
    known server stream    -> stream forward (GetContainerEvents, ...)
    anything else          -> stream-stream raw forward: a unary call is a stream of one message
                              each way on the wire, so this carries a method of any cardinality
                              that is newer than our proto
    CreateContainer        -> decoded, given to hooks.prepare_create (injection, ledger), forwarded
    RemoveContainer        -> forwarded, then hooks.removed(container id)

Streaming-URL calls (Exec, Attach, PortForward) are unary: the runtime's answer names its own
streaming server, which kubelet then reaches directly.

Two thread pools, so that long calls never starve short ones. A call holds its thread until the
runtime answers; with one pool, 40 concurrent `ExecSync sleep 4` (exec probes) held all 32
threads and a `Version` waited 3.8 s (issue 15). Calls that wait on something outside the
runtime's own bookkeeping (`LONG_METHODS`: a process in the container, a registry, a grace
period, CNI, an open stream; and every method not in our proto, whose length we cannot know) run
in the `long_workers` pool; every other call (status, lists, create, start, ...) in the `workers`
pool, which long calls therefore never occupy. grpc picks the pool per method handler
(`experimental_thread_pool`, read by grpc's sync server since 1.38): one server, one socket, no
decoding. An asyncio server would need no pools at all, but the hooks (ledger writes, API
reads) are blocking code and would run in a pool anyway; two pools keep the proxy one simple
model, and a thread blocked on a socket costs only its stack.

Failures of ours never stop a pod that uses no GPU: only CreateContainer runs our code, and
the hooks decide (a refusal is the gRPC status the hook chose; an unexpected exception in a
hook is reported as UNAVAILABLE, which kubelet retries). Errors of the runtime are passed back
with their code, text and trailing metadata.
"""

from __future__ import annotations

import contextlib
import json
import logging
import stat
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from elasticgpu.agent import errors, private_socket
from elasticgpu.agent.cri import api, translating
from elasticgpu.agent.injecting import hooks, injection
from elasticgpu.agent.repeated_failures import RepeatedFailure

log = logging.getLogger(__name__)

CREATE_CONTAINER = api.method_path(api.RUNTIME_SERVICE, "CreateContainer")
REMOVE_CONTAINER = api.method_path(api.RUNTIME_SERVICE, "RemoveContainer")
REMOVE_POD_SANDBOX = api.method_path(api.RUNTIME_SERVICE, "RemovePodSandbox")
LIST_CONTAINERS = api.method_path(api.RUNTIME_SERVICE, "ListContainers")
CONTAINER_STATUS = api.method_path(api.RUNTIME_SERVICE, "ContainerStatus")
STOP_CONTAINER = api.method_path(api.RUNTIME_SERVICE, "StopContainer")
REMOVE_CONTAINER = api.method_path(api.RUNTIME_SERVICE, "RemoveContainer")
INTERCEPTED_METHODS = frozenset({CREATE_CONTAINER, REMOVE_CONTAINER, REMOVE_POD_SANDBOX})
LONG_METHODS = frozenset(
    {api.method_path(api.RUNTIME_SERVICE, name) for name in (
        "ExecSync",  # runs a command in the container: as long as the command (exec probes, kubectl exec)
        "Exec", "Attach", "PortForward",  # unary, but the runtime prepares a stream first
        "GetContainerEvents",  # a stream kubelet keeps open for good
        "StopContainer", "StopPodSandbox",  # wait for the grace period (up to terminationGracePeriodSeconds)
        "RunPodSandbox", "RemovePodSandbox",  # CNI set-up and tear-down, mounts
        "CheckpointContainer",  # writes the container's memory to disk
    )}
    | {api.method_path(api.IMAGE_SERVICE, name) for name in ("PullImage", "RemoveImage")}  # a registry; a disk
)  # fmt: skip
"""Methods served by the long-call pool (see the module docstring); methods not in our proto too."""
"""The methods that run the hooks; every other one is forwarded untouched (the CRI front,
front.py, sends only these to the proxy)."""
# Headers grpc sets itself on every call; forwarding them would duplicate or contradict them.
_OWN_HEADERS = frozenset({"user-agent", "grpc-accept-encoding", "grpc-encoding", "grpc-timeout", "te", "content-type"})
_MAX_CACHED_METHODS = 512
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""The largest CRI message carried either way. kubelet's own limit is 16 MiB; ListContainers on
a busy node can pass 4 MiB, grpc's default."""


@dataclass(frozen=True, kw_only=True)
class ProxySettings:
    """How the proxy listens and where it forwards."""

    listen: Path
    """Our socket, kubelet's runtime endpoint (e.g. /var/run/elasticgpu/cri.sock); mode 0600."""
    upstream: str
    """The runtime's socket, as a path or `unix://` target (e.g. /run/containerd/containerd.sock)."""
    workers: int = 32
    """Threads serving short calls (status, lists, create, start, ...). kubelet calls concurrently
    (PLEG relists, pod workers); long calls never take these threads."""
    long_workers: int = 256
    """Threads serving `LONG_METHODS` (exec probes, image pulls, stops during a drain, the events
    stream). Started on demand; a call beyond them waits for one, without delaying short calls."""
    default_timeout_s: float | None = None
    """Upstream timeout for a call that carries no deadline; None: none either. kubelet sets a
    deadline on every call except PullImage, whose large images may take many minutes."""
    list_timeout_s: float = 10.0
    """Timeout of our own ListContainers calls (reconciliation)."""
    reconcile_backoff_s: tuple[float, float] = (0.2, 10.0)
    """First and longest wait between attempts of the start-up reconciliation (doubling)."""
    reconcile_period_s: float = 60.0
    """Seconds between reconciliations after the first: they settle what a lost ledger write
    or a CreateContainer whose answer never came left open. One ListContainers each."""


def _target(upstream: str) -> str:
    return upstream if "://" in upstream or upstream.startswith("unix:") else f"unix://{upstream}"


class _Forwarder(grpc.GenericRpcHandler):
    """Routes each method to its forwarding handler (built once per method, then cached)."""

    def __init__(
        self,
        channel: grpc.Channel,
        hooks: hooks.ContainerHooks,
        settings: ProxySettings,
        unary_methods: frozenset[str],
        streaming_methods: frozenset[str],
        long_pool: futures.ThreadPoolExecutor,
    ) -> None:
        self._long_pool = long_pool
        self._channel = channel
        self._hooks = hooks
        self._settings = settings
        self._unary = unary_methods
        self._streaming = streaming_methods
        self._handlers: dict[str, grpc.RpcMethodHandler[bytes, bytes]] = {}
        self._list: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(LIST_CONTAINERS)
        self._status: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(CONTAINER_STATUS)
        self._stop: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(STOP_CONTAINER)
        self._remove: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(REMOVE_CONTAINER)

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[bytes, bytes] | None:
        method = handler_call_details.method
        handler = self._handlers.get(method)
        if handler is None:
            handler = self._build(method)
            if len(self._handlers) < _MAX_CACHED_METHODS:  # a client naming endless methods grows nothing
                self._handlers[method] = handler  # a race builds it twice; both are equal
        return handler

    def _build(self, method: str) -> grpc.RpcMethodHandler[bytes, bytes]:
        handler = self._build_handler(method)
        known = method in self._unary or method in self._streaming or method in INTERCEPTED_METHODS
        if method in LONG_METHODS or not known:
            # grpc's sync server runs a handler in the pool its behavior names, else in the server's.
            for behavior in (handler.unary_unary, handler.unary_stream, handler.stream_stream):
                if behavior is not None:
                    behavior.experimental_thread_pool = self._long_pool  # type: ignore[union-attr]
        return handler

    def _build_handler(self, method: str) -> grpc.RpcMethodHandler[bytes, bytes]:
        if method == CREATE_CONTAINER:
            upstream: grpc.UnaryUnaryMultiCallable[bytes, bytes] = self._channel.unary_unary(method)
            return grpc.unary_unary_rpc_method_handler(self._create_container(upstream))
        if method == REMOVE_CONTAINER:
            return grpc.unary_unary_rpc_method_handler(self._remove_container(self._channel.unary_unary(method)))
        if method == REMOVE_POD_SANDBOX:
            return grpc.unary_unary_rpc_method_handler(self._remove_pod_sandbox(self._channel.unary_unary(method)))
        if method in self._unary:
            return grpc.unary_unary_rpc_method_handler(self._unary_forward(self._channel.unary_unary(method)))
        if method in self._streaming:
            return grpc.unary_stream_rpc_method_handler(self._stream_forward(self._channel.unary_stream(method)))
        log.info("CRI method %s is not in our proto; forwarding it as raw bytes", method)
        return grpc.stream_stream_rpc_method_handler(self._raw_forward(self._channel.stream_stream(method)))

    # --- call plumbing ---

    def _call_options(self, context: grpc.ServicerContext) -> dict[str, Any]:
        remaining = context.time_remaining()
        # grpc reports "no deadline" as None or as a huge number, depending on the version.
        timeout = self._settings.default_timeout_s if remaining is None or remaining > 1e8 else max(remaining, 0.001)
        metadata = tuple(
            (key, value)
            for key, value in context.invocation_metadata()
            if key not in _OWN_HEADERS and not key.startswith(":")
        )
        return {"timeout": timeout, "metadata": metadata or None}

    @staticmethod
    def _pass_error(error: grpc.RpcError, context: grpc.ServicerContext) -> None:
        """Give the caller the runtime's own status (code, text, trailing metadata)."""
        call: Any = error  # a grpc.Call as well as an RpcError
        with contextlib.suppress(Exception):
            trailing = call.trailing_metadata()
            if trailing:
                context.set_trailing_metadata(trailing)
        context.abort(call.code(), call.details() or "")

    def _unary_forward(
        self, upstream: grpc.UnaryUnaryMultiCallable[bytes, bytes]
    ) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        def forward(request: bytes, context: grpc.ServicerContext) -> bytes:
            try:
                answer: bytes = upstream(request, **self._call_options(context))
            except grpc.RpcError as e:
                self._pass_error(e, context)
                raise  # not reached: abort raises
            return answer

        return forward

    def _stream_forward(
        self, upstream: grpc.UnaryStreamMultiCallable[bytes, bytes]
    ) -> Callable[[bytes, grpc.ServicerContext], Iterator[bytes]]:
        def forward(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
            call = upstream(request, **self._call_options(context))
            # The caller went away: end the upstream stream too, not only ours.
            context.add_callback(lambda: _cancel(call))
            try:
                yield from call
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.CANCELLED or context.is_active():
                    self._pass_error(e, context)

        return forward

    def _raw_forward(
        self, upstream: grpc.StreamStreamMultiCallable[bytes, bytes]
    ) -> Callable[[Iterator[bytes], grpc.ServicerContext], Iterator[bytes]]:
        def forward(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
            call = upstream(requests, **self._call_options(context))
            context.add_callback(lambda: _cancel(call))
            try:
                yield from call
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.CANCELLED or context.is_active():
                    self._pass_error(e, context)

        return forward

    # --- the two calls we look into ---

    def _create_container(
        self, upstream: grpc.UnaryUnaryMultiCallable[bytes, bytes]
    ) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        def create(raw: bytes, context: grpc.ServicerContext) -> bytes:
            request = api.pb.CreateContainerRequest.FromString(raw)
            try:
                # One pass through the core: the request in plain values, one edit back.
                prepared = self._hooks.prepare_create(translating.container_request(request))
                changed = translating.apply(prepared.edit, request)
            except hooks.Refused as refusal:
                log.info("CreateContainer %s refused: %s", _describe(request), refusal.message)
                context.abort(refusal.code, refusal.message)
            except Exception:
                # A bug of ours must not look like the user's fault, and kubelet retries UNAVAILABLE.
                log.exception("CreateContainer %s: the injection hook failed", _describe(request))
                context.abort(
                    grpc.StatusCode.UNAVAILABLE,
                    "elasticgpu agent: internal error while preparing this container; kubelet retries "
                    "(see the elasticgpu agent's log on this node)",
                )
            body = request.SerializeToString() if changed else raw
            try:
                answer: bytes = upstream(body, **self._call_options(context))
            except grpc.RpcError as e:
                code = e.code() if isinstance(e, grpc.Call) else grpc.StatusCode.UNKNOWN
                self._after(lambda p: self._hooks.create_failed(p, code), prepared)
                self._pass_error(e, context)
                raise
            container_id = api.pb.CreateContainerResponse.FromString(answer).container_id
            if prepared.edit is not None and (wrong := self._shadowed(container_id, prepared.edit)):
                message = (f"elasticgpu agent: the container's image sets {', '.join(wrong)} in its ENV, and the"
                           " runtime puts the image's entries before the agent's, where a CUDA process reads them:"
                           " use an image that does not set these variables (the agent sets them from the claim)")
                log.info("CreateContainer %s -> %s refused: %s", _describe(request), container_id, message)
                self._remove_quietly(container_id)
                self._after(lambda p: self._hooks.create_failed(p, grpc.StatusCode.FAILED_PRECONDITION), prepared)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, message)
            self._after(lambda p: self._hooks.created(p, container_id), prepared)
            if prepared.details:
                log.info("CreateContainer %s -> %s: %s", _describe(request), container_id, prepared.details)
            return answer

        return create

    def _remove_container(
        self, upstream: grpc.UnaryUnaryMultiCallable[bytes, bytes]
    ) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        forward = self._unary_forward(upstream)

        def remove(raw: bytes, context: grpc.ServicerContext) -> bytes:
            answer = forward(raw, context)
            container_id = api.pb.RemoveContainerRequest.FromString(raw).container_id
            self._after(lambda _: self._hooks.removed(container_id), None)
            return answer

        return remove

    def _remove_pod_sandbox(
        self, upstream: grpc.UnaryUnaryMultiCallable[bytes, bytes]
    ) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        forward = self._unary_forward(upstream)

        def remove(raw: bytes, context: grpc.ServicerContext) -> bytes:
            answer = forward(raw, context)
            self._after(lambda _: self._hooks.reconcile(self.list_containers(), starting=False), None)
            return answer

        return remove

    def list_containers(self) -> list[hooks.RuntimeContainer]:
        """The runtime's containers in the core's plain values, for the hooks' reconciliation."""
        answer = self._list(api.pb.ListContainersRequest().SerializeToString(), timeout=self._settings.list_timeout_s)
        return [translating.runtime_container(c) for c in api.pb.ListContainersResponse.FromString(answer).containers]

    def container_info(self, container_id: str) -> dict[str, Any]:
        """The runtime's verbose status of one container (containerd: the `info` JSON with the
        container's `config` and `runtimeSpec`), for rebuilding a ledger from the runtime."""
        request = api.pb.ContainerStatusRequest(container_id=container_id, verbose=True).SerializeToString()
        answer = api.pb.ContainerStatusResponse.FromString(
            self._status(request, timeout=self._settings.list_timeout_s))
        info: dict[str, Any] = {}
        for value in answer.info.values():
            with contextlib.suppress(ValueError):
                parsed = json.loads(value)
                if isinstance(parsed, dict):
                    info.update(parsed)
        return info

    def _shadowed(self, container_id: str, edit: injection.ContainerEdit) -> list[str]:
        """What a reader of the created container's env takes instead of the agent's value (translating.shadowed)."""
        if not any(k.startswith(translating.AGENT_KEY_PREFIXES) or k == injection.ENV_VISIBLE_DEVICES
                   for k, _ in edit.envs):
            return []
        try:
            return translating.shadowed(self.container_info(container_id), edit)
        except grpc.RpcError as e:  # not read: the container stays, as before this check
            log.warning("CreateContainer -> %s: its spec could not be read to check its env: %s", container_id, e)
            return []

    def _remove_quietly(self, container_id: str) -> None:
        """Remove a container this proxy refuses after the runtime made it (kubelet never learns its id)."""
        request = api.pb.RemoveContainerRequest(container_id=container_id).SerializeToString()
        try:
            self._remove(request, timeout=self._settings.list_timeout_s)
        except grpc.RpcError as e:  # the next reconcile of the hooks finds it (no row is kept for it)
            log.warning("removing refused container %s failed: %s", container_id, e)

    def stop_container(self, container_id: str, *, timeout_s: int) -> None:
        """Stop one container as kubelet would (issue 25, over-limit policing): the runtime sends
        the stop signal, waits `timeout_s`, then kills; kubelet sees it exit and applies the pod's
        restart policy. Raises `ContainerNotFound` (removed meanwhile) or `RuntimeCallFailed`."""
        request = api.pb.StopContainerRequest(container_id=container_id, timeout=timeout_s).SerializeToString()
        try:
            # The runtime answers once the container exited: its timeout plus the call's own.
            self._stop(request, timeout=timeout_s + self._settings.list_timeout_s)
        except grpc.RpcError as e:
            code = e.code() if isinstance(e, grpc.Call) else None
            name = code.name if code is not None else ""
            text = e.details() if isinstance(e, grpc.Call) else str(e)
            kind = errors.ContainerNotFound if code == grpc.StatusCode.NOT_FOUND else errors.RuntimeCallFailed
            raise kind(f"StopContainer {container_id} at {self._settings.upstream}: {name} {text}; the runtime did"
                       " not stop it (the next pass tries again)", code=name) from None

    @staticmethod
    def _after(step: Callable[[Any], None], prepared: Any) -> None:
        # The runtime already acted: a failure to record it must not turn its answer into an
        # error (kubelet would retry a call that succeeded). The agent's reconciliation with
        # ListContainers repairs what was not recorded.
        try:
            step(prepared)
        except Exception:
            log.exception("recording the runtime's answer failed; the next reconciliation repairs it")


def _cancel(call: grpc.RpcContext) -> None:
    call.cancel()


def _describe(request: Any) -> str:
    labels = request.config.labels
    return "{}/{} container {}".format(
        labels.get("io.kubernetes.pod.namespace", request.sandbox_config.metadata.namespace),
        labels.get("io.kubernetes.pod.name", request.sandbox_config.metadata.name),
        request.config.metadata.name,
    )


class CriProxy:
    """The proxy server. `start()` binds the socket (mode 0600) and serves; `stop()` ends it."""

    def __init__(
        self,
        settings: ProxySettings,
        *,
        container_hooks: hooks.ContainerHooks | None = None,
        unary_methods: frozenset[str] | None = None,
    ) -> None:
        """`unary_methods` defaults to every unary method of our proto; a smaller set makes the
        others go the unknown-method path (tests use it to exercise that path on a real call)."""
        self.settings = settings
        options = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ]
        # A restarted runtime is reached again within a second (grpc's default reconnect
        # backoff grows to 2 minutes, during which every kubelet call would fail).
        upstream_options = [
            *options,
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
        ]
        self._channel = grpc.insecure_channel(_target(settings.upstream), options=upstream_options)
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=settings.workers, thread_name_prefix="cri-short"), options=options
        )
        self._long_pool = futures.ThreadPoolExecutor(max_workers=settings.long_workers, thread_name_prefix="cri-long")
        self._hooks = container_hooks or hooks.PassThrough()
        self._forwarder = _Forwarder(
            self._channel,
            self._hooks,
            settings,
            unary_methods if unary_methods is not None else api.unary_methods(),
            api.server_streaming_methods(),
            self._long_pool,
        )
        self._server.add_generic_rpc_handlers((self._forwarder,))
        self._stopping = threading.Event()
        self._reconciler: threading.Thread | None = None
        self.reconciled = threading.Event()
        """Set once the start-up reconciliation succeeded."""

    def start(self) -> None:
        """Bind the socket, readable and writable by its owner only, and start serving.

        On failure nothing is left behind (no server, no channel, no socket of ours); a path
        that is not a socket is never removed."""
        path = self.settings.listen
        bound = False
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists() or path.is_symlink():
                if not stat.S_ISSOCK(path.lstat().st_mode):
                    raise FileExistsError(f"{path} exists and is not a socket; choose another listen path or remove it")
                path.unlink()  # a socket left by an earlier run
            # Never, even for an instant, open to others (and no process-wide umask: private_socket).
            with private_socket.binding(path) as staged:
                if not self._server.add_insecure_port(f"unix://{staged}"):
                    raise OSError(f"cannot listen on {path}")
            bound = True
            self._hooks.attach_runtime(self._forwarder.list_containers)
            self._server.start()
        except BaseException:
            self._server.stop(None)
            self._long_pool.shutdown(wait=False)
            self._channel.close()
            if bound:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            raise
        log.info("CRI proxy listening on %s, forwarding to %s", path, self.settings.upstream)
        self._reconciler = threading.Thread(target=self._reconcile, name="cri-reconcile", daemon=True)
        self._reconciler.start()

    def _reconcile(self) -> None:
        """Reconcile the hooks with the runtime once, retrying with backoff until it works, then
        every `reconcile_period_s`.

        Serving starts at once (kubelet needs the socket for every pod); the hooks refuse
        claims as retryable until they are reconciled, so no new half-done record is made
        while old ones are being settled."""
        delay, longest = self.settings.reconcile_backoff_s
        said = RepeatedFailure(f"reconciling with the runtime at {self.settings.upstream}", log)
        while not self._stopping.is_set():
            try:
                self._hooks.reconcile(self._forwarder.list_containers(), starting=True)
            except Exception as e:
                said.failed(e, retry_in_s=delay)  # one line while the runtime is down, not one per try
                self._stopping.wait(delay)
                delay = min(delay * 2, longest)
                continue
            said.worked()
            self.reconciled.set()
            break
        while not self._stopping.wait(self.settings.reconcile_period_s):
            try:
                self._hooks.reconcile(self._forwarder.list_containers(), starting=False)
                said.worked()
            except Exception as e:
                said.failed(e, retry_in_s=self.settings.reconcile_period_s)

    def list_containers(self) -> list[hooks.RuntimeContainer]:
        """The runtime's containers (api.pb.Container), asked through the proxy's upstream channel."""
        return self._forwarder.list_containers()

    def container_info(self, container_id: str) -> dict[str, Any]:
        """The runtime's verbose status of one container (see `_Forwarder.container_info`)."""
        return self._forwarder.container_info(container_id)

    def container_env(self, container_id: str) -> dict[str, str]:
        """The environment of one container, from its verbose status (for rebuilding a ledger)."""
        return translating.container_env(self._forwarder.container_info(container_id))

    def stop_container(self, container_id: str, *, timeout_s: int) -> None:
        """Stop one container through the runtime (see `_Forwarder.stop_container`)."""
        self._forwarder.stop_container(container_id, timeout_s=timeout_s)

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop serving (calls in flight get grace_s to finish), close the upstream channel."""
        self._stopping.set()
        self._server.stop(grace_s).wait()
        self._long_pool.shutdown(wait=False)  # its calls were ended with the server
        if self._reconciler is not None:
            self._reconciler.join(grace_s)
        self._channel.close()
        with contextlib.suppress(FileNotFoundError):
            self.settings.listen.unlink()

    def __enter__(self) -> CriProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
