"""A hung list of quotas delays one bind, never every bind of the controller.

The quota guard learns which namespaces have an ElasticGPUQuota from a list of every quota, at
most `QuotaSettings.refresh_s` (2 s) old. It used to make that list in the bind path while
holding its lock, with a large list's 60 s timeout: one list on a half-open connection (seen in
the fault test, `test_controller_under_faults.py`: new claims not bound within 90 s) stopped
every bind of the controller for a minute, again at each refresh. Here every cluster-wide list of
quotas hangs (the fault proxy holds it open, silent), while everything else works: claims of a
namespace without a quota must still bind within seconds of their creation.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from elasticgpu.controller.edge.kube import KubeApi
from tests.binding import objects as o
from tests.binding.conftest import Cluster
from tests.binding.processes import ControllerProcesses
from tests.faults.proxy import FaultPlan, fault_proxy

CLAIMS = 12
EVERY_S = 2.5  # one claim each 2.5 s: 30 s of creations, several refreshes of the quota list
BOUND_WITHIN_S = 15.0
"""A claim's creation to its Bound phase. The bind that happens to make the hung list waits the
request timeout (10 s) and then reads its namespace's quotas live; the others never wait for it.
Before the fix a claim created while the list hung waited up to its 60 s timeout."""
CLUSTER_QUOTA_LIST = r"^list /apis/[^/]+/[^/]+/elasticgpuquotas$"  # every quota; a namespace's own list works
QUOTA_WATCH = r"^watch .*/elasticgpuquotas$"
"""Refused throughout: with its quota watch working the guard lists no quota at all (see
test_quota_watch.py); refused, it falls back to listing every quota, the path tested here."""
NO_QUOTA_WATCH = {"watch": {"500": 1.0}}


def _bound_times(kube: KubeApi, namespace: str, stop: threading.Event, seen: dict[str, float]) -> None:
    while not stop.is_set():
        for claim in kube.list_claims(namespace):
            if (claim.get("status") or {}).get("phase") == "Bound":
                seen.setdefault(claim["metadata"]["name"], time.monotonic())
        stop.wait(0.2)


def test_a_hung_quota_list_does_not_stop_binding(cluster: Cluster, kube: KubeApi, kube_cluster: Any,
                                                 tmp_path: Path) -> None:
    model = f"Q{cluster.prefix}"
    for i in range(4):
        cluster.gpu(o.gpu(f"gpu-{cluster.prefix}-{i}", node=f"{cluster.prefix}-n", index=i, model=model))
    class_name = f"{cluster.prefix}-class"
    cluster.klass(o.klass(class_name, parameters={"gpuModel": model}))

    no_watch = FaultPlan(seed=7, verbs=NO_QUOTA_WATCH, paths=(QUOTA_WATCH,))
    with fault_proxy(kube_cluster, no_watch, directory=tmp_path) as (proxy, kubeconfig):
        procs = ControllerProcesses(kubeconfig, cluster.namespace, tmp_path)
        seen: dict[str, float] = {}
        stop = threading.Event()
        watcher = threading.Thread(target=_bound_times, args=(kube, cluster.namespace, stop, seen), daemon=True)
        try:
            proc = procs.start()
            watcher.start()
            # A first claim binds with every list working: the controller is up and has listed quotas.
            cluster.claim(o.claim("first", cores=5, memory="1Gi", class_name=class_name))
            deadline = time.monotonic() + 60
            while "first" not in seen:
                assert time.monotonic() < deadline, "the first claim was not bound within 60 s\n" + procs.logs()
                time.sleep(0.1)

            proxy.set_plan(FaultPlan(seed=7, verbs={**NO_QUOTA_WATCH, "list": {"half-open": 1.0}},
                                     paths=(QUOTA_WATCH, CLUSTER_QUOTA_LIST)))
            created: dict[str, float] = {}
            for i in range(CLAIMS):
                name = f"c{i}"
                cluster.claim(o.claim(name, cores=5, memory="1Gi", class_name=class_name))
                created[name] = time.monotonic()
                time.sleep(EVERY_S)
            deadline = time.monotonic() + BOUND_WITHIN_S
            while not created.keys() <= seen.keys() and time.monotonic() < deadline:
                time.sleep(0.2)
            waits = {name: round(seen.get(name, time.monotonic()) - at, 1) for name, at in created.items()}
            late = {name: wait for name, wait in waits.items() if wait > BOUND_WITHIN_S}
            assert not late, (f"claims bound later than {BOUND_WITHIN_S:g} s after their creation (or not at all):"
                              f" {late}; all: {waits}\n{proxy.summary()}\n{procs.logs()}")
            hung = proxy.count(fault="half-open", verb="list")
            assert hung >= 2, f"the quota list hung only {hung} time(s): the test did not test\n{proxy.summary()}"
            assert proc.poll() is None, "the controller exited\n" + procs.logs()
        finally:
            stop.set()
            watcher.join(5)
            procs.close()
