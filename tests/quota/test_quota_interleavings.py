"""A quota's charges against every interleaving hypothesis draws of bind, expand, shrink, delete
and resync, run by the real controller against the API server (issue 23, item 1).

Each example is a fresh namespace with one card, a resizable class and a quota, and a sequence
of user steps: create a claim, expand it, shrink it, delete it, or let the repair run. Before
every write the controller makes (a charge, a reservation, a freed reservation, a claim or an
ElasticGPU write), hypothesis decides whether the repair thread's quota resync runs right
there, so a resync lands between a charge and its GPU write, between a shrink's GPU write and
its give-back, between a release and the freeing of its reservation, and so on. At each of
those points and after each step, read live from the API server:

- no claim is charged less than the GPU objects reserve for it (cores and memory);
- what the namespace reserves on the card never exceeds the quota's hard limit;
- `status.used` is the sum of the charges.

Once settled (the steps done, then one resync with the grace over), `used` equals what the
namespace's claims reserve, and is within hard. The figures (examples, steps, resyncs injected,
checks) are printed; any overrun fails the test.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client

from elasticgpu.api import names
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.process.reconciling import Controller
from elasticgpu.controller.settings import BindingSettings, ControllerSettings, QuotaSettings, ResyncSettings
from tests.binding import conftest as binding
from tests.binding import objects as o
from tests.quota import quotas

CORE, MEMORY = names.RESOURCE_CORE, names.RESOURCE_MEMORY
WRITES = ("replace_gpu_status", "replace_quota_status", "patch_claim", "patch_claim_status", "patch_elastic_gpu",
          "patch_elastic_gpu_status", "create_elastic_gpu", "delete_elastic_gpu")
"""The controller's writes before which the quota resync may run."""

sizes = st.sampled_from([10, 20, 30, 40, 50])
steps = st.lists(st.one_of(
    st.tuples(st.just("bind"), st.integers(0, 3), sizes),
    st.tuples(st.just("resize"), st.integers(0, 3), sizes),
    st.tuples(st.just("delete"), st.integers(0, 3), st.just(0)),
    st.tuples(st.just("resync"), st.just(0), st.just(0)),
), min_size=2, max_size=9)


@dataclasses.dataclass
class Figures:
    examples: int = 0
    steps: int = 0
    injected: int = 0
    checks: int = 0
    overruns: int = 0


def _reserved(kube: KubeApi, gpu_name: str, namespace: str) -> dict[str, tuple[int, int]]:
    """By claim uid, (cores, memory MiB) the GPU object reserves for the claims of `namespace`."""
    found: dict[str, tuple[int, int]] = {}
    for a in (kube.get_gpu(gpu_name).get("status") or {}).get("allocations") or []:
        ref = a.get("claimRef") or {}
        if ref.get("namespace") == namespace and ref.get("uid"):
            cores, memory = found.get(ref["uid"], (0, 0))
            found[ref["uid"]] = (cores + a.get("cores", 0), memory + a.get("memory", 0))
    return found


def _check(kube: KubeApi, api_client: client.ApiClient, namespace: str, gpu_name: str, hard: int,
           figures: Figures, where: str) -> list[str]:
    """The invariants at one point, read live (see the module docstring): what is wrong, if anything."""
    figures.checks += 1
    status = quotas.get(api_client, namespace, "q").get("status") or {}
    charges = {c["uid"]: c for c in status.get("charges") or []}
    reserved = _reserved(kube, gpu_name, namespace)
    wrong = []
    summed = sum(c.get("cores", 0) for c in charges.values())
    if (status.get("used") or {}).get(CORE, 0) != summed:
        wrong.append(f"{where}: used is not the sum of charges: {status}")
    under = {uid: (held, (charges.get(uid, {}).get("cores", 0), charges.get(uid, {}).get("memory", 0)))
             for uid, held in reserved.items()
             if charges.get(uid, {}).get("cores", 0) < held[0] or charges.get(uid, {}).get("memory", 0) < held[1]}
    if under:
        wrong.append(f"{where}: claims charged less than reserved (uid: (reserved, charged) cores, MiB): {under}")
    total = sum(cores for cores, _memory in reserved.values())
    if total > hard:
        wrong.append(f"{where}: the namespace reserves {total} cores under a quota of {hard}")
    if wrong:
        figures.overruns += 1
    return wrong


def _controller_kube(kube_cluster: Any) -> KubeApi:
    return KubeApi.from_kubeconfig(str(kube_cluster.kubeconfig))


def test_quota_charges_cover_reservations_under_every_interleaving(
        kube: KubeApi, api_client: client.ApiClient, kube_cluster: Any) -> None:
    figures = Figures()
    core = client.CoreV1Api(api_client)

    @settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(hard=st.sampled_from([60, 80, 100]), plan=steps, data=st.data())
    def run(hard: int, plan: list[tuple[str, int, int]], data: st.DataObject) -> None:
        figures.examples += 1
        namespace = f"t-{uuid.uuid4().hex[:12]}"
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
            name=namespace, labels={"elasticgpu-test": "1"})))
        cluster = binding.Cluster(kube, namespace)
        own = _controller_kube(kube_cluster)
        try:
            model = f"T{namespace}"
            gpu_name = f"gpu-{namespace}"
            cluster.gpu(o.gpu(gpu_name, node=f"{namespace}-n", model=model))
            class_name = f"{namespace}-class"
            body = o.klass(class_name, parameters={"gpuModel": model})
            body["allowClaimResize"] = True
            cluster.klass(body)
            quotas.create(api_client, namespace, quotas.quota("q", {CORE: hard}))
            controller = Controller(own, ControllerSettings(
                binding=BindingSettings(workers=0), resync=ResyncSettings(orphan_grace_s=60.0),
                quota=QuotaSettings(recheck_s=30.0, refresh_s=0.0)), namespace=namespace)
            guard = controller.quota
            main = threading.current_thread()
            busy = threading.Lock()

            found: list[str] = []

            def check(where: str) -> None:
                # Recorded, not raised: a check inside the controller's write would be caught by its worker.
                found.extend(_check(kube, api_client, namespace, gpu_name, hard, figures, where))

            def wrap(name: str, write: Callable[..., Any]) -> Callable[..., Any]:
                def before_write(*args: Any, **kwargs: Any) -> Any:
                    if threading.current_thread() is main and busy.acquire(blocking=False):
                        try:
                            check(f"before {name}")
                            if data.draw(st.booleans(), label=f"resync before {name}"):
                                figures.injected += 1
                                guard.resync()
                                check(f"after a resync before {name}")
                        finally:
                            busy.release()
                    return write(*args, **kwargs)
                return before_write

            for name in WRITES:
                setattr(own, name, wrap(name, getattr(own, name)))
            binding.settle(controller, deadline_s=15.0)
            live: dict[int, str] = {}
            for op, index, cores in plan:
                figures.steps += 1
                claim = f"c{index}"
                if op == "bind" and index not in live:
                    cluster.claim(o.claim(claim, cores=cores, memory="4Gi", class_name=class_name))
                    live[index] = claim
                elif op == "resize" and index in live:
                    if (cluster.get_claim(claim).get("status") or {}).get("phase") == "Bound":
                        kube.patch_claim(namespace, claim, {"spec": {"resources": {"requests": {CORE: cores}}}})
                elif op == "delete" and index in live:
                    kube.delete_claim(namespace, claim)
                    del live[index]
                elif op == "resync":
                    controller.resync(relist=False)
                binding.settle(controller, deadline_s=15.0)
                check(f"after {op} {claim}")

            # Settled: the grace over, one more resync; used is exactly what is reserved.
            guard.settings = dataclasses.replace(guard.settings, resync=ResyncSettings(orphan_grace_s=0.0))
            controller.resync(relist=False)
            binding.settle(controller, deadline_s=15.0)
            check("settled")
            status = quotas.get(api_client, namespace, "q").get("status") or {}
            reserved = _reserved(kube, gpu_name, namespace)
            assert (status.get("used") or {}).get(CORE, 0) == sum(c for c, _m in reserved.values()) <= hard, (
                status, reserved)
            assert {c["uid"]: (c["cores"], c["memory"]) for c in status.get("charges") or []} == reserved
        finally:
            binding.stop_watches()
            cluster.cleanup()
            own.close()
            try:
                core.delete_namespace(namespace)
            except client.ApiException as err:
                if err.status != 404:
                    raise

    started = time.monotonic()
    run()
    print(f"\nquota interleavings: {figures.examples} examples, {figures.steps} steps, {figures.injected} resyncs"
          f" injected before a controller write, {figures.checks} live checks, {figures.overruns} overruns"
          f" ({time.monotonic() - started:.0f} s)")
    assert figures.overruns == 0
    assert figures.injected > 0 and figures.examples > 0
