"""Two controllers resize claims on their own (`resizePolicy: Auto`) at the same time.

Each controller keeps its own window of measured use and decides alone; both see the same
samples and both want every claim bigger, more than the card has. With the GPU CRD's allocation
guard removed, only the resourceVersion preconditions (the claim's spec patch, the GPU write)
keep the card whole. A reader samples the card all along. In the end every claim asks what the
recommendation says (both controllers agree), each claim holds what its statuses say, and a claim
that could not grow says why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from elasticgpu.api import names
from elasticgpu.controller.edge.kube import KubeApi
from tests.binding import objects as o
from tests.binding.conftest import Cluster
from tests.binding.processes import CardSampler, ControllerProcesses, wait_quiescent
from tests.binding.test_race import unguarded  # noqa: F401  (a fixture: the GPU CRD without its guard)

CORE, MEMORY = names.RESOURCE_CORE, names.RESOURCE_MEMORY
CLAIMS = 4
SAMPLES = [(30, 1500), (37, 1800), (33, 2000)]
"""Each claim's measured use, as its agent writes it: peak 37 % and 2000 MiB, +20 %: 45 % and
2560 MiB (rounded up to 5 % and 256 MiB). Of four claims of 15 % on one card, one can grow so."""
WANT = {CORE: 45, MEMORY: "2560Mi"}


def _condition(claim: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in (claim.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)


@pytest.mark.usefixtures("unguarded")
def test_two_controllers_auto_resizing_the_same_claims_never_oversubscribe(
        cluster: Cluster, kube: KubeApi, kube_cluster: Any, tmp_path: Path) -> None:
    model = f"T{cluster.prefix}"
    gpu = f"gpu-{cluster.prefix}-0"
    cluster.gpu(o.gpu(gpu, node=f"{cluster.prefix}-node", index=0, model=model))
    class_name = f"{cluster.prefix}-class"
    cluster.klass({**o.klass(class_name, provisioner=names.PROVISIONER_GPUSHARE, parameters={"gpuModel": model}),
                   "allowClaimResize": True, "resizePolicy": "Auto"})
    for i in range(CLAIMS):
        cluster.claim(o.claim(f"c{i}", cores=15, memory="1Gi", class_name=class_name))
    procs = ControllerProcesses(kube_cluster.kubeconfig, cluster.namespace, tmp_path)
    procs.flags += ["--log-level", "info"]
    sampler = CardSampler(kube, gpu)
    try:
        procs.start()
        procs.start()
        wait_quiescent(kube, cluster.namespace, quiet_s=2.0, deadline_s=600, stall_s=120, procs=procs,
                       done=lambda cs: len(cs) == CLAIMS
                       and all((c.get("status") or {}).get("phase") == "Bound" for c in cs))
        sampler.start()
        for second, (cores, memory) in enumerate(SAMPLES):
            for i in range(CLAIMS):  # as the agents write it: every claim's use, one sample each
                kube.patch_claim_status(cluster.namespace, f"c{i}", {"status": {"usage": {
                    "coresUsed": cores, "memoryUsed": memory, "updateTime": f"2026-01-01T00:00:{second:02d}Z"}}})
        # Two controllers on a loaded machine may take long, but they keep changing the claims while they
        # work: fail on no progress for 120 s (as before), or after 600 s in all.
        claims = wait_quiescent(kube, cluster.namespace, quiet_s=3.0, deadline_s=600, stall_s=120, procs=procs,
                                done=lambda cs: all(c["spec"]["resources"]["requests"] == WANT for c in cs))
        sampler.stop()

        gpu_body = kube.get_gpu(gpu)
        allocations = {a["elasticGPU"]: a for a in gpu_body["status"].get("allocations") or []}
        grown = 0
        for claim in claims:
            allocation = allocations[names.elastic_gpu_name_for_claim(claim["metadata"]["uid"])]
            status = claim["status"]
            assert status["capacity"] == status["allocatedResources"], status
            assert int(status["capacity"][CORE]) == allocation["cores"], (status, allocation, procs.logs(200))
            if allocation["cores"] == WANT[CORE]:
                grown += 1
            else:
                resizing = _condition(claim, "Resizing")
                assert allocation["cores"] == 15 and resizing is not None, (status, allocation)
                assert resizing["reason"] == "NoRoomOnCard", resizing
        # Four claims of 15 % hold 60: one grows to 45 (90 in all), a second would make 120.
        assert grown == 1, f"{grown} Auto resizes went through, want 1: {allocations}\n{procs.logs()}"
        assert sum(a["cores"] for a in allocations.values()) <= 100, allocations
        sampler.assert_never_over(gpu_body["spec"]["memory"])
        for proc in procs.procs:
            assert proc.poll() is None, "a controller exited\n" + procs.logs()
    finally:
        sampler.stop()
        procs.close()
