"""The controller knows which namespaces have an ElasticGPUQuota from a watch, not a poll.

Before, the bind path listed every quota of the cluster at most every 2 s while claims were being
bound (a cluster-wide LIST, heavy on a cluster with many quotas), and a quota created less than
2 s before a claim could be missed (the claim bound uncharged, the resync charged it later).
Here a controller process runs behind the fault proxy with no faults, only to count its requests.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from kubernetes import client

from elasticgpu.api import names
from elasticgpu.controller.edge.kube import KubeApi
from tests.binding import objects as o
from tests.binding.conftest import Cluster
from tests.binding.processes import ControllerProcesses
from tests.faults.proxy import FaultPlan, fault_proxy
from tests.quota import quotas

CLUSTER_QUOTA_LIST = f"list /apis/{names.GROUP}/{names.VERSION}/{names.PLURAL_QUOTA}"


def _phase(kube: KubeApi, namespace: str, name: str) -> tuple[str | None, str | None]:
    status = kube.get_claim(namespace, name).get("status") or {}
    conditions = status.get("conditions") or [{}]
    return status.get("phase"), conditions[0].get("reason")


def _wait_phase(kube: KubeApi, namespace: str, name: str, want: str, procs: ControllerProcesses,
                within_s: float = 30.0) -> str | None:
    deadline = time.monotonic() + within_s
    while True:
        phase, reason = _phase(kube, namespace, name)
        if phase == want:
            return reason
        assert time.monotonic() < deadline, f"claim {name}: {phase} ({reason}) after {within_s:g} s\n{procs.logs()}"
        time.sleep(0.1)


def test_binding_reads_no_quota_list_and_a_new_quota_applies_at_once(
        cluster: Cluster, kube: KubeApi, kube_cluster: Any, api_client: client.ApiClient, tmp_path: Path) -> None:
    model = f"W{cluster.prefix}"
    for i in range(2):
        cluster.gpu(o.gpu(f"gpu-{cluster.prefix}-{i}", node=f"{cluster.prefix}-n", index=i, model=model))
    class_name = f"{cluster.prefix}-class"
    cluster.klass(o.klass(class_name, parameters={"gpuModel": model}))

    with fault_proxy(kube_cluster, FaultPlan(seed=3), directory=tmp_path) as (proxy, kubeconfig):
        procs = ControllerProcesses(kubeconfig, None, tmp_path)  # cluster-wide: its quota watch is too
        try:
            proc = procs.start()
            cluster.claim(o.claim("first", cores=5, memory="1Gi", class_name=class_name))
            _wait_phase(kube, cluster.namespace, "first", "Bound", procs, within_s=60)
            before = proxy.by_target[CLUSTER_QUOTA_LIST]
            for i in range(8):  # 8 s of binding: four refreshes of the old 2 s poll
                cluster.claim(o.claim(f"c{i}", cores=5, memory="1Gi", class_name=class_name))
                time.sleep(1.0)
            for i in range(8):
                _wait_phase(kube, cluster.namespace, f"c{i}", "Bound", procs)
            polled = proxy.by_target[CLUSTER_QUOTA_LIST] - before
            assert polled == 0, f"binding listed every quota {polled} times: {proxy.summary()}"

            # A quota smaller than the next claim, and at once that claim: refused, not bound and charged later.
            quotas.create(api_client, cluster.namespace, quotas.quota("tight", {names.RESOURCE_CORE: 5}))
            cluster.claim(o.claim("over", cores=10, memory="1Gi", class_name=class_name))
            reason = _wait_phase(kube, cluster.namespace, "over", "Pending", procs)
            assert reason == "QuotaExceeded", reason
            assert proc.poll() is None, "the controller exited\n" + procs.logs()
        finally:
            procs.close()
