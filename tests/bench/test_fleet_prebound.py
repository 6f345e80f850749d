"""`bench/fleet_controller.py --prebound` writes the bound state as the controller would leave it
(bench/fleet_prebound.py): a controller started on it binds nothing, lifts nothing, repairs
nothing. Proven on the test API server: a real `Controller` lists it all and works its queue off
(`settle`), and not one object of the test changes (every resourceVersion as before).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from elasticgpu.api import names
from elasticgpu.controller import errors
from elasticgpu.controller.decisions import pod_gate
from elasticgpu.controller.edge.kube import KubeApi
from tests.bench import bench_module
from tests.binding import objects as o
from tests.binding.conftest import Cluster, cluster, kube, new_controller, settle

__all__ = ["cluster", "kube"]

REPO = Path(__file__).resolve().parents[2]
CARDS, CLAIMS = 4, 10
"""10 claims of 25 cores on 4 cards: the cards filled but for 6 slices; 8 of them pods' inline claims."""


@pytest.fixture(scope="module")
def prebound() -> ModuleType:
    return bench_module.load("fleet_prebound", "fleet_prebound.py")


def versions(kube: KubeApi, namespace: str, gpus: list[str]) -> dict[tuple[str, str], str]:
    """The resourceVersion of every object of the test: its claims, pods, ElasticGPUs and GPUs."""
    seen = {("claim", c["metadata"]["name"]): c["metadata"]["resourceVersion"] for c in kube.list_claims(namespace)}
    seen.update({("pod", p["metadata"]["name"]): p["metadata"]["resourceVersion"] for p in kube.list_pods(namespace)})
    seen.update({("egpu", e["metadata"]["name"]): e["metadata"]["resourceVersion"] for e in kube.list_elastic_gpus()
                 if ((e.get("spec") or {}).get("claimRef") or {}).get("namespace") == namespace})
    seen.update({("gpu", g): kube.get_gpu(g)["metadata"]["resourceVersion"] for g in gpus})
    return seen


@pytest.mark.timeout(240)
def test_a_controller_started_on_the_prebound_state_writes_nothing(prebound: ModuleType, cluster: Cluster,
                                                                   kube: KubeApi, kube_cluster: Any) -> None:
    model, class_name = f"T{cluster.prefix}", f"{cluster.prefix}-class"
    cluster.klass(o.klass(class_name, parameters={"gpuModel": model}))
    gpus = [o.gpu(f"gpu-{cluster.prefix}-{i}", node=f"{cluster.prefix}-n", index=i, model=model) for i in range(CARDS)]
    gpu_names = [g["metadata"]["name"] for g in gpus]
    try:
        took = prebound.prebind_range(
            str(kube_cluster.kubeconfig), cluster.namespace, gpus, list(range(CLAIMS)),
            user_claim=o.claim("unnamed", cores=25, memory="10Gi", class_name=class_name),
            pod_request=f"gpu-core=25,gpu-memory=10Gi,class={class_name}", pods_percent=80, threads=4)
        assert (took["claims"], took["pods"]) == (CLAIMS, 8)

        claims = {c["metadata"]["name"]: c for c in kube.list_claims(cluster.namespace)}
        assert len(claims) == CLAIMS and all(c["status"]["phase"] == "Bound" for c in claims.values()), claims
        pods = kube.list_pods(cluster.namespace)
        assert len(pods) == 8 and not any(pod_gate.is_gated(p) for p in pods)
        for pod in pods:
            inline = claims[f"{pod['metadata']['name']}-main"]
            assert inline["status"]["users"] == [{"name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}]
            assert pod_gate.pinned_node(pod) == inline["status"]["nodeName"]
        held: dict[str, int] = {}
        for name in gpu_names:
            for allocation in kube.get_gpu(name).get("status", {}).get("allocations") or []:
                held[allocation["elasticGPU"]] = held.get(allocation["elasticGPU"], 0) + 1
        for claim in claims.values():
            egpu = kube.get_elastic_gpu(claim["spec"]["elasticGPUName"])
            assert egpu["status"]["phase"] == "Bound" and egpu["spec"]["claimRef"]["uid"] == claim["metadata"]["uid"]
            assert held.get(egpu["metadata"]["name"]) == 1, held
            assert names.FINALIZER_CLAIM_PROTECTION in claim["metadata"]["finalizers"]

        before = versions(kube, cluster.namespace, gpu_names)
        controller = new_controller(kube, cluster.namespace)
        try:
            settle(controller, deadline_s=90)
        finally:
            controller.close()
        after = versions(kube, cluster.namespace, gpu_names)
        changed = sorted(key for key in before if after.get(key) != before[key])
        assert not changed and after.keys() == before.keys(), f"the controller wrote {changed}"
    finally:
        for name in gpu_names:
            with contextlib.suppress(errors.NotFound):
                kube.delete_gpu(name)
