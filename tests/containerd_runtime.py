"""A real containerd (with runc and CDI) for the CRI tests, started and stopped by the tests.

The runtime itself moved to elasticgpu/testbed/containerd.py (the demo's box starts it too, and the product
never imports tests/); this module re-exports it under its old names, starts containerd with the tests'
spawn (tests/spawning.py), and keeps what only the tests write: the CRI configs kubelet would send.

If the runtime was never built (no network when ``scripts/test.sh`` ran, not root, ...) the
fixture skips with the reason; once it is built, a start failure is a test failure.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from elasticgpu.testbed import containerd as _containerd
from elasticgpu.testbed.containerd import (
    BUILD_SCRIPT,
    CONTAINERD_VERSIONS,
    REPO_ROOT,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    TMP_PREFIX,
    UNAVAILABLE_ENV,
    RuntimeUnavailable,
    build_cache,
    find_build,
    remove_all_pods,
)
from elasticgpu.testbed.containerd import NodeRuntime as TestRuntime
from tests import spawning

__all__ = [
    "BUILD_SCRIPT", "CONTAINERD_VERSIONS", "REPO_ROOT", "START_TIMEOUT_S", "STOP_TIMEOUT_S", "TMP_PREFIX",
    "UNAVAILABLE_ENV", "RuntimeUnavailable", "TestRuntime", "build_cache", "container_config", "find_build",
    "remove_all_pods", "running_containerd", "sandbox_config",
]  # fmt: skip


@contextlib.contextmanager
def running_containerd(*, nri: bool = False, containerd: str = "1.7",
                       prefix: Sequence[str] = ()) -> Iterator[TestRuntime]:  # fmt: skip
    """elasticgpu.testbed.containerd.running_containerd, containerd started with the tests' spawn."""
    with _containerd.running_containerd(nri=nri, containerd=containerd, prefix=prefix,
                                        spawn=spawning.spawn) as runtime:  # fmt: skip
        yield runtime


def sandbox_config(
    *,
    name: str,
    namespace: str,
    uid: str,
    annotations: dict[str, str] | None = None,
    attempt: int = 0,
    labels: dict[str, str] | None = None,
) -> Any:
    """A PodSandboxConfig as kubelet writes it: host network, no hostname, the pod's labels (`labels`,
    the pod's own, beside kubelet's io.kubernetes.pod.* ones)."""
    from elasticgpu.agent.cri import api

    pb = api.pb
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, namespace=namespace, uid=uid, attempt=attempt),
        labels={
            **(labels or {}),
            "io.kubernetes.pod.name": name,
            "io.kubernetes.pod.namespace": namespace,
            "io.kubernetes.pod.uid": uid,
        },
        annotations=dict(annotations or {}),
        linux=pb.LinuxPodSandboxConfig(
            security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=pb.NamespaceOption(network=pb.NODE),
            ),
        ),
    )


def container_config(
    *,
    name: str,
    image: str,
    sandbox: Any,
    command: list[str] | None = None,
    envs: dict[str, str] | None = None,
    cdi_devices: list[str] | None = None,
    annotations: dict[str, str] | None = None,
) -> Any:
    """A ContainerConfig as kubelet writes it (labels naming pod and container)."""
    from elasticgpu.agent.cri import api

    pb = api.pb
    labels = {
        "io.kubernetes.container.name": name,
        "io.kubernetes.pod.name": sandbox.metadata.name,
        "io.kubernetes.pod.namespace": sandbox.metadata.namespace,
        "io.kubernetes.pod.uid": sandbox.metadata.uid,
    }
    return pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name=name),
        image=pb.ImageSpec(image=image),
        command=command or ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"],
        envs=[pb.KeyValue(key=k, value=v.encode()) for k, v in (envs or {}).items()],
        labels=labels,
        annotations=dict(annotations or {}),
        CDI_devices=[pb.CDIDevice(name=n) for n in (cdi_devices or [])],
    )
