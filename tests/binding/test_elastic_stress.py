"""A short run of bench/elastic_stress.py (issue 17, Measure 2): two controller processes, a
resizable class, quotas, 8 threads of random expand / shrink / create / delete; afterwards no
card is oversubscribed, no quota exceeded and no reservation leaked, read from the API objects.
And the checks themselves: each counts a planted fault (so a zero means something)."""

from __future__ import annotations

import importlib.util
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from kubernetes import client

from elasticgpu.api import names
from elasticgpu.controller.edge.kube import KubeApi
from tests.binding import objects as o
from tests.binding.conftest import Cluster

REPO = Path(__file__).resolve().parents[2]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("elastic_stress_bench", REPO / "bench" / "elastic_stress.py")
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    sys.modules["elastic_stress_bench"] = bench  # dataclasses look their module up
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.timeout(420)
def test_random_resizes_creates_and_deletes_leave_no_oversubscription_no_quota_excess_no_leak(
        kube_cluster: Any, crds_installed: list[str], tmp_path: Path) -> None:
    bench = _bench()
    report = bench.stress(kube_cluster.kubeconfig, seconds=10, threads=8, log_dir=tmp_path,
                          prefix=f"st-{uuid.uuid4().hex[:6]}")
    report.print()
    logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(tmp_path.glob("controller-*.log")))
    assert report.oversubscribed == [], logs
    assert report.quota_exceeded == [], logs
    assert report.leaked == [], logs
    # The run did what it claims: claims were made, and resizes were carried out both ways.
    assert report.ops["create"] + report.ops["create whole card"] >= 30, report.ops
    assert report.latencies_ms["expand"] and report.latencies_ms["shrink"], report.ops


def test_the_checks_count_planted_faults(cluster: Cluster, kube: KubeApi, api_client: client.ApiClient) -> None:
    """A reservation of a claim that does not exist (a leak), charged to a namespace whose quota
    it exceeds; and a Bound-looking claim is not needed: the leak and the excess are enough."""
    bench = _bench()
    gpu_name = f"gpu-{cluster.prefix}-planted"
    egpu_name = f"{cluster.prefix}-orphan"
    cluster.gpu(o.gpu(gpu_name, node=f"{cluster.prefix}-n", allocations=None))
    ref = {"apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM, "namespace": cluster.namespace,
           "name": "gone", "uid": str(uuid.uuid4())}
    cluster.egpu(o.share_egpu(egpu_name, gpu_name, cores=40, memory="8Gi", claim_ref=ref))
    body = kube.get_gpu(gpu_name)
    body["status"] = {"allocations": [{"elasticGPU": egpu_name, "cores": 40, "memory": 8192, "exclusive": False}]}
    kube.replace_gpu_status(body)
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        names.GROUP, names.VERSION, cluster.namespace, names.PLURAL_QUOTA,
        {"apiVersion": names.API_VERSION, "kind": names.KIND_QUOTA, "metadata": {"name": "small"},
         "spec": {"hard": {names.RESOURCE_CORE: 30}}})
    report = bench.Report()
    bench.check(kube, [cluster.namespace], [gpu_name], report)
    assert len(report.leaked) == 1 and egpu_name in report.leaked[0], report.leaked
    assert len(report.quota_exceeded) == 1 and "used 40 > hard 30" in report.quota_exceeded[0], report.quota_exceeded
    assert report.oversubscribed == []
