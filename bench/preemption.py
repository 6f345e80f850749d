"""Preemption latency end to end through the API server (issue 27 item 4): a higher-priority claim
created on a full card -> that claim Bound.

Starts the local test server (tests/kube_cluster.py), installs the CRDs, creates simulated GPU
objects (one card by default) and two classes (priority 0 and 1000), runs the real controller
(`python -m elasticgpu controller`) as a subprocess, then N times, one after the other:
fills the card with a low-priority claim (100% of its cores) used by a pod, waits for it Bound,
creates a high-priority claim of 50% and measures from the create request to the moment a watch
sees it Bound. In between the controller plans, marks the victim (annotation, condition, Event),
evicts its pod (the test server has no eviction subresource: the 404 path, a live read and a plain
delete), fails the victim's ElasticGPU, frees its reservation (no agent reports it running) and
binds. Each run then deletes both claims and waits for the card to be empty.

    python bench/preemption.py              # 50 preemptions
    python bench/preemption.py --runs 10    # quick look
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from crd_server import test_server_with_crds  # noqa: E402
from first_seen import FirstSeen  # noqa: E402
from percentiles import percentile  # noqa: E402

from elasticgpu.api import names  # noqa: E402

CORE = names.RESOURCE_CORE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--no-pods", action="store_true", help="victims without a pod (no eviction)")
    args = parser.parse_args()
    (REPO / "bench" / "out").mkdir(exist_ok=True)

    from kubernetes import client

    from elasticgpu.controller import errors
    from elasticgpu.controller.edge.kube import KubeApi

    with test_server_with_crds() as (cluster, api):
        kube = KubeApi.from_kubeconfig(str(cluster.kubeconfig))
        core = client.CoreV1Api(api)
        namespace = "bench-preempt"
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
        model = "BENCH-PREEMPT"
        gpu_name = "gpu-preempt-0"
        kube.create_gpu({"apiVersion": names.API_VERSION, "kind": names.KIND_GPU, "metadata": {"name": gpu_name},
                         "spec": {"index": 0, "uuid": gpu_name.upper(), "model": model, "memory": 81920,
                                  "nodeName": "preempt-node-0"}})
        for klass, priority in (("low", 0), ("high", 1000)):
            kube.create_class({"apiVersion": names.API_VERSION, "kind": names.KIND_CLASS, "metadata": {"name": klass},
                               "provisioner": names.PROVISIONER_GPUSHARE, "parameters": {"gpuModel": model},
                               "priority": priority})
        claims_path = f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{namespace}/{names.PLURAL_CLAIM}"
        bound = FirstSeen(kube, claims_path, lambda e: ((e.get("object") or {}).get("status") or {}).get(
            "phase") == "Bound")
        bound.start()
        log = open(REPO / "bench" / "out" / "preemption-controller.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen([sys.executable, "-m", "elasticgpu", "controller", "--kubeconfig",
                                 str(cluster.kubeconfig), "--namespace", namespace,
                                 "--log-level", os.environ.get("BENCH_LOG_LEVEL", "warning"),
                                 "--no-leader-elect", "--health-port", "0"],
                                stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                env={**os.environ, "PYTHONPATH": str(REPO)})

        def claim(name: str, klass: str, cores: int) -> None:
            kube.create_claim({"apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM,
                               "metadata": {"name": name, "namespace": namespace},
                               "spec": {"elasticGPUClassName": klass, "resources": {"requests": {CORE: cores}}}})

        def card_empty() -> bool:
            return not (kube.get_gpu(gpu_name).get("status") or {}).get("allocations")

        latencies: list[float] = []
        plain: list[float] = []  # the low claim's create -> Bound on the empty card: a bind without preemption
        evicted = 0
        try:
            for run in range(args.runs):
                low, high, pod = f"low-{run}", f"high-{run}", f"uses-low-{run}"
                began = time.monotonic()
                claim(low, "low", 100)
                if not bound.wait([low], 60):
                    raise SystemExit(f"claim {low} not Bound after 60 s: {kube.get_claim(namespace, low)}")
                plain.append((bound.seen[low] - began) * 1000)
                if not args.no_pods:
                    core.create_namespaced_pod(namespace, {
                        "apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": pod, "labels": {names.LABEL_USES_CLAIMS: "true"},
                                     "annotations": {names.claim_annotation("main"): low}},
                        "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}],
                                 "terminationGracePeriodSeconds": 0}})
                    time.sleep(0.3)  # the controller's pod watch has it (else nothing would be evicted)
                start = time.monotonic()  # from the request of the create: its round trip counts too
                claim(high, "high", 50)
                if not bound.wait([high], 60):
                    raise SystemExit(f"claim {high} not Bound after 60 s: {kube.get_claim(namespace, high)}")
                latencies.append((bound.seen[high] - start) * 1000)
                if not args.no_pods:
                    try:
                        kube.get_pod(namespace, pod)
                    except errors.NotFound:
                        evicted += 1
                for name in (high, low):
                    kube.delete_claim(namespace, name)
                deadline = time.monotonic() + 30
                while not card_empty():
                    if time.monotonic() > deadline:
                        raise SystemExit(f"run {run}: the card still holds {kube.get_gpu(gpu_name)['status']}")
                    time.sleep(0.05)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
            bound.stop()
            kube.close()
            api.close()
    print(f"\npreemption end to end, local test server, 1 simulated GPU, {len(latencies)} preemptions one after the"
          f" other ({'no pods' if args.no_pods else f'a pod per victim, {evicted} evicted'}), {os.cpu_count()} CPUs,"
          f" load average {os.getloadavg()[0]:.2f}")
    print("| create -> Bound | runs | p50 ms | p99 ms | max ms | mean ms |")
    print("|---|---|---|---|---|---|")
    for what, values in (("with a preemption", latencies), ("plain bind, empty card (same runs)", plain)):
        print(f"| {what} | {len(values)} | {percentile(values, 0.5):.1f} | {percentile(values, 0.99):.1f}"
              f" | {max(values):.1f} | {statistics.mean(values):.1f} |")


if __name__ == "__main__":
    main()
