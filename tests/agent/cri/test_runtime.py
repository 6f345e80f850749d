"""The test runtime itself: containerd answers CRI, runs a host-network pod, and never pulls."""

from __future__ import annotations

import uuid

import grpc
import pytest

from elasticgpu.agent.cri import api
from tests.containerd_runtime import TestRuntime, container_config, sandbox_config

pb = api.pb


def test_runs_a_pod_and_execs_in_it(containerd: TestRuntime) -> None:
    with grpc.insecure_channel(containerd.endpoint) as channel:
        runtime = api.services.RuntimeServiceStub(channel)
        assert runtime.Version(pb.VersionRequest(), timeout=5).runtime_name == "containerd"
        sandbox = sandbox_config(name="smoke", namespace="default", uid=str(uuid.uuid4()))
        sandbox_id = runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=sandbox), timeout=30).pod_sandbox_id
        config = container_config(name="main", image=containerd.image, sandbox=sandbox, envs={"GREETING": "hello"})
        container_id = runtime.CreateContainer(
            pb.CreateContainerRequest(pod_sandbox_id=sandbox_id, config=config, sandbox_config=sandbox), timeout=30
        ).container_id
        runtime.StartContainer(pb.StartContainerRequest(container_id=container_id), timeout=30)
        result = runtime.ExecSync(pb.ExecSyncRequest(container_id=container_id, cmd=["env"], timeout=10), timeout=15)
        assert result.exit_code == 0
        assert "GREETING=hello" in result.stdout.decode().splitlines()


def test_never_pulls(containerd: TestRuntime) -> None:
    """Every registry points at a closed loopback port: a pull fails at once, naming that port."""
    with grpc.insecure_channel(containerd.endpoint) as channel:
        images = api.services.ImageServiceStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            images.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image="docker.io/library/alpine:3")), timeout=30)
        assert "127.0.0.1:9" in str(raised.value.details())
