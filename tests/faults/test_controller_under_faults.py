"""The controller under a faulty network and a flaky API server: a real controller process talks
to the test API server through the fault proxy (`proxy.py`), which answers 404 / 409 / 422 / 500
/ 503 for requests it never forwards, 500 for writes it did forward, holds answers back, drops
connections before and after forwarding, leaves them half-open, and cuts or silences watches,
all at random (seeded) on reads, writes and watches.

Meanwhile 500 claims are created and 200 of them deleted again at random moments (some while
they are being bound), competing for room for 200. The user's requests go straight to the
server: only the controller suffers the faults. In the end, with the faults still on:

- no card is oversubscribed, no reservation or ElasticGPU is left over from a deleted claim;
- every claim is Bound or Pending with a reason, and all the room is used;
- the controller process is alive and still binds new claims.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from elasticgpu.controller import errors
from elasticgpu.controller.edge.kube import WATCH_READ_MARGIN_S, KubeApi
from elasticgpu.controller.settings import WatchSettings
from tests.binding import objects as o
from tests.binding.conftest import Cluster
from tests.binding.processes import ControllerProcesses, check_invariants, eventually, room_report, wait_quiescent
from tests.faults.proxy import FaultPlan, fault_proxy

CARDS = 50
CORES = 25  # four claims per card: room for 200
CLAIMS = 500
DELETED = 200  # of the 500, deleted again: 300 remain for room for 200
SEED = int(os.environ.get("ELASTICGPU_FAULT_SEED", "20261203"))
"""The plan's and the churn's seed; set ELASTICGPU_FAULT_SEED to try other fault patterns."""

PLAN = FaultPlan(
    seed=SEED,
    verbs={
        # No 404 on reads: a GET answered 404 while the object exists is a lie no API server
        # tells (reads are quorum reads), and the repair rightly frees the reservation of an
        # ElasticGPU a live GET says is gone. A 404 on a write is the race of a deletion.
        "read": {"500": 0.02, "503": 0.02, "429": 0.01, "slow": 0.02, "drop": 0.01, "half-open": 0.005},
        "write": {"404": 0.02, "409": 0.03, "422": 0.01, "500": 0.02, "503": 0.02, "500-after": 0.02,
                  "slow": 0.02, "drop": 0.01, "drop-after": 0.01, "half-open": 0.005},
        # Watches break often: most are cut or silenced within seconds, so each kind is
        # reopened many times while claims come and go (a silent one must be given up).
        "watch": {"500": 0.05, "410": 0.05, "drop-after": 0.4, "half-open": 0.1},
    },
    slow_s=(0.2, 1.5),
    cut_after_s=(1.0, 15.0),
)


def _phase(claim: dict[str, Any]) -> str | None:
    return (claim.get("status") or {}).get("phase")


def _churn(cluster: Cluster, kube: KubeApi, class_name: str, rng: random.Random) -> None:
    """Create CLAIMS claims from 8 threads; delete DELETED of them (chosen by `rng`) 0-2 s after
    each was created, so some deletions land while the controller binds them."""
    doomed = set(rng.sample(range(CLAIMS), DELETED))
    delays = {i: rng.uniform(0.0, 2.0) for i in doomed}
    timers: list[threading.Timer] = []

    def delete(name: str) -> None:
        with contextlib.suppress(errors.NotFound):
            kube.delete_claim(cluster.namespace, name)

    def create(i: int) -> None:
        cluster.claim(o.claim(f"c{i}", cores=CORES, memory="1Gi", class_name=class_name))
        if i in doomed:
            timer = threading.Timer(delays[i], delete, args=(f"c{i}",))
            timer.daemon = True
            timers.append(timer)
            timer.start()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, range(CLAIMS)))
    for timer in timers:
        timer.join(timeout=10)


def test_500_claims_with_churn_under_faults(cluster: Cluster, kube: KubeApi, kube_cluster: Any,
                                           tmp_path: Path) -> None:
    rng = random.Random(SEED)
    model = f"T{cluster.prefix}"
    gpu_names = [f"gpu-{cluster.prefix}-{i}" for i in range(CARDS)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: cluster.gpu(o.gpu(gpu_names[i], node=f"{cluster.prefix}-n{i // 8}", index=i % 8,
                                                   model=model)), range(CARDS)))
    class_name = f"{cluster.prefix}-class"
    cluster.klass(o.klass(class_name, parameters={"gpuModel": model}))

    with fault_proxy(kube_cluster, PLAN, directory=tmp_path) as (proxy, kubeconfig):
        # Resync every 5 s and free orphan reservations after 10 s, so that repairs happen
        # within the test's deadlines (the defaults are 30 s and 60 s). The short grace also
        # widens the window in which a repair may free a reservation whose ElasticGPU is still
        # being created: the binding must survive that too.
        procs = ControllerProcesses(kubeconfig, cluster.namespace, tmp_path,
                                    env={"ELASTICGPU_RESYNC_INTERVAL_S": "5", "ELASTICGPU_ORPHAN_GRACE_S": "10"},
                                    flags=["--no-leader-elect", "--health-port", "0", "--log-level", "info"])
        try:
            proc = procs.start()
            _churn(cluster, kube, class_name, rng)
            remaining = CLAIMS - DELETED
            room = CARDS * 100 // CORES
            claims = wait_quiescent(
                # Quiet for longer than a resync plus the grace: a reservation left by a failed
                # create is freed by then, so what remains is a leak, not a repair under way.
                kube, cluster.namespace, quiet_s=16.0, deadline_s=300.0, procs=procs,
                explain=lambda: room_report(kube, cluster.namespace, gpu_names),
                done=lambda cs: len(cs) == remaining
                and not any(c["metadata"].get("deletionTimestamp") for c in cs)
                and all(_phase(c) for c in cs)
                and sum(_phase(c) == "Bound" for c in cs) >= min(room, remaining),
            )
            assert proc.poll() is None, "the controller exited\n" + procs.logs()

            def settled() -> list[dict[str, Any]]:
                # The claims are quiet, but a deleted claim's ElasticGPU may still be in its
                # reclaim's retry backoff (up to a minute under these faults): nothing may be
                # left once that has passed.
                now = kube.list_claims(cluster.namespace)
                phases = check_invariants(kube, cluster.namespace, now, gpu_names)
                assert phases == {"Bound": room, "Pending": remaining - room}, (phases, proxy.summary())
                # No ElasticGPU outlived its claim's deletion or waits for a claim that is not Bound.
                bound = {c["spec"].get("elasticGPUName") for c in now if _phase(c) == "Bound"}
                egpus = {e["metadata"]["name"] for e in kube.list_elastic_gpus()
                         if (e["spec"].get("claimRef") or {}).get("namespace") == cluster.namespace}
                assert egpus == bound, sorted(egpus ^ bound)[:10]
                return now

            claims = eventually(settled, deadline_s=150.0,
                                explain=lambda: room_report(kube, cluster.namespace, gpu_names) + "\n" + procs.logs())
            pending = [c for c in claims if _phase(c) == "Pending"]
            assert {c["status"]["conditions"][0]["reason"] for c in pending} == {"NoCapacity"}

            # Still binding: new cards of another model, and claims for them, faults still on.
            new_model = f"U{cluster.prefix}"
            for i in range(5):
                cluster.gpu(o.gpu(f"gpu-{cluster.prefix}-new-{i}", node=f"{cluster.prefix}-new", index=i,
                                  model=new_model))
            new_class = f"{cluster.prefix}-new"
            cluster.klass(o.klass(new_class, parameters={"gpuModel": new_model}))
            for i in range(20):
                cluster.claim(o.claim(f"new-{i}", cores=CORES, memory="1Gi", class_name=new_class))
            # A watch of claims, GPUs or classes silenced (half-open) just before these come is given
            # up only after the server's watch timeout plus the read margin (75 s by default); then
            # the binds follow, under the same faults. (A flat 90 s failed once: the claim watch was
            # silent when the new claims came, and a quota list in the bind path hung on a half-open
            # connection under the quota guard's lock, stopping every bind: test_quota_list_hangs.py.)
            within_s = WatchSettings().timeout_s + WATCH_READ_MARGIN_S + 45
            deadline = time.monotonic() + within_s
            while True:
                fresh = [c for c in kube.list_claims(cluster.namespace) if c["metadata"]["name"].startswith("new-")]
                if sum(_phase(c) == "Bound" for c in fresh) == 20:
                    break
                assert time.monotonic() < deadline, (
                    f"new claims not bound within {within_s:g} s:"
                    f" {[(c['metadata']['name'], c.get('status')) for c in fresh]}"
                    f"\n{proxy.summary()}\n{procs.logs()}")
                time.sleep(0.5)
            assert proc.poll() is None, "the controller exited\n" + procs.logs()
        finally:
            procs.close()
            print(proxy.summary())
            # Beside the controller's log: which request got which fault, and when.
            proxy.write_journal(tmp_path / "injected-faults.log")
        # The faults did happen: every fault planned for writes (the bulk of the controller's
        # requests), and some on reads and on watches.
        writes = {fault for (verb, fault) in proxy.injected if verb in ("create", "update", "patch", "delete")}
        assert set(PLAN.rates_for("patch")) <= writes, proxy.summary()
        assert proxy.count(verb="watch") > 0 and proxy.count(verb="get") + proxy.count(verb="list") > 0, \
            proxy.summary()
