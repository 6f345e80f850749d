"""The crash promise: kill -9 the controller at random moments while 300 claims bind (room for
250), restart it, four times; in the end the invariants hold and everything that can bind is
bound. The kill moments are seeded, and each kill waits until the new process made progress, so
every kill lands while claims are binding."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from elasticgpu.controller.edge.kube import KubeApi
from tests.binding import objects as o
from tests.binding.conftest import Cluster
from tests.binding.processes import ControllerProcesses, check_invariants, wait_quiescent

CARDS = 25
CORES = 10  # ten claims per card: room for 250
CLAIMS = 300
KILLS = 4
SEED = 20260


def _bound(kube: KubeApi, namespace: str) -> int:
    return sum((c.get("status") or {}).get("phase") == "Bound" for c in kube.list_claims(namespace))


def test_kill_nine_and_restart_while_binding(cluster: Cluster, kube: KubeApi, kube_cluster: Any,
                                             tmp_path: Path) -> None:
    rng = random.Random(SEED)
    model = f"T{cluster.prefix}"
    gpu_names = [f"gpu-{cluster.prefix}-{i}" for i in range(CARDS)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: cluster.gpu(o.gpu(gpu_names[i], node=f"{cluster.prefix}-n{i // 8}", index=i % 8,
                                                   model=model)), range(CARDS)))
    class_name = f"{cluster.prefix}-class"
    cluster.klass(o.klass(class_name, parameters={"gpuModel": model}))

    # Claims keep arriving (slowly) while the controller is killed and restarted.
    creating = threading.Thread(target=lambda: [
        (cluster.claim(o.claim(f"c{i}", cores=CORES, memory="4Gi", class_name=class_name)), time.sleep(0.02))
        for i in range(CLAIMS)], daemon=True)
    procs = ControllerProcesses(kube_cluster.kubeconfig, cluster.namespace, tmp_path,
                                env={"ELASTICGPU_RESYNC_INTERVAL_S": "5"})
    kills: list[tuple[int, int]] = []
    try:
        proc = procs.start()
        creating.start()
        for _ in range(KILLS):
            before = _bound(kube, cluster.namespace)
            deadline = time.monotonic() + 60
            while _bound(kube, cluster.namespace) <= before:  # this incarnation is binding
                assert time.monotonic() < deadline, "no progress after a restart\n" + procs.logs()
                assert proc.poll() is None, procs.logs()
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 1.0))
            procs.kill(proc)
            kills.append((before, _bound(kube, cluster.namespace)))
            proc = procs.start()
        creating.join(timeout=60)
        assert not creating.is_alive()
        room = CARDS * 100 // CORES
        claims = wait_quiescent(
            kube, cluster.namespace, quiet_s=4.0, deadline_s=150.0, procs=procs,
            done=lambda cs: len(cs) == CLAIMS and all((c.get("status") or {}).get("phase") for c in cs)
            and sum(c["status"]["phase"] == "Bound" for c in cs) >= room,
        )
        assert proc.poll() is None, procs.logs()
    finally:
        procs.close()
    # The kills landed mid-way: some claims were bound, not all.
    assert all(0 < after < CLAIMS for _, after in kills), kills
    phases = check_invariants(kube, cluster.namespace, claims, gpu_names)
    assert phases == {"Bound": room, "Pending": CLAIMS - room}, phases
