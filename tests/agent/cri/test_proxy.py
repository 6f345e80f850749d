"""The CRI proxy forwards everything to a real containerd: known calls, streams, unknown methods."""

from __future__ import annotations

import stat
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from elasticgpu.agent.cri import api
from elasticgpu.agent.cri.proxy import CriProxy, ProxySettings
from elasticgpu.agent.injecting import hooks
from elasticgpu.agent.injecting.injection import ContainerEdit, ContainerRequest
from tests.agent.cri.kubelet import Kubelet
from tests.containerd_runtime import TestRuntime

pb = api.pb


def test_socket_is_private(passthrough_proxy: CriProxy) -> None:
    mode = passthrough_proxy.settings.listen.stat().st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600


def test_version_through_proxy_is_the_runtimes(kubelet: Kubelet, containerd: TestRuntime) -> None:
    with grpc.insecure_channel(containerd.endpoint) as channel:
        direct = api.services.RuntimeServiceStub(channel).Version(pb.VersionRequest(), timeout=5)
    proxied = kubelet.runtime.Version(pb.VersionRequest(), timeout=5)
    assert proxied == direct
    assert proxied.runtime_name == "containerd"


def test_pod_lifecycle_through_proxy(kubelet: Kubelet) -> None:
    """RunPodSandbox (host network, no hostname) -> Create/Start -> ExecSync -> List -> Remove."""
    pod = kubelet.run_pod("lifecycle")
    container_id = kubelet.create_container(pod, "main", envs={"FROM_SPEC": "yes"})
    kubelet.start(container_id)
    assert kubelet.env(container_id)["FROM_SPEC"] == "yes"
    code, out = kubelet.exec(container_id, "sh", "-c", "echo $((6 * 7)); exit 3")
    assert (code, out.strip()) == (3, "42")
    listed = kubelet.runtime.ListContainers(pb.ListContainersRequest(), timeout=10).containers
    assert [(c.id, c.metadata.name, c.state) for c in listed] == [(container_id, "main", pb.CONTAINER_RUNNING)]
    status = kubelet.runtime.ContainerStatus(pb.ContainerStatusRequest(container_id=container_id), timeout=10)
    assert status.status.labels["io.kubernetes.pod.name"] == "lifecycle"
    sandboxes = kubelet.runtime.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=10).items
    assert [s.id for s in sandboxes] == [pod.id]
    kubelet.remove_pod(pod)
    assert kubelet.container_ids() == set()
    assert kubelet.runtime.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=10).items == []


def test_image_service_through_proxy(kubelet: Kubelet, containerd: TestRuntime) -> None:
    images = kubelet.images.ListImages(pb.ListImagesRequest(), timeout=10).images
    assert any(containerd.image in image.repo_tags for image in images)
    status = kubelet.images.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=containerd.image)), timeout=10)
    assert status.image.size > 0


def test_streaming_url_calls_pass(kubelet: Kubelet) -> None:
    """Exec/Attach/PortForward answer with the runtime's streaming URL, which kubelet then uses."""
    pod = kubelet.run_pod("streaming")
    container_id = kubelet.create_container(pod, "main")
    kubelet.start(container_id)
    exec_url = kubelet.runtime.Exec(pb.ExecRequest(container_id=container_id, cmd=["sh"], stdout=True), timeout=10).url
    forward_url = kubelet.runtime.PortForward(pb.PortForwardRequest(pod_sandbox_id=pod.id, port=[80]), timeout=10).url
    assert exec_url.startswith("http://127.0.0.1:") and "/exec/" in exec_url
    assert "/portforward/" in forward_url


def test_runtime_errors_pass_with_code_and_text(kubelet: Kubelet) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        kubelet.runtime.ContainerStatus(pb.ContainerStatusRequest(container_id="no-such-container"), timeout=10)
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    assert "no-such-container" in (raised.value.details() or "")


def test_unknown_method_reaches_the_runtime(passthrough_proxy: CriProxy) -> None:
    """A method newer than our proto goes to the runtime as raw bytes; the answer is the runtime's."""
    with grpc.insecure_channel(f"unix://{passthrough_proxy.settings.listen}") as channel:
        call = channel.unary_unary("/runtime.v1.RuntimeService/SomeMethodOfTheFuture")
        with pytest.raises(grpc.RpcError) as raised:
            call(b"\x0a\x03abc", timeout=10)
    # Our own server would say "Method not found!"; containerd's Go server names the method.
    assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "unknown method SomeMethodOfTheFuture" in (raised.value.details() or "")


def test_unknown_method_path_carries_real_calls(containerd: TestRuntime, proxy_socket: Path) -> None:
    """With no method known to the proxy, every call takes the raw-bytes path, and still works."""
    settings = ProxySettings(listen=proxy_socket, upstream=str(containerd.socket))
    with CriProxy(settings, unary_methods=frozenset()), Kubelet(f"unix://{proxy_socket}", containerd.image) as kubelet:
        assert kubelet.runtime.Version(pb.VersionRequest(), timeout=5).runtime_name == "containerd"
        pod = kubelet.run_pod("raw")
        container_id = kubelet.create_container(pod, "main", envs={"RAW": "1"})
        kubelet.start(container_id)
        assert kubelet.env(container_id)["RAW"] == "1"
        assert kubelet.container_ids() == {container_id}
        with pytest.raises(grpc.RpcError) as raised:
            kubelet.runtime.ContainerStatus(pb.ContainerStatusRequest(container_id="missing"), timeout=10)
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND


def test_container_events_stream_through_proxy(kubelet: Kubelet) -> None:
    """GetContainerEvents, a server stream, is forwarded event by event."""
    events = kubelet.runtime.GetContainerEvents(pb.GetEventsRequest(), timeout=60)
    seen: list[Any] = []
    got = threading.Event()

    def read() -> None:
        try:
            for event in events:
                seen.append(event)
                got.set()
        except grpc.RpcError:
            pass

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        pod = kubelet.run_pod("events")
        container_id = kubelet.create_container(pod, "main")
        assert got.wait(30), "no container event came through the proxy within 30 s"
        # containerd queues events while no stream is open: earlier tests' events may come first.
        deadline = time.monotonic() + 30
        while not {pod.id, container_id} & {e.container_id for e in list(seen)}:
            assert time.monotonic() < deadline, f"no event of this pod through the proxy within 30 s: {seen}"
            time.sleep(0.05)
    finally:
        events.cancel()
        reader.join(10)


class _RecordingHooks(hooks.PassThrough):
    def __init__(self, refuse: Exception | None = None) -> None:
        self.refuse = refuse
        self.created_ids: list[str] = []
        self.failed = 0
        self.removed_ids: list[str] = []

    def prepare_create(self, request: ContainerRequest) -> hooks.PreparedCreate:
        if self.refuse is not None and request.container == "gpu":
            raise self.refuse
        return hooks.PreparedCreate(edit=ContainerEdit(envs=(*request.envs, ("HOOKED", "1")),
                                                       cdi_devices=tuple(request.cdi_devices),
                                                       annotations=dict(request.annotations)))

    def created(self, prepared: hooks.PreparedCreate, container_id: str) -> None:
        self.created_ids.append(container_id)

    def create_failed(self, prepared: hooks.PreparedCreate, code: grpc.StatusCode) -> None:
        self.failed += 1

    def removed(self, container_id: str) -> None:
        self.removed_ids.append(container_id)


def test_hooks_rewrite_create_and_see_the_ids(containerd: TestRuntime, proxy_socket: Path) -> None:
    recorder = _RecordingHooks()
    settings = ProxySettings(listen=proxy_socket, upstream=str(containerd.socket))
    with CriProxy(settings, container_hooks=recorder), Kubelet(f"unix://{proxy_socket}", containerd.image) as kubelet:
        pod = kubelet.run_pod("hooked")
        container_id = kubelet.create_container(pod, "main")
        kubelet.start(container_id)
        assert kubelet.env(container_id)["HOOKED"] == "1"
        assert recorder.created_ids == [container_id]
        kubelet.remove_container(container_id)
        assert recorder.removed_ids == [container_id]
        # The runtime refuses (no such sandbox): the hook hears of it and undoes its work.
        orphan = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="orphan"), image=pb.ImageSpec(image="none"))
        with pytest.raises(grpc.RpcError) as raised:
            kubelet.runtime.CreateContainer(
                pb.CreateContainerRequest(pod_sandbox_id="gone", config=orphan, sandbox_config=pod.config), timeout=10
            )
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND
        assert recorder.failed == 1
        assert recorder.created_ids == [container_id]


@pytest.mark.parametrize(
    ("failure", "code", "text"),
    [
        (hooks.Refused("claim gpu-a is not bound yet"), grpc.StatusCode.FAILED_PRECONDITION, "not bound yet"),
        (hooks.Refused("starting", code=grpc.StatusCode.UNAVAILABLE), grpc.StatusCode.UNAVAILABLE, "starting"),
        (RuntimeError("bug"), grpc.StatusCode.UNAVAILABLE, "internal error"),
    ],
)
def test_refusal_stops_only_that_container(
    containerd: TestRuntime, proxy_socket: Path, failure: Exception, code: grpc.StatusCode, text: str
) -> None:
    recorder = _RecordingHooks(refuse=failure)
    settings = ProxySettings(listen=proxy_socket, upstream=str(containerd.socket))
    with CriProxy(settings, container_hooks=recorder), Kubelet(f"unix://{proxy_socket}", containerd.image) as kubelet:
        pod = kubelet.run_pod("refused")
        with pytest.raises(grpc.RpcError) as raised:
            kubelet.create_container(pod, "gpu")
        assert raised.value.code() == code
        assert text in (raised.value.details() or "")
        # Nothing reached the runtime, and every other container of the node still runs.
        assert kubelet.container_ids() == set()
        other = kubelet.create_container(pod, "sidecar")
        kubelet.start(other)
        assert kubelet.container_ids() == {other}


def test_runtime_down_then_up(containerd_session: TestRuntime, tmp_path: Path) -> None:
    """The proxy starts before the runtime: calls fail UNAVAILABLE (kubelet retries), the start-up
    reconciliation retries with backoff, and both succeed once the runtime is there.
    (`containerd_session` only makes the test skip where no runtime can run.)"""
    from tests.containerd_runtime import running_containerd

    upstream = tmp_path / "runtime.sock"  # nothing there yet
    recorder = _RecordingHooks()
    reconciled: list[bool] = []
    recorder.reconcile = lambda containers, *, starting: reconciled.append(starting)  # type: ignore[method-assign]
    settings = ProxySettings(listen=tmp_path / "proxy.sock", upstream=str(upstream), reconcile_backoff_s=(0.05, 0.2))
    with (
        CriProxy(settings, container_hooks=recorder) as proxy,
        grpc.insecure_channel(f"unix://{settings.listen}") as channel,
    ):
        stub = api.services.RuntimeServiceStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            stub.Version(pb.VersionRequest(), timeout=5)
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
        assert not proxy.reconciled.is_set()
        with running_containerd() as runtime:
            upstream.symlink_to(runtime.socket)
            assert proxy.reconciled.wait(15), "the start-up reconciliation did not retry"
            assert reconciled == [True]
            deadline = time.monotonic() + 10
            while True:
                try:
                    assert stub.Version(pb.VersionRequest(), timeout=5).runtime_name == "containerd"
                    break
                except grpc.RpcError:
                    assert time.monotonic() < deadline, "the proxy did not reconnect to the runtime"
                    time.sleep(0.05)


def test_deadline_and_metadata_reach_the_runtime(tmp_path: Path) -> None:
    """kubelet's deadline and metadata are forwarded; a call without deadline (PullImage) gets none
    upstream. The runtime here is a gRPC server on a unix socket that answers with what it saw."""
    import json
    from concurrent import futures

    seen: list[dict[str, object]] = []

    def answer(request: bytes, context: grpc.ServicerContext) -> bytes:
        remaining = context.time_remaining()
        seen.append({"remaining": remaining, "metadata": dict(context.invocation_metadata()), "body": request})
        return json.dumps({"remaining": remaining}).encode()

    runtime_socket = tmp_path / "runtime.sock"
    runtime = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    runtime.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                api.IMAGE_SERVICE, {"PullImage": grpc.unary_unary_rpc_method_handler(answer)}
            ),
        )
    )
    runtime.add_insecure_port(f"unix://{runtime_socket}")
    runtime.start()
    settings = ProxySettings(listen=tmp_path / "proxy.sock", upstream=str(runtime_socket))
    try:
        with CriProxy(settings), grpc.insecure_channel(f"unix://{settings.listen}") as channel:
            pull = channel.unary_unary(api.method_path(api.IMAGE_SERVICE, "PullImage"))
            assert pull(b"\x0a\x02hi", timeout=7, metadata=(("traceparent", "00-abc-def-01"),))
            pull(b"")
    finally:
        runtime.stop(0)
    with_deadline, without = seen
    # grpc rounds the timeout it sends upwards (never cuts a call short), so what arrives may pass the
    # caller's 7 s by a few ms (7.009 s seen once under load).
    assert 5 < float(with_deadline["remaining"]) <= 7.05  # type: ignore[arg-type]
    assert with_deadline["metadata"]["traceparent"] == "00-abc-def-01"  # type: ignore[index]
    assert with_deadline["body"] == b"\x0a\x02hi"  # the bytes, untouched
    assert float(without["remaining"]) > 1e8  # type: ignore[arg-type]  # no deadline upstream either
