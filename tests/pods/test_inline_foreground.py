"""Foreground deletion of a pod with an inline claim (issue 28.1): the claim carries
`blockOwnerDeletion: true`, as a generic ephemeral volume's claim does, so the garbage collector
deletes the claim before the pod object goes.

That makes a cycle possible, which Kubernetes breaks for ephemeral volumes (the PVC protection
controller's `podIsShutDown`): the pod waits (finalizer foregroundDeletion) for its claim, the
claim waits (our finalizer elasticgpu.io/claim-protection) for its pod to stop using it. A pod
that is shut down (deletionTimestamp with deletionGracePeriodSeconds 0: kubelet is done with it,
or it was never scheduled, or force-deleted) uses nothing: the first test holds on the test API
server, with a finalizer standing in for the collector's.

The second needs a real garbage collector, which the test API server does not run: it probes for
one by behaviour (an object owned by a deleted one must go) and is skipped on a server without.
Its real-cluster variant runs in the tier `tests/realcluster` (kube-controller-manager's collector,
kubelet, the controller under the chart's RBAC):
`tests/realcluster/test_claim_pod.py::test_foreground_deletion_of_a_pod_removes_its_inline_claim_first`,
a graceful and a forced (grace 0) foreground delete of a Running pod.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from elasticgpu.controller import errors
from tests.binding import objects as o
from tests.pods.claim_world import World, controller_for, kube, settle, wait_for, world

__all__ = ["kube", "world"]  # fixtures

STAND_IN = "elasticgpu.io/test-stands-in-for-foreground-deletion"
GC_PROBE_S = 10.0
"""How long the probe waits for a garbage collector to delete an orphan (kube-controller-manager's
collector acts within a second or two)."""


@pytest.fixture
def default_class(world: World) -> str:
    node = world.node(f"{world.prefix}-a")
    model = f"T{world.prefix}"
    world.gpu(o.gpu(f"gpu-{world.prefix}-0", node=node, model=model))
    world.klass(o.klass(f"{world.prefix}-default", default=True, parameters={"gpuModel": model}))
    return node


def _claim(world: World, name: str) -> dict[str, Any] | None:
    try:
        return world.get_claim(name)
    except errors.NotFound:
        return None


def _pod(world: World, name: str) -> dict[str, Any] | None:
    try:
        return world.get_pod(name)
    except errors.NotFound:
        return None


def test_a_shut_down_pod_does_not_hold_its_inline_claim(world: World, default_class: str) -> None:
    controller = controller_for(world)
    world.pod("fg-0", inline={"main": "gpu-core=10"})
    settle(controller)
    assert world.get_claim("fg-0-main")["status"]["phase"] == "Bound"
    # The pod is deleted and shut down (grace 0), but a finalizer keeps its object, as the garbage
    # collector's foregroundDeletion does while the pod's blocking dependents exist.
    world.core.patch_namespaced_pod("fg-0", world.namespace, {"metadata": {"finalizers": [STAND_IN]}})
    try:
        world.core.delete_namespaced_pod("fg-0", world.namespace, grace_period_seconds=0)
        shut_down = world.get_pod("fg-0")["metadata"]
        assert shut_down.get("deletionTimestamp") and shut_down.get("deletionGracePeriodSeconds") == 0
        # The collector deletes the blocking dependent: the claim must go, not wait for the pod.
        world.kube.delete_claim(world.namespace, "fg-0-main")
        for _ in range(5):
            settle(controller)
            if _claim(world, "fg-0-main") is None:
                break
        assert _claim(world, "fg-0-main") is None, "the claim waits for a pod that waits for it"
    finally:
        with contextlib.suppress(ApiException):
            world.core.patch_namespaced_pod("fg-0", world.namespace, {"metadata": {"finalizers": None}})


def _has_garbage_collector(core: client.CoreV1Api, namespace: str) -> bool:
    """Whether a garbage collector runs: an object whose owner is deleted must go (by behaviour, not by
    asking what the server is)."""
    suffix = uuid.uuid4().hex[:8]
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": f"gc-probe-owner-{suffix}"}})
    reference = {"apiVersion": "v1", "kind": "ConfigMap", "name": owner.metadata.name, "uid": owner.metadata.uid}
    dependent = f"gc-probe-dependent-{suffix}"
    core.create_namespaced_config_map(namespace, {"metadata": {"name": dependent, "ownerReferences": [reference]}})
    core.delete_namespaced_config_map(owner.metadata.name, namespace, propagation_policy="Background")
    deadline = time.monotonic() + GC_PROBE_S
    while time.monotonic() < deadline:
        try:
            core.read_namespaced_config_map(dependent, namespace)
        except ApiException as e:
            if e.status == 404:
                return True
            raise
        time.sleep(0.2)
    core.delete_namespaced_config_map(dependent, namespace)
    return False


def test_foreground_deletion_removes_the_inline_claim_before_its_pod(world: World, default_class: str) -> None:
    if not _has_garbage_collector(world.core, world.namespace):
        pytest.skip(
            "this API server runs no garbage collector (an orphaned ConfigMap stayed "
            f"{GC_PROBE_S:.0f} s): foreground deletion needs kube-controller-manager; its real-cluster "
            "variant is tests/realcluster/test_claim_pod.py::"
            "test_foreground_deletion_of_a_pod_removes_its_inline_claim_first"
        )
    controller = controller_for(world)
    world.pod("fg-1", inline={"main": "gpu-core=10"})
    settle(controller)
    claim = world.get_claim("fg-1-main")
    assert claim["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] is True
    world.core.delete_namespaced_pod("fg-1", world.namespace, propagation_policy="Foreground")

    def both_gone() -> bool:
        settle(controller)
        pod, claim = _pod(world, "fg-1"), _claim(world, "fg-1-main")
        # The invariant of blockOwnerDeletion: the pod object is never gone while its claim is there.
        assert not (pod is None and claim is not None), "the pod went before its inline claim"
        return pod is None and claim is None

    wait_for(both_gone, "the pod and its inline claim deleted (foreground)", timeout=60)
