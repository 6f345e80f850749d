"""A fresh start binds a new standalone claim from the cards and claims alone, while ElasticGPUs
and pods are still being listed (issue 49: start to first bind 89 s at 40,000 cards / 50,000 claims,
most of it those lists), and touches nothing else before its picture is whole.

Against the test API server, through a client whose lists of ElasticGPUs and pods are held
until the test releases them (a loaded server's 64 s of lists, made deterministic). The
old start listed every kind before its first bind: the new claim stayed Pending until the lists
were released."""

from __future__ import annotations

import threading
from typing import Any

from elasticgpu.api import names
from elasticgpu.controller import errors
from elasticgpu.controller.edge.kube import KubeApi
from tests.binding import objects as o
from tests.binding.conftest import Cluster, new_controller
from tests.controller.early_start_harness import DEADLINE_S, cards, phase, start_in_thread, stopped, wait

HELD_PLURALS = (names.PLURAL_ELASTIC_GPU, "pods")


class HeldLists(KubeApi):
    """A client whose lists of ElasticGPUs and pods wait for `release` (at most 60 s)."""

    release: threading.Event
    holding: threading.Event
    fail_egpus = 0
    """ElasticGPU lists to fail (as a server gone midway) after the release, before one works."""

    def list_collection(self, path: str) -> tuple[list[dict[str, Any]], str]:
        if path.rsplit("/", 1)[-1] in HELD_PLURALS:
            self.holding.set()
            self.release.wait(60.0)
            if path.endswith(names.PLURAL_ELASTIC_GPU) and self.fail_egpus > 0:
                self.fail_egpus -= 1
                raise errors.ApiUnavailable("the test server went away in the middle of the list", status=503)
        return super().list_collection(path)




def _start(kube_cluster: Any, namespace: str) -> tuple[HeldLists, threading.Event, threading.Thread]:
    """A controller started as `elasticgpu controller` starts one, its held lists not released."""
    kube = HeldLists.from_kubeconfig(str(kube_cluster.kubeconfig))
    assert isinstance(kube, HeldLists)
    kube.release, kube.holding = threading.Event(), threading.Event()
    stop, thread = start_in_thread(kube, namespace, name="early-start-test")
    return kube, stop, thread


def test_a_new_standalone_claim_binds_before_the_slow_lists_and_nothing_else_moves(
        kube_cluster: Any, cluster: Cluster, kube: KubeApi) -> None:
    ns = cluster.namespace
    class_name = cards(cluster)
    # A Bound claim with its ElasticGPU and reservation, bound by an earlier controller.
    cluster.claim(o.claim("bound-before", cores=20, memory="1Gi", class_name=class_name))
    earlier = new_controller(kube, ns)
    try:
        earlier.rebuild()
        earlier.drain()
    finally:
        earlier.close()
    assert phase(kube, ns, "bound-before") == "Bound"
    bound = kube.get_claim(ns, "bound-before")
    egpu_name = bound["spec"]["elasticGPUName"]
    egpu_version = kube.get_elastic_gpu(egpu_name)["metadata"]["resourceVersion"]
    # Claims that need the whole picture: one owned by a pod (inline), one in a gang.
    owned = o.claim("owned-by-pod", cores=10, memory="1Gi", class_name=class_name)
    owned["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u-1",
                                             "controller": True}]
    owned_version = cluster.claim(owned)["metadata"]["resourceVersion"]
    gang = o.claim("in-a-gang", cores=10, memory="1Gi", class_name=class_name)
    gang["metadata"]["labels"] = {names.LABEL_GROUP: "g"}
    gang["metadata"]["annotations"] = {names.ANNOTATION_GROUP_MIN_MEMBERS: "1"}
    cluster.claim(gang)

    # A claim made as the controller starts, before it lists anything (the bench's probe).
    cluster.claim(o.claim("made-before-start", cores=10, memory="1Gi", class_name=class_name))
    held, stop, thread = _start(kube_cluster, ns)
    try:
        assert held.holding.wait(DEADLINE_S), "the controller never listed ElasticGPUs or pods"
        cluster.claim(o.claim("new-at-start", cores=10, memory="1Gi", class_name=class_name))
        for name in ("made-before-start", "new-at-start"):
            assert wait(lambda name=name: phase(kube, ns, name) == "Bound"), (
                f"the new claim {name} is {phase(kube, ns, name)} with the slow lists still held: it waited for"
                " them")
        # Nothing else was written while the picture was partial.
        assert kube.get_claim(ns, "bound-before")["metadata"]["resourceVersion"] == bound["metadata"]["resourceVersion"]
        assert kube.get_elastic_gpu(egpu_name)["metadata"]["resourceVersion"] == egpu_version
        assert kube.get_claim(ns, "owned-by-pod")["metadata"]["resourceVersion"] == owned_version
        assert phase(kube, ns, "in-a-gang") is None
        gpus = [kube.get_gpu(f"gpu-{cluster.prefix}-e{i}") for i in range(2)]
        reserved = [a["elasticGPU"] for g in gpus for a in (g.get("status") or {}).get("allocations") or []]
        assert egpu_name in reserved, reserved  # the earlier bind's reservation, not freed as an orphan
        held.release.set()
        # The whole picture: the held keys flow as after a full start.
        assert wait(lambda: phase(kube, ns, "in-a-gang") == "Bound"), phase(kube, ns, "in-a-gang")
        reserved = [a["elasticGPU"] for g in (kube.get_gpu(f"gpu-{cluster.prefix}-e{i}") for i in range(2))
                    for a in (g.get("status") or {}).get("allocations") or []]
        assert len(reserved) == len(set(reserved)), f"a reservation doubled: {reserved}"
        assert egpu_name in reserved
    finally:
        held.release.set()
        stopped(stop, thread)


def test_a_claim_in_a_namespace_with_a_quota_waits_for_the_whole_picture_through_failed_lists(
        kube_cluster: Any, cluster: Cluster, kube: KubeApi) -> None:
    ns = cluster.namespace
    class_name = cards(cluster, count=1)
    kube._call("POST", kube.collection_path("quota", ns), body={
        "apiVersion": names.API_VERSION, "kind": names.KIND_QUOTA, "metadata": {"name": "team"},
        "spec": {"hard": {names.RESOURCE_CORE: 100}}})
    held, stop, thread = _start(kube_cluster, ns)
    held.fail_egpus = 2  # the rest of the lists fails midway twice: retried, nothing lost or doubled
    try:
        assert held.holding.wait(DEADLINE_S), "the controller never listed ElasticGPUs or pods"
        cluster.claim(o.claim("quota-counted", cores=10, memory="1Gi", class_name=class_name))
        # Its quota is charged from a picture not whole yet: it must not bind on a guess.
        assert not wait(lambda: phase(kube, ns, "quota-counted") is not None, timeout_s=3.0)
        held.release.set()
        assert wait(lambda: phase(kube, ns, "quota-counted") == "Bound"), phase(kube, ns, "quota-counted")
        allocations = (kube.get_gpu(f"gpu-{cluster.prefix}-e0").get("status") or {}).get("allocations") or []
        assert len(allocations) == 1, allocations  # reserved once, through the failed lists
    finally:
        held.release.set()
        stopped(stop, thread)
