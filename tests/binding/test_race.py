"""The HA promise: two controller processes against one server (one watching with the
controller's own client, one with kopf), 500 claims competing for room for 200. No card is
oversubscribed, every claim ends Bound or Pending with a reason, no claim gets two
ElasticGPUs, and all the room is used."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from elasticgpu.controller.kube import KubeApi
from tests.binding import objects as o
from tests.binding.conftest import Cluster
from tests.binding.processes import ControllerProcesses, check_invariants, wait_quiescent

CARDS = 50
CORES = 25  # four claims per card: room for 200
CLAIMS = 500


def _create_claims(cluster: Cluster, names: range, class_name: str) -> None:
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: cluster.claim(o.claim(f"c{i}", cores=CORES, memory="1Gi", class_name=class_name)),
                      names))


def test_two_controllers_race_for_capacity(cluster: Cluster, kube: KubeApi, kube_cluster: Any,
                                           tmp_path: Path) -> None:
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

    procs = ControllerProcesses(kube_cluster.kubeconfig, cluster.namespace, tmp_path)
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
