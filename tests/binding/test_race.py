"""The HA promise: two controller processes against one server (one watching with the
controller's own client, one with kopf), 500 claims competing for room for 200. No card is
oversubscribed, every claim ends Bound or Pending with a reason, no claim gets two
ElasticGPUs, and all the room is used.

It runs twice: namespaced, with the CRDs as shipped; and cluster-wide (the default mode) with
a GPU CRD whose CEL allocation guard is removed (`status.allocations` cores <= 100, exclusive
alone, memory <= spec.memory), so that the binding protocol (the resourceVersion precondition
of each reservation), not the API server's validation, is what keeps cards from
oversubscription."""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from elasticgpu.api import names
from elasticgpu.controller import errors
from elasticgpu.controller.edge.kube import KubeApi
from tests.binding import objects as o
from tests.binding.conftest import Cluster
from tests.binding.processes import ControllerProcesses, check_invariants, wait_quiescent
from tests.conftest import crd_documents
from tests.kube_cluster import server_side_apply

CARDS = 50
CORES = 25  # four claims per card: room for 200
CLAIMS = 500


GUARD = "status.allocations"
"""What the messages of the CRD's allocation rules start with."""


def _create_claims(cluster: Cluster, indexes: range, class_name: str) -> None:
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: cluster.claim(o.claim(f"c{i}", cores=CORES, memory="1Gi", class_name=class_name)),
                      indexes))


def without_allocation_guard(crd: dict[str, Any]) -> dict[str, Any]:
    """The GPU CRD without its CEL rules on `status.allocations` (every other rule kept)."""
    variant = copy.deepcopy(crd)
    removed = 0

    def strip(schema: Any) -> None:
        nonlocal removed
        if isinstance(schema, dict):
            rules = schema.get("x-kubernetes-validations")
            if rules:
                kept = [r for r in rules if not str(r.get("message", "")).startswith(GUARD)]
                removed += len(rules) - len(kept)
                if kept:
                    schema["x-kubernetes-validations"] = kept
                else:
                    del schema["x-kubernetes-validations"]
            for value in schema.values():
                strip(value)
        elif isinstance(schema, list):
            for value in schema:
                strip(value)

    strip(variant)
    assert removed == 3, f"expected the 3 allocation rules of the GPU CRD, removed {removed}"
    return variant


def _oversubscribed_is_stored(kube: KubeApi, name: str) -> bool:
    """Write 60 + 60 cores on probe GPU `name`; True when the server stores it."""
    body = kube.get_gpu(name)
    body["status"] = {"allocations": [{"elasticGPU": e, "cores": 60, "memory": 1, "exclusive": False}
                                      for e in ("probe-a", "probe-b")]}
    try:
        kube.replace_gpu_status(body)
    except errors.ControllerError:
        return False
    body = kube.get_gpu(name)
    body["status"] = {"allocations": []}
    kube.replace_gpu_status(body)
    return True


def _apply_and_wait(api_client: client.ApiClient, kube: KubeApi, crd: dict[str, Any], probe: str, *,
                    guarded: bool) -> None:
    """Apply the GPU CRD and wait until the server validates as it says (the schema is cached)."""
    server_side_apply(api_client, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}",
                      crd)
    deadline = time.monotonic() + 30.0
    while _oversubscribed_is_stored(kube, probe) == guarded:
        assert time.monotonic() < deadline, f"the GPU CRD's allocation guard is still {'off' if guarded else 'on'}"
        time.sleep(0.2)


@pytest.fixture
def unguarded(kube: KubeApi, api_client: client.ApiClient, crds_installed: list[str]) -> Iterator[None]:
    """The GPU CRD without its allocation guard for one test, the shipped one after it."""
    [crd] = [d for d in crd_documents() if d["spec"]["names"]["kind"] == names.KIND_GPU]
    probe = f"gpu-guard-probe-{int(time.time() * 1000)}"
    kube.create_gpu(o.gpu(probe, node="guard-probe"))
    try:
        _apply_and_wait(api_client, kube, without_allocation_guard(crd), probe, guarded=False)
        yield
    finally:
        _apply_and_wait(api_client, kube, crd, probe, guarded=True)
        with contextlib.suppress(errors.NotFound):
            kube.delete_gpu(probe)


@pytest.fixture(params=["namespaced", "cluster-wide-unguarded"])
def mode(request: pytest.FixtureRequest) -> str:
    """namespaced with the shipped CRDs, or cluster-wide with the GPU CRD's guard removed."""
    if request.param == "cluster-wide-unguarded":
        request.getfixturevalue("unguarded")
    return str(request.param)


def test_two_controllers_race_for_capacity(cluster: Cluster, kube: KubeApi, kube_cluster: Any,
                                           tmp_path: Path, mode: str) -> None:
    model = f"T{cluster.prefix}"
    gpu_names = [f"gpu-{cluster.prefix}-{i}" for i in range(CARDS)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: cluster.gpu(o.gpu(gpu_names[i], node=f"{cluster.prefix}-n{i // 8}", index=i % 8,
                                                   model=model)), range(CARDS)))
    class_name = f"{cluster.prefix}-class"
    # The default policy is deterministic: both controllers want the same card for each claim,
    # which is the hardest case for the commit point.
    cluster.klass(o.klass(class_name, parameters={"gpuModel": model}))
    _create_claims(cluster, range(CLAIMS // 2), class_name)

    procs = ControllerProcesses(kube_cluster.kubeconfig, cluster.namespace if mode == "namespaced" else None,
                                tmp_path)
    try:
        procs.start()
        procs.start(env={"ELASTICGPU_WATCH": "kopf"})  # the other watch engine races too
        _create_claims(cluster, range(CLAIMS // 2, CLAIMS), class_name)  # and more while they run
        room = CARDS * 100 // CORES
        claims = wait_quiescent(
            kube, cluster.namespace, quiet_s=5.0, deadline_s=180.0, procs=procs,
            done=lambda cs: sum((c.get("status") or {}).get("phase") == "Bound" for c in cs) >= room
            and all((c.get("status") or {}).get("phase") for c in cs),
        )
        assert all(p.poll() is None for p in procs.procs), procs.logs()
    finally:
        procs.close()
    phases = check_invariants(kube, cluster.namespace, claims, gpu_names)
    assert phases == {"Bound": room, "Pending": CLAIMS - room}, phases
    pending = [c for c in claims if c["status"]["phase"] == "Pending"]
    assert {c["status"]["conditions"][0]["reason"] for c in pending} == {"NoCapacity"}
