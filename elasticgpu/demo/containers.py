"""What each scenario container sees of its claim.

With a runtime: the demo plays kubelet on the pod's node. Through that node's agent socket (the
agent's CRI proxy in front of containerd) it calls RunPodSandbox, CreateContainer and
StartContainer with the shapes kubelet uses (pod labels, the pod's annotations on the sandbox),
then reads `env` and `ls /dev` inside the running container with ExecSync.

Without a runtime: the agent's own decision for that container (`injection.decide`, over the
agent's `ClaimView` of the API server), i.e. what its proxy would add; no container runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from elasticgpu.testbed.processes import DemoError

SEEN_ENV = ("NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_SM_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT_0")
"""The variables shown: the cards, and the compute and memory limits of a slice."""
CREATE_RETRY_S = 30.0
"""Seconds CreateContainer is retried while the agent answers UNAVAILABLE (not ready yet), as kubelet does."""
IMAGE_ENV = {"NVIDIA_VISIBLE_DEVICES": "all"}
"""What a CUDA image sets: every card. The agent must replace it with the claim's."""


@dataclass
class Sight:
    """What one container sees, and where that came from."""

    pod: str
    container: str
    claim: str
    node: str
    env: dict[str, str] = field(default_factory=dict)
    devices: list[str] = field(default_factory=list)  # /dev/nvidia* entries (or CDI device names, decided only)
    source: str = "container"  # "container": read inside it; "decision": the agent's decision, nothing ran
    seen_at: float = 0.0  # time.monotonic() when it was seen


def _sandbox_config(pb: Any, pod: dict[str, Any]) -> Any:
    meta = pod["metadata"]
    labels = {
        "io.kubernetes.pod.name": meta["name"],
        "io.kubernetes.pod.namespace": meta["namespace"],
        "io.kubernetes.pod.uid": meta["uid"],
    }
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"], attempt=0),
        labels=labels,
        annotations=dict(meta.get("annotations") or {}),
        # Host network and no hostname: no CNI needed.
        linux=pb.LinuxPodSandboxConfig(
            security_context=pb.LinuxSandboxSecurityContext(namespace_options=pb.NamespaceOption(network=pb.NODE))
        ),
    )


def remove_pod_sandboxes(socket: Path, namespace: str) -> int:
    """Stop and remove, through the agent socket, every pod sandbox (with its containers) of
    `namespace`, as kubelet does for a deleted pod; how many there were. The agent sees the
    containers go, so its GPUs' runningClaims no longer hold the claims."""
    from elasticgpu.agent.cri import api

    pb = api.pb
    try:
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            runtime = api.services.RuntimeServiceStub(channel)
            answer = runtime.ListPodSandbox(pb.ListPodSandboxRequest(
                filter=pb.PodSandboxFilter(label_selector={"io.kubernetes.pod.namespace": namespace})), timeout=30)
            for sandbox in answer.items:
                runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sandbox.id), timeout=30)
                runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox.id), timeout=30)
    except grpc.RpcError as error:
        raise DemoError(f"removing the pods of namespace {namespace} through {socket}: {error.details()}") from None
    return len(answer.items)


def run_container(socket: Path, image: str, pod: dict[str, Any], container: str, *, claim: str, node: str) -> Sight:
    """Run `container` of `pod` through the agent socket as kubelet would; what it sees inside."""
    from elasticgpu.agent.cri import api

    pb = api.pb
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        runtime = api.services.RuntimeServiceStub(channel)
        sandbox_config = _sandbox_config(pb, pod)
        sandbox = runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=sandbox_config), timeout=30).pod_sandbox_id
        meta = pod["metadata"]
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=container),
            image=pb.ImageSpec(image=image),
            command=["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"],
            envs=[pb.KeyValue(key=k, value=v.encode()) for k, v in IMAGE_ENV.items()],
            labels={
                "io.kubernetes.container.name": container,
                "io.kubernetes.pod.name": meta["name"],
                "io.kubernetes.pod.namespace": meta["namespace"],
                "io.kubernetes.pod.uid": meta["uid"],
            },
        )
        request = pb.CreateContainerRequest(pod_sandbox_id=sandbox, config=config, sandbox_config=sandbox_config)
        deadline = time.monotonic() + CREATE_RETRY_S
        while True:
            try:
                container_id = runtime.CreateContainer(request, timeout=30).container_id
                break
            except grpc.RpcError as error:
                if error.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise DemoError(
                        f"pod {meta['namespace']}/{meta['name']}, container {container!r}: "
                        f"CreateContainer through the agent of {node} failed: {error.details()}"
                    ) from None
                time.sleep(0.3)
        runtime.StartContainer(pb.StartContainerRequest(container_id=container_id), timeout=30)

        def inside(*command: str) -> str:
            answer = runtime.ExecSync(
                pb.ExecSyncRequest(container_id=container_id, cmd=list(command), timeout=10), timeout=20
            )
            return str(answer.stdout.decode(errors="replace"))

        env = dict(line.split("=", 1) for line in inside("env").splitlines() if "=" in line)
        devices = sorted(f"/dev/{name}" for name in inside("ls", "/dev").split() if name.startswith("nvidia"))
    return Sight(
        pod=meta["name"],
        container=container,
        claim=claim,
        node=node,
        env={k: env[k] for k in SEEN_ENV if k in env},
        devices=devices,
        seen_at=time.monotonic(),
    )


def decide(
    kubeconfig: Path, gpus: list[dict[str, Any]], pod: dict[str, Any], container: str, *, claim: str, node: str
) -> Sight:
    """What the agent of `node` would inject into `container` (its own view and decision; nothing runs).
    `gpus`: that node's GPU objects (the cards its discovery reported)."""
    from elasticgpu.agent import kube as agent_kube
    from elasticgpu.agent.discovery import Card
    from elasticgpu.agent.injecting import claim_view, hooks, injection

    cards = [
        Card(
            index=int(g["spec"]["index"]),
            uuid=str(g["spec"]["uuid"]),
            model=str(g["spec"].get("model", "")),
            memory_mib=int(g["spec"].get("memory", 0)),
            minor=int(g["spec"]["index"]),
            device_path=f"/dev/nvidia{g['spec']['index']}",
        )
        for g in gpus
    ]
    reader = agent_kube.AgentKube(
        agent_kube.load_api_client(str(kubeconfig), None), node_name=node, field_manager="elasticgpu-demo"
    )
    try:
        view = claim_view.ClaimView(kube=reader, node_name=node, cards=lambda: cards)
        meta = pod["metadata"]
        request = injection.ContainerRequest(
            pod=injection.PodRef(meta["namespace"], meta["name"], meta["uid"]),
            pod_annotations=dict(meta.get("annotations") or {}),
            container=container,
            envs=list(IMAGE_ENV.items()),
            cdi_devices=[],
            annotations={},
        )
        try:
            edit = injection.decide(request, view)
        except hooks.Refused as refused:
            raise DemoError(
                f"the agent of {node} would refuse pod {meta['name']}, container {container!r}: {refused}"
            ) from None
    finally:
        reader.close()
    env = dict(edit.envs)
    return Sight(
        pod=meta["name"],
        container=container,
        claim=claim,
        node=node,
        env={k: env[k] for k in SEEN_ENV if k in env},
        devices=list(edit.devices),
        source="decision",
        seen_at=time.monotonic(),
    )
