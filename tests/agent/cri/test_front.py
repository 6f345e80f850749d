"""The CRI front: real nginx on kubelet's socket in front of the agent's proxy and the real containerd.

Calls go through nginx as kubelet's would: passthrough (unary and streaming, both services) reaches the
runtime with its answers, errors and sizes intact; CreateContainer and RemoveContainer reach the claim hooks
(ledger, CDI devices in the container); an upstream that is down answers UNAVAILABLE at once; the config
nginx is given is checked on its own (pure) and by `nginx -t`.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import stat
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from elasticgpu.agent.cri import api, front, proxy, supervising
from elasticgpu.agent.cri.proxy import CriProxy, ProxySettings
from elasticgpu.agent.injecting import claim_hooks
from elasticgpu.agent.ledger import store
from tests.agent.conftest import wait_for
from tests.agent.cri.kubelet import Kubelet
from tests.agent.cri.node import CARDS, View, publish_cards, slice_claim
from tests.containerd_runtime import TestRuntime

NS = "team"
BIG = 64 * 1024 * 1024  # the client's message limit: the test, not the client, decides what is too large


def settings_for(containerd: TestRuntime, nginx: str) -> front.FrontSettings:
    """A front of its own inside the runtime's temporary folder (short paths: unix sockets < 108 bytes)."""
    tag = uuid.uuid4().hex[:8]
    state = containerd.directory / f"front-{tag}"
    return front.FrontSettings(listen=containerd.directory / f"cri-{tag}.sock", runtime=str(containerd.socket),
                               hook=state / "hook.sock", state_dir=state, nginx=nginx,
                               nginx_version=front.nginx_version(nginx))  # fmt: skip


@pytest.fixture
def nginx(containerd: TestRuntime) -> str:
    """The test runtime's nginx (bookworm's 1.22), or ELASTICGPU_TEST_NGINX (e.g. trixie's 1.26)."""
    if other := os.environ.get("ELASTICGPU_TEST_NGINX"):
        return other
    if containerd.nginx is None:
        pytest.skip("the test runtime was built before it had nginx: run `bash testruntime/build.sh`")
    return str(containerd.nginx)


@pytest.fixture
def nginx_front(containerd: TestRuntime, nginx: str) -> Iterator[front.NginxFront]:
    """nginx in front of a pass-through proxy on the hook socket and the test containerd."""
    settings = settings_for(containerd, nginx)
    running = front.NginxFront(settings)
    hook = ProxySettings(listen=settings.hook, upstream=str(containerd.socket))
    settings.state_dir.mkdir()
    with CriProxy(hook):
        running.start()
        try:
            yield running
        finally:
            running.stop()


def client(socket: Path, image: str = "") -> Kubelet:
    """A Kubelet whose channel takes messages up to 64 MiB (kubelet's own limit is 16 MiB)."""
    k = Kubelet(f"unix://{socket}", image)
    k.channel.close()
    options = [("grpc.max_receive_message_length", BIG), ("grpc.max_send_message_length", BIG)]
    k.channel = grpc.insecure_channel(f"unix://{socket}", options=options)
    k.runtime = api.services.RuntimeServiceStub(k.channel)
    k.images = api.services.ImageServiceStub(k.channel)
    return k


# --- the config (pure) ---


def test_the_config_routes_the_hooked_methods_to_the_proxy_and_everything_else_to_the_runtime(tmp_path: Path) -> None:
    settings = front.FrontSettings(listen=Path("/run/eg/cri.sock"), runtime="unix:///run/containerd/containerd.sock",
                                   hook=Path("/run/eg/front/hook.sock"), state_dir=Path("/run/eg/front"))  # fmt: skip
    text = front.render_config(settings, bind=front.bind_path(settings.listen))
    assert front.HOOKED_METHODS == proxy.INTERCEPTED_METHODS == {
        "/runtime.v1.RuntimeService/CreateContainer",
        "/runtime.v1.RuntimeService/RemoveContainer",
        "/runtime.v1.RuntimeService/RemovePodSandbox",
    }
    for method in front.HOOKED_METHODS:
        assert f"location = {method} {{\n      grpc_pass grpc://hook;\n      error_page 502 504 = @hook_down;" in text
    assert "location / {\n      grpc_pass grpc://runtime;\n      error_page 502 504 = @runtime_down;" in text
    assert "server unix:/run/containerd/containerd.sock;" in text and "server unix:/run/eg/front/hook.sock;" in text
    assert "listen unix:/run/eg/.cri.sock.front/nginx.sock http2;" in text  # the private bind, renamed onto listen
    # What kubelet relies on: no body limit, no timeout shorter than a quiet stream, one process, no user switch.
    for line in ("client_max_body_size 0;", "grpc_read_timeout 604800s;", "grpc_send_timeout 604800s;",
                 "send_timeout 604800s;", "client_body_timeout 604800s;", "keepalive_time 604800s;",
                 "grpc_connect_timeout 5s;", "daemon off;", "master_process off;", "access_log off;",
                 "error_log stderr warn;", "pid /run/eg/front/nginx.pid;",
                 "client_body_temp_path /run/eg/front/body;"):  # fmt: skip
        assert line in text, line
    assert "\nuser " not in text
    # nginx 1.25.1 moved HTTP/2 from a listen parameter to its own directive (the old form warns).
    newer = front.render_config(replace(settings, nginx_version=(1, 25, 1)), bind=Path("/run/b.sock"))
    assert "    listen unix:/run/b.sock;\n    http2 on;\n" in newer and " http2;" not in newer
    assert text.count("add_header grpc-status 14 always;") == 2
    assert "the container runtime at /run/containerd/containerd.sock did not answer" in text
    assert "the agent's CRI hook at /run/eg/front/hook.sock did not answer" in text

    # A path that would break the config is refused, naming the setting.
    with pytest.raises(front.FrontError, match=r"--cri-upstream '/run/x; y.sock' must be an absolute path"):
        front.render_config(replace(settings, runtime="/run/x; y.sock"), bind=Path("/run/b.sock"))
    with pytest.raises(front.FrontError, match=r"--cri-front-dir 'relative/dir' must be an absolute path"):
        front.render_config(replace(settings, state_dir=Path("relative/dir")), bind=Path("/run/b.sock"))


def test_nginx_accepts_the_config(nginx: str, tmp_path: Path) -> None:
    settings = front.FrontSettings(listen=tmp_path / "cri.sock", runtime=str(tmp_path / "rt.sock"),
                                   hook=tmp_path / "hook.sock", state_dir=tmp_path, nginx=nginx,
                                   nginx_version=front.nginx_version(nginx))  # fmt: skip
    (tmp_path / "nginx.conf").write_text(front.render_config(settings, bind=tmp_path / "bind.sock"))
    done = subprocess.run([nginx, "-e", "stderr", "-t", "-p", f"{tmp_path}/", "-c", str(tmp_path / "nginx.conf")],
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "test is successful" in done.stderr and "warn" not in done.stderr, done.stderr


def test_nginx_serves_the_config_as_a_user_that_is_not_root(nginx: str) -> None:
    """No `user` directive: as root nginx stays root (test above, and the agent's tests); as any
    other user it runs as that user, with nothing to switch and every path its own."""
    if shutil.which("setpriv") is None or os.geteuid() != 0:
        pytest.skip("needs root and setpriv (util-linux) to become another user")
    with tempfile.TemporaryDirectory(prefix="egfront-", dir="/tmp") as folder:  # pytest's is root's only
        tmp_path = Path(folder)
        tmp_path.chmod(0o777)
        _serve_as_nobody(nginx, tmp_path)


def _serve_as_nobody(nginx: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o777)
    state.chmod(0o777)
    settings = front.FrontSettings(listen=tmp_path / "cri.sock", runtime=str(tmp_path / "rt.sock"),
                                   hook=tmp_path / "hook.sock", state_dir=state, nginx=nginx,
                                   nginx_version=front.nginx_version(nginx))  # fmt: skip
    (tmp_path / "nginx.conf").write_text(front.render_config(settings, bind=tmp_path / "bind.sock"))
    command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", nginx, "-e", "stderr",
               "-p", f"{state}/", "-c", str(tmp_path / "nginx.conf")]  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        wait_for("nginx listening", lambda: (tmp_path / "bind.sock").exists() or process.poll() is not None)
        assert process.poll() is None, process.communicate()[1]
        assert os.stat(tmp_path / "bind.sock").st_uid == 65534
        with client(tmp_path / "bind.sock") as k, pytest.raises(grpc.RpcError) as down:
            k.runtime.Version(k.pb.VersionRequest(), timeout=5)
        assert down.value.code() == grpc.StatusCode.UNAVAILABLE and "did not answer" in str(down.value.details())
    finally:
        process.terminate()
        _, errors = process.communicate(timeout=10)
    assert "[emerg]" not in errors and "[alert]" not in errors and "[warn]" not in errors, errors


def test_a_problem_in_nginx_log_is_named_without_time_connection_or_request() -> None:
    line = ('2026/12/03 07:58:10 [crit] 7378#7378: *12 connect() to unix:/run/c.sock failed (111: Connection refused)'
            ' while connecting to upstream, client: unix:, server: , request: "POST /runtime.v1.RuntimeService/Version'
            ' HTTP/2.0", upstream: "grpc://unix:/run/c.sock:", host: "localhost"')  # fmt: skip
    assert front.log_problem(line) == "[crit] connect() to unix:/run/c.sock failed (111: Connection refused)"
    assert front.log_problem(line.replace("*12", "*13").replace("Version", "ListContainers")) == front.log_problem(line)
    assert front.log_problem("2026/12/03 08:05:54 [emerg] 15#15: bind() failed") == "[emerg] bind() failed"
    assert front.log_problem("not nginx's format") == "not nginx's format"


def test_the_flags_choose_the_front(nginx: str, tmp_path: Path) -> None:
    from elasticgpu.agent import errors, running
    from elasticgpu.agent.settings import CriSettings

    base = CriSettings(cri_listen=str(tmp_path / "cri.sock"), cri_front_dir=str(tmp_path / "front"))
    chosen = running.hook_settings(replace(base, cri_front="nginx", cri_nginx=nginx))
    assert chosen.front is not None and chosen.front.nginx == nginx and chosen.front.listen == tmp_path / "cri.sock"
    assert chosen.front.nginx_version == front.nginx_version(nginx) >= (1, 22)
    assert chosen.proxy.listen == chosen.front.hook == tmp_path / "front" / "hook.sock"  # the proxy behind it
    assert running.hook_settings(replace(base, cri_front="auto", cri_nginx=nginx)).front == chosen.front
    for alone in (replace(base, cri_front="none", cri_nginx=nginx),
                  replace(base, cri_front="auto", cri_nginx=str(tmp_path / "no-nginx"))):  # fmt: skip
        settings = running.hook_settings(alone)
        assert settings.front is None and settings.proxy.listen == tmp_path / "cri.sock"
    with pytest.raises(errors.AgentError, match=r"--cri-front nginx: no nginx with HTTP/2 and gRPC at --cri-nginx"):
        running.hook_settings(replace(base, cri_front="nginx", cri_nginx=str(tmp_path / "no-nginx")))
    with pytest.raises(errors.AgentError, match=r"--cri-front / ELASTICGPU_AGENT_CRI_FRONT='ngnix' is not a front"):
        running.hook_settings(replace(base, cri_front="ngnix"))


def test_find_nginx(nginx: str, tmp_path: Path) -> None:
    assert front.find_nginx(nginx) == nginx
    assert front.find_nginx(str(tmp_path / "no-nginx")) is None
    fake = tmp_path / "nginx"
    fake.write_text("#!/bin/sh\necho 'nginx version: nginx/1.0 configure arguments: --without-http_grpc_module' >&2\n")
    fake.chmod(0o755)
    assert front.find_nginx(str(fake)) is None  # no HTTP/2 or gRPC: not a front


# --- calls through the front ---


def test_passthrough_calls_reach_the_runtime_untouched(nginx_front: front.NginxFront, containerd: TestRuntime) -> None:
    listen = nginx_front.settings.listen
    assert stat.S_ISSOCK(os.lstat(listen).st_mode) and stat.S_IMODE(os.lstat(listen).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(nginx_front.bind.parent).st_mode) == 0o700
    with client(listen, containerd.image) as k, client(containerd.socket, containerd.image) as direct:
        assert k.runtime.Version(k.pb.VersionRequest(), timeout=5) == direct.runtime.Version(
            k.pb.VersionRequest(), timeout=5
        )
        pod = k.run_pod("web", NS)
        container_id = k.create_container(pod, "main")
        k.start(container_id)
        listed = k.runtime.ListContainers(k.pb.ListContainersRequest(), timeout=5)
        assert listed == direct.runtime.ListContainers(k.pb.ListContainersRequest(), timeout=5)
        assert [c.id for c in listed.containers] == [container_id]
        assert k.exec(container_id, "echo", "through the front") == (0, "through the front\n")  # ExecSync

        # ImageService through the same socket.
        images = k.images.ListImages(k.pb.ListImagesRequest(), timeout=5).images
        assert containerd.image in [tag for image in images for tag in image.repo_tags]
        status = k.images.ImageStatus(k.pb.ImageStatusRequest(image=k.pb.ImageSpec(image=containerd.image)), timeout=5)
        assert status.image.id == direct.images.ImageStatus(
            k.pb.ImageStatusRequest(image=k.pb.ImageSpec(image=containerd.image)), timeout=5
        ).image.id
        assert k.images.ImageFsInfo(k.pb.ImageFsInfoRequest(), timeout=5).image_filesystems

        # The runtime's errors arrive with their code and whole text (a long one: trailers bigger than a frame).
        missing = "f" * 6000
        with pytest.raises(grpc.RpcError) as through:
            k.runtime.ContainerStatus(k.pb.ContainerStatusRequest(container_id=missing), timeout=5)
        with pytest.raises(grpc.RpcError) as plain:
            direct.runtime.ContainerStatus(k.pb.ContainerStatusRequest(container_id=missing), timeout=5)
        assert through.value.code() == plain.value.code() == grpc.StatusCode.NOT_FOUND
        assert through.value.details() == plain.value.details() and missing in str(through.value.details())

        # A pull (nothing is ever pulled here: the registry is a closed port) fails as it fails directly.
        with pytest.raises(grpc.RpcError) as pulled:
            k.images.PullImage(k.pb.PullImageRequest(image=k.pb.ImageSpec(image="docker.io/library/x:1")), timeout=30)
        assert pulled.value.code() == grpc.StatusCode.UNKNOWN and "127.0.0.1:9" in str(pulled.value.details())
        k.remove_pod(pod)


def test_a_stream_stays_open_through_the_front(nginx_front: front.NginxFront, containerd: TestRuntime) -> None:
    events: queue.Queue[object] = queue.Queue()
    with client(nginx_front.settings.listen, containerd.image) as k:
        stream = k.runtime.GetContainerEvents(k.pb.GetEventsRequest())

        def read() -> None:
            try:
                for event in stream:
                    events.put(event)
            except grpc.RpcError as e:
                events.put(e)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        time.sleep(0.5)  # the stream is open and quiet
        pod = k.run_pod("watched", NS)
        container_id = k.create_container(pod, "main")
        deadline = time.monotonic() + 10
        seen: list[object] = []
        while not any(getattr(e, "container_id", None) == container_id for e in seen):
            assert time.monotonic() < deadline, f"no event for {container_id} through the front: {seen}"
            seen.append(events.get(timeout=max(0.01, deadline - time.monotonic())))
        stream.cancel()
        reader.join(5)
        k.remove_pod(pod)


def test_large_request_and_answer(nginx_front: front.NginxFront, containerd: TestRuntime) -> None:
    """A CreateContainer of 5 MiB (through the hook) and a ListContainers answer of 5 MiB (past grpc's
    default 4 MiB; nginx's default body limit is 1 MiB): both pass as they pass directly."""
    big = "x" * (5 * 1024 * 1024)
    with client(nginx_front.settings.listen, containerd.image) as k, client(containerd.socket) as direct:
        # containerd queues container events until a stream reads them, and each event of this pod
        # carries the 5 MiB annotation: read them here, or the next test's stream gets them.
        events: queue.Queue[object] = queue.Queue()
        stream = direct.runtime.GetContainerEvents(k.pb.GetEventsRequest())
        def read() -> None:
            with contextlib.suppress(grpc.RpcError):  # cancelled at the end
                for event in stream:
                    events.put(event)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        pod = k.run_pod("big", NS)
        container_id = k.create_container(pod, "main", annotations={"example.com/big": big})
        answer = k.runtime.ListContainers(k.pb.ListContainersRequest(), timeout=10)
        assert answer.ByteSize() > 5 * 1024 * 1024
        assert answer == direct.runtime.ListContainers(k.pb.ListContainersRequest(), timeout=10)
        assert answer.containers[0].id == container_id and answer.containers[0].annotations["example.com/big"] == big
        k.remove_pod(pod)
        deleted = k.pb.ContainerEventType.Value("CONTAINER_DELETED_EVENT")
        deadline = time.monotonic() + 10
        while True:
            event: Any = events.get(timeout=max(0.01, deadline - time.monotonic()))
            if event.container_id == container_id and event.container_event_type == deleted:
                break
        stream.cancel()
        reader.join(5)


def test_an_upstream_that_is_down_answers_unavailable_at_once(
    containerd: TestRuntime, nginx: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = replace(settings_for(containerd, nginx), runtime=str(containerd.directory / "no-runtime.sock"))
    running = front.NginxFront(settings)
    running.start()
    try:
        with client(settings.listen, containerd.image) as k:
            # kubelet calls several times a second: nginx's log line for each is logged once.
            for _ in range(5):
                with pytest.raises(grpc.RpcError):
                    k.runtime.ListContainers(k.pb.ListContainersRequest(), timeout=10)
            problem = f"connect() to unix:{settings.runtime} failed"
            wait_for("nginx's log line", lambda: problem in caplog.text)
            time.sleep(0.2)  # the other four lines, had they been logged
            assert caplog.text.count(problem) == 1, caplog.text

            for call, text in (
                (lambda: k.runtime.Version(k.pb.VersionRequest(), timeout=10), "the container runtime at"),
                (lambda: k.runtime.CreateContainer(k.pb.CreateContainerRequest(), timeout=10), "the agent's CRI hook"),
            ):
                started = time.monotonic()
                with pytest.raises(grpc.RpcError) as down:
                    call()
                assert time.monotonic() - started < 1.0
                assert down.value.code() == grpc.StatusCode.UNAVAILABLE  # kubelet retries
                assert text in str(down.value.details()) and "did not answer" in str(down.value.details())

            # The proxy comes up behind the front: the next try reaches it (and its runtime).
            with CriProxy(ProxySettings(listen=settings.hook, upstream=str(containerd.socket))):
                with pytest.raises(grpc.RpcError) as reached:
                    k.runtime.CreateContainer(k.pb.CreateContainerRequest(), timeout=10)
                assert reached.value.code() == grpc.StatusCode.UNKNOWN  # containerd's answer to an empty request
                assert "sandbox" in str(reached.value.details())
    finally:
        running.stop()
    assert not settings.listen.exists() and not running.bind.exists() and not running.alive()


@dataclass
class GpuNode:
    view: View
    ledger: store.LedgerStore
    hooks: claim_hooks.ClaimHooks
    kubelet: Kubelet

    def rows(self) -> list[tuple[str, str | None, str]]:
        self.hooks.flush()
        return [(a.state, a.container_id, a.claim_name) for a in self.ledger.open_allocations()]


@pytest.fixture
def gpu_node(containerd: TestRuntime, nginx: str, tmp_path: Path) -> Iterator[GpuNode]:
    """The claim hooks behind the front, as the agent runs them."""
    publish_cards(containerd.cdi_dir, containerd.directory / "dev")
    settings = settings_for(containerd, nginx)
    settings.state_dir.mkdir()
    view = View()
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    hooks = claim_hooks.ClaimHooks(view=view, ledger=ledger)
    running = front.NginxFront(settings)
    with CriProxy(ProxySettings(listen=settings.hook, upstream=str(containerd.socket)), container_hooks=hooks) as p:
        assert p.reconciled.wait(10)
        running.start()
        try:
            with client(settings.listen, containerd.image) as k:
                yield GpuNode(view=view, ledger=ledger, hooks=hooks, kubelet=k)
        finally:
            running.stop()
    hooks.close()
    ledger.close()


def test_claims_reach_the_hooks_through_the_front(gpu_node: GpuNode) -> None:
    k = gpu_node.kubelet
    gpu_node.view.add(slice_claim(NS, "slice", user="trainer"))
    pod = k.run_pod("trainer", NS, annotations={"egpuc.elasticgpu.io/main": "slice"})
    container_id = k.create_container(pod, "main", envs={"NVIDIA_VISIBLE_DEVICES": "all"})
    k.start(container_id)
    env = k.env(container_id)
    assert env["NVIDIA_VISIBLE_DEVICES"] == CARDS[0].uuid and env["CUDA_DEVICE_SM_LIMIT"] == "30"
    code, out = k.exec(container_id, "sh", "-c", "ls /dev | grep nvidia; true")
    assert code == 0, out
    assert sorted(out.split()) == ["nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidiactl"]  # CDI devices
    assert gpu_node.rows() == [("created", container_id, "slice")]

    # A refusal of the hook arrives with its code and text.
    intruder = k.run_pod("intruder", NS, annotations={"egpuc.elasticgpu.io/main": "slice"})
    with pytest.raises(grpc.RpcError) as refused:
        k.create_container(intruder, "main")
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"serves pod {NS}/trainer (status.users)" in str(refused.value.details())

    # RemoveContainer reaches the hook: the row is released.
    k.remove_container(container_id)
    assert gpu_node.rows() == []
    released = gpu_node.ledger.allocation_for_container(container_id)
    assert released is not None and released.state == "released"


# --- the front kept serving by the agent's CRI hook ---


def test_the_hook_restarts_a_killed_front_and_stops_it(containerd: TestRuntime, nginx: str, tmp_path: Path) -> None:
    fs = settings_for(containerd, nginx)
    settings = supervising.HookSettings(
        proxy=ProxySettings(listen=fs.hook, upstream=str(containerd.socket), reconcile_backoff_s=(0.05, 0.2)),
        front=fs, cdi_dir=tmp_path / "cdi", tick_s=0.05, backoff_s=(0.05, 0.2), grace_s=1,
    )  # fmt: skip
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    hook = supervising.CriHook(settings=settings, view=View(), ledger=ledger, cards=list, control_paths=list)
    stop = threading.Event()
    thread = threading.Thread(target=hook.run, args=(stop,), daemon=True)
    assert hook.not_serving() is not None
    thread.start()

    def answers() -> bool:
        with client(fs.listen) as k:
            try:
                return bool(k.runtime.Version(k.pb.VersionRequest(), timeout=2).runtime_name)
            except grpc.RpcError:
                return False

    try:
        wait_for("the front serving", lambda: hook.front is not None and answers(), timeout=10)
        assert hook.not_serving() is None and hook.front_starts == 1
        first = hook.front.pid if hook.front else None
        assert first is not None and stat.S_IMODE(os.lstat(fs.listen).st_mode) == 0o600

        # kill -9 of nginx: restarted and serving again within seconds, on the same path.
        os.kill(first, 9)
        started = time.monotonic()
        wait_for("the front restarted", lambda: hook.front_starts == 2 and answers(), timeout=10)
        assert time.monotonic() - started < 5 and hook.front is not None and hook.front.pid != first
        with pytest.raises(ProcessLookupError):
            os.kill(first, 0)

        # Its socket removed (a cleaned /var/run): a new nginx serves a new one.
        fs.listen.unlink()
        wait_for("the front back on its path", lambda: hook.front_starts == 3 and answers(), timeout=10)

        # Claims still reach the proxy behind it (a refusal from the hooks, not an UNAVAILABLE from nginx).
        with client(fs.listen, containerd.image) as k:
            pod = k.run_pod("p", NS, annotations={"egpuc.elasticgpu.io/main": "nope"})
            with pytest.raises(grpc.RpcError) as refused:
                k.create_container(pod, "main")
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "ElasticGPUClaim team/nope does not exist" in str(refused.value.details())
        last = hook.front.pid if hook.front else None
    finally:
        stop.set()
        thread.join(15)
        ledger.close()
    assert not thread.is_alive() and hook.front is None and hook.proxy is None
    assert not fs.listen.exists() and not fs.hook.exists()
    assert last is not None
    with pytest.raises(ProcessLookupError):
        os.kill(last, 0)


def test_deadline_metadata_and_status_pass_both_ways(nginx: str, tmp_path: Path) -> None:
    """Through nginx to a gRPC runtime stand-in that records what it saw and answers with metadata: the
    caller's deadline and metadata arrive (none stays none: PullImage), the runtime's initial and trailing
    metadata (binary too) and its error status come back, and a method nobody knows yet is routed too."""
    import json
    from concurrent import futures

    seen: list[dict[str, object]] = []

    def answer(request: bytes, context: grpc.ServicerContext) -> bytes:
        remaining = context.time_remaining()
        seen.append({"remaining": remaining, "metadata": dict(context.invocation_metadata()), "body": request})
        context.send_initial_metadata((("x-initial", "first"),))
        context.set_trailing_metadata((("x-trailing", "last"), ("x-detail-bin", b"\x00\xff")))
        if request == b"fail":
            context.abort(grpc.StatusCode.ABORTED, "the runtime says: aborted, try again")
        return json.dumps({"remaining": remaining}).encode()

    handler = grpc.unary_unary_rpc_method_handler(answer)
    runtime = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    runtime.add_generic_rpc_handlers((
        grpc.method_handlers_generic_handler(api.IMAGE_SERVICE, {"PullImage": handler}),
        grpc.method_handlers_generic_handler(api.RUNTIME_SERVICE, {"SomethingNewer": handler}),
    ))  # fmt: skip
    runtime.add_insecure_port(f"unix://{tmp_path / 'rt.sock'}")
    runtime.start()
    settings = front.FrontSettings(listen=tmp_path / "cri.sock", runtime=str(tmp_path / "rt.sock"),
                                   hook=tmp_path / "hook.sock", state_dir=tmp_path / "front", nginx=nginx,
                                   nginx_version=front.nginx_version(nginx))  # fmt: skip
    running = front.NginxFront(settings)
    running.start()
    try:
        with grpc.insecure_channel(f"unix://{settings.listen}") as channel:
            pull = channel.unary_unary(api.method_path(api.IMAGE_SERVICE, "PullImage"))
            answer_body, call = pull.with_call(b"\x0a\x02hi", timeout=7, metadata=(("traceparent", "00-abc-def-01"),))
            assert json.loads(answer_body) and dict(call.initial_metadata())["x-initial"] == "first"
            assert dict(call.trailing_metadata()) == {"x-trailing": "last", "x-detail-bin": b"\x00\xff"}
            pull(b"")
            with pytest.raises(grpc.RpcError) as failed:
                pull(b"fail", timeout=7)
            assert failed.value.code() == grpc.StatusCode.ABORTED
            assert failed.value.details() == "the runtime says: aborted, try again"
            assert dict(failed.value.trailing_metadata())["x-detail-bin"] == b"\x00\xff"  # type: ignore[attr-defined]
            newer = channel.unary_unary(api.method_path(api.RUNTIME_SERVICE, "SomethingNewer"))
            assert json.loads(newer(b"new", timeout=7))
    finally:
        running.stop()
        runtime.stop(0)
    with_deadline, without, _, newer_call = seen
    assert 5 < float(with_deadline["remaining"]) <= 7.05  # type: ignore[arg-type]
    assert with_deadline["metadata"]["traceparent"] == "00-abc-def-01"  # type: ignore[index]
    assert with_deadline["body"] == b"\x0a\x02hi"  # the bytes, untouched
    assert float(without["remaining"]) > 1e8  # type: ignore[arg-type]  # no deadline added by nginx
    assert newer_call["body"] == b"new"


def test_an_nginx_left_by_a_killed_agent_is_killed_at_the_next_start(containerd: TestRuntime, nginx: str) -> None:
    """Where nginx outlived its agent (no setpriv to tie it to the agent), the next start finds it by
    its pid file and config and kills it: it would keep serving kubelet's open connection."""
    settings = settings_for(containerd, nginx)
    left = front.NginxFront(settings)
    left.start()
    old = left.pid
    assert old is not None
    again = front.NginxFront(settings)  # the restarted agent's, knowing nothing of `left`
    again.start()
    try:
        assert left.exit_code() == -9  # killed (and reaped here: it was this process's child)
        assert again.alive() and again.pid != old
        with client(settings.listen) as k, pytest.raises(grpc.RpcError) as answered:
            k.runtime.CreateContainer(k.pb.CreateContainerRequest(), timeout=5)
        assert answered.value.code() == grpc.StatusCode.UNAVAILABLE  # from the new nginx: no hook behind it
    finally:
        again.stop()
        left.stop()


def test_an_nginx_that_keeps_dying_is_restarted_ever_later(containerd: TestRuntime, nginx: str, tmp_path: Path) -> None:
    fs = settings_for(containerd, nginx)
    settings = supervising.HookSettings(
        proxy=ProxySettings(listen=fs.hook, upstream=str(containerd.socket)),
        front=fs, cdi_dir=tmp_path / "cdi", tick_s=0.02, backoff_s=(0.3, 5.0), grace_s=1,
    )  # fmt: skip
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    hook = supervising.CriHook(settings=settings, view=View(), ledger=ledger, cards=list, control_paths=list)
    stop = threading.Event()
    thread = threading.Thread(target=hook.run, args=(stop,), daemon=True)
    thread.start()
    gaps: list[float] = []
    killed = 0.0
    try:
        for starts in (1, 2, 3, 4):
            wait_for(f"start {starts}", lambda starts=starts: hook.front_starts == starts and hook.front, timeout=15)
            if starts > 1:
                gaps.append(time.monotonic() - killed)
            if starts < 4:
                pid = hook.front.pid if hook.front else None
                assert pid is not None
                os.kill(pid, 9)  # dies at once after each start
                killed = time.monotonic()
    finally:
        stop.set()
        thread.join(15)
        ledger.close()
    # Backoff 0.3, 0.6, 1.2 s: failures are not forgotten by a start, only after a while up.
    assert gaps[0] < gaps[2] - 0.5, gaps
