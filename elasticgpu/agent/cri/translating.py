"""The CRI front's wire format to and from the injection core's plain values (agent/injecting).

    container_request   CreateContainerRequest -> injection.ContainerRequest (what the core reads)
    apply               injection.ContainerEdit -> the request's ContainerConfig, in one pass
    runtime_container   a ListContainers `Container` -> hooks.RuntimeContainer
    container_env       a verbose ContainerStatus `info` -> the container's environment

Nothing here decides: the proxy (proxy.py) calls these around the core's hooks.
"""

from __future__ import annotations

import contextlib
from typing import Any

from elasticgpu.agent.cri import api
from elasticgpu.agent.injecting import hooks, injection


def container_request(request: Any) -> injection.ContainerRequest:
    """The plain view of a CreateContainerRequest that the core reads.

    The pod comes from kubelet's `io.kubernetes.pod.*` labels of the sandbox (the sandbox
    metadata as fallback), its annotations from the sandbox's annotations."""
    sandbox, config = request.sandbox_config, request.config
    labels = sandbox.labels
    pod = injection.PodRef(
        labels.get(injection.LABEL_POD_NAMESPACE) or sandbox.metadata.namespace,
        labels.get(injection.LABEL_POD_NAME) or sandbox.metadata.name,
        labels.get(injection.LABEL_POD_UID) or sandbox.metadata.uid,
    )
    return injection.ContainerRequest(
        pod=pod,
        pod_annotations=dict(sandbox.annotations),
        container=config.metadata.name or config.labels.get(injection.LABEL_CONTAINER_NAME, ""),
        # Values are bytes in CRI; surrogateescape round-trips any byte string unchanged.
        envs=[(kv.key, kv.value.decode("utf-8", "surrogateescape")) for kv in config.envs],
        cdi_devices=[device.name for device in config.CDI_devices],
        annotations=dict(config.annotations),
        privileged=config.linux.security_context.privileged,
        run_as_user=(config.linux.security_context.run_as_user.value
                     if config.linux.security_context.HasField("run_as_user") else None),
        pod_labels=dict(labels),  # kubelet copies the pod's labels into the sandbox's
    )


def apply(edit: injection.ContainerEdit | None, request: Any) -> bool:
    """Write the edit into the request's ContainerConfig; False when nothing changed (the caller then
    forwards kubelet's original bytes)."""
    if edit is None:
        return False
    config = request.config
    before = container_request(request)
    if (
        tuple(before.envs) == edit.envs
        and tuple(before.cdi_devices) == edit.cdi_devices
        and dict(before.annotations) == edit.annotations
        and not edit.mounts
    ):
        return False
    if edit.mounts:
        # The edit's mounts replace any of the spec at the same place (only the agent says what
        # enforces a claim).
        paths = {mount.container_path.rstrip("/") for mount in edit.mounts}
        kept = [m for m in config.mounts if m.container_path.rstrip("/") not in paths]
        del config.mounts[:]
        config.mounts.extend(kept)
        config.mounts.extend(api.pb.Mount(container_path=m.container_path, host_path=m.host_path, readonly=m.readonly)
                             for m in edit.mounts)
    del config.envs[:]
    config.envs.extend(api.pb.KeyValue(key=k, value=v.encode("utf-8", "surrogateescape")) for k, v in edit.envs)
    del config.CDI_devices[:]
    config.CDI_devices.extend(api.pb.CDIDevice(name=name) for name in edit.cdi_devices)
    config.annotations.clear()
    config.annotations.update(edit.annotations)
    return True


def runtime_container(container: Any) -> hooks.RuntimeContainer:
    """A CRI `Container` of ListContainers in the core's plain values."""
    return hooks.RuntimeContainer(
        id=container.id, name=container.metadata.name, labels=dict(container.labels),
        annotations=dict(container.annotations), created_at=container.created_at,
        exited=container.state == api.pb.CONTAINER_EXITED,
    )


AGENT_KEY_PREFIXES = ("CUDA_MPS_", "CUDA_DEVICE_")
"""The limit keys the agent sets, read by a process's getenv (CUDA, the MPS client, HAMi-core): the first entry."""


def shadowed(info: dict[str, Any], edit: injection.ContainerEdit) -> list[str]:
    """The keys the agent set whose entry a reader takes is not the agent's, in the created container's spec (from
    its verbose status): the runtime puts the image's ENV before the CRI config's envs, so an image that sets a
    limit key comes first, where getenv reads (the NVIDIA hook reads NVIDIA_VISIBLE_DEVICES' last entry). Each as
    `KEY=<what is read> (the agent's <value>)`; empty when the spec is not in the answer (another runtime)."""
    process = (info.get("runtimeSpec") or {}).get("process") or {}
    entries: dict[str, list[str]] = {}
    for item in process.get("env") or []:
        if isinstance(item, str) and "=" in item:
            key, value = item.split("=", 1)
            entries.setdefault(key, []).append(value)
    found = []
    for key, ours in edit.envs:
        values = entries.get(key)
        if not values:
            continue
        if key.startswith(AGENT_KEY_PREFIXES) and values[0] != ours:
            found.append(f"{key}={values[0]} (the agent's {ours})")
        elif key == injection.ENV_VISIBLE_DEVICES and values[-1] != ours:
            found.append(f"{key}={values[-1]} (the agent's {ours})")
    return found


def container_env(info: dict[str, Any]) -> dict[str, str]:
    """The environment of a container from the runtime's verbose status (OCI spec, else CRI config)."""
    process = (info.get("runtimeSpec") or {}).get("process") or {}
    env = dict(item.split("=", 1) for item in process.get("env") or [] if "=" in item)
    for item in (info.get("config") or {}).get("envs") or []:
        with contextlib.suppress(AttributeError):
            env.setdefault(str(item.get("key", "")), str(item.get("value", "")))
    return env
