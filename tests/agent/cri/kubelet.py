"""A Python CRI client that drives a runtime (or our proxy) the way kubelet does."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import grpc

from elasticgpu.agent.cri import api
from tests.containerd_runtime import container_config, sandbox_config

pb = api.pb


@dataclass
class Pod:
    """A pod sandbox this client started."""

    id: str
    config: Any  # PodSandboxConfig
    containers: dict[str, str] = field(default_factory=dict)  # container name -> id


class Kubelet:
    """CRI calls with kubelet's shapes: pod labels, sandbox config passed to CreateContainer."""

    def __init__(self, endpoint: str, image: str) -> None:
        self.channel = grpc.insecure_channel(endpoint)
        self.runtime = api.services.RuntimeServiceStub(self.channel)
        self.images = api.services.ImageServiceStub(self.channel)
        self.pb = pb
        self.image = image

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Kubelet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run_pod(
        self,
        name: str,
        namespace: str = "default",
        *,
        annotations: dict[str, str] | None = None,
        uid: str | None = None,
        privileged: bool = False,
        labels: dict[str, str] | None = None,
    ) -> Pod:
        config = sandbox_config(name=name, namespace=namespace, uid=uid or str(uuid.uuid4()), annotations=annotations,
                                labels=labels)  # fmt: skip
        config.linux.security_context.privileged = privileged  # a privileged container needs a privileged sandbox
        answer = self.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=30)
        return Pod(id=answer.pod_sandbox_id, config=config)

    def create_container(
        self,
        pod: Pod,
        name: str,
        *,
        envs: dict[str, str] | None = None,
        cdi_devices: list[str] | None = None,
        annotations: dict[str, str] | None = None,
        image: str | None = None,
        privileged: bool = False,
        run_as_user: int | None = None,
    ) -> str:
        config = container_config(
            name=name, image=image or self.image, sandbox=pod.config, envs=envs, cdi_devices=cdi_devices,
            annotations=annotations,
        )
        config.linux.security_context.privileged = privileged
        if run_as_user is not None:  # kubelet sets it from the pod's securityContext.runAsUser
            config.linux.security_context.run_as_user.value = run_as_user
        request = pb.CreateContainerRequest(pod_sandbox_id=pod.id, config=config, sandbox_config=pod.config)
        container_id: str = self.runtime.CreateContainer(request, timeout=30).container_id
        pod.containers[name] = container_id
        return container_id

    def start(self, container_id: str) -> None:
        self.runtime.StartContainer(pb.StartContainerRequest(container_id=container_id), timeout=30)

    def exec(self, container_id: str, *cmd: str) -> tuple[int, str]:
        answer = self.runtime.ExecSync(
            pb.ExecSyncRequest(container_id=container_id, cmd=list(cmd), timeout=10), timeout=20
        )
        return answer.exit_code, answer.stdout.decode() + answer.stderr.decode()

    def env(self, container_id: str) -> dict[str, str]:
        """The environment of a new process in the container (what a CUDA program would see)."""
        code, out = self.exec(container_id, "env")
        assert code == 0, out
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def remove_container(self, container_id: str) -> None:
        self.runtime.StopContainer(pb.StopContainerRequest(container_id=container_id, timeout=5), timeout=30)
        self.runtime.RemoveContainer(pb.RemoveContainerRequest(container_id=container_id), timeout=30)

    def remove_pod(self, pod: Pod) -> None:
        present = self.container_ids()
        for container_id in pod.containers.values():
            if container_id in present:
                self.remove_container(container_id)
        self.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod.id), timeout=30)
        self.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod.id), timeout=30)

    def container_ids(self) -> set[str]:
        return {c.id for c in self.runtime.ListContainers(pb.ListContainersRequest(), timeout=10).containers}
