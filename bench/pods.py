"""Pods that use claims, end to end through the API server: gate lifting latency, burst rate and
API writes per pod, next to the claim-only figures of the same run.

Starts the local test server (tests/kube_cluster.py), installs the CRDs, creates simulated GPUs
(8 per node) and Node objects (with allocatable CPU and memory), and runs the real controller
(`python -m elasticgpu controller`, one process watching every namespace) as a subprocess.
Phases, each in its own namespace and after the server took no write for a second:

  claims   claims of one slice (gpu-core=10, gpu-memory=1Gi) created at R/s for S seconds:
           created -> Bound (a watch sees phase Bound) p50/p99; then a burst of B claims:
           claims/s bound; API writes per claim;
  pods     pods with one inline slice each (`elasticgpu.io/request.main`), gated and labelled as
           the admission webhook leaves them (the webhook itself is not in the path: its cost is
           part of the create call), created at R/s for S seconds: created -> gate lifted (a
           watch sees the pod without the gate) p50/p99; then a burst of B pods: pods/s lifted;
           API writes per pod;
  pods-wffc  the same with a WaitForFirstConsumer class (the node is chosen for the pod: one
           list of the chosen node's pods per decision).

API writes come from the server's /metrics (apiserver_request_total, successful writes only)
and include the bench's own creates; "beyond the bind" counts a pod's writes of the kinds the
claim-only phase does not write (the pod's own create aside) plus the inline claim's create:
the gate lift and the claim the controller makes. Target (issue 9): at most 2 writes per pod
beyond the claim's own bind.

    python bench/pods.py                                  # 200 GPUs, 20/s x 10 s, burst 200
    python bench/pods.py --rate 50 --seconds 10 --burst 500 --phases claims,pods
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from binding import _claim, _gpu, _settle, _writes, bound_watch  # noqa: E402
from crd_server import test_server_with_crds  # noqa: E402
from first_seen import FirstSeen  # noqa: E402

from elasticgpu.api import names  # noqa: E402

CORES = 10
MEMORY = "1Gi"


def gate_watch(kube: Any, namespace: str) -> FirstSeen:
    """When each pod of the namespace was first seen without our scheduling gate."""

    def lifted(event: dict[str, Any]) -> bool:
        gates = ((event.get("object") or {}).get("spec") or {}).get("schedulingGates") or []
        return event.get("type") != "DELETED" and not any(g.get("name") == names.SCHEDULING_GATE for g in gates)

    return FirstSeen(kube, f"/api/v1/namespaces/{namespace}/pods", lifted)


def _pod(name: str, namespace: str, class_name: str) -> dict[str, Any]:
    """A pod as the admission webhook leaves it: one inline slice, gate and label set."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {names.LABEL_USES_CLAIMS: "true"},
                     "annotations": {names.inline_request_annotation("main"):
                                     f"gpu-core={CORES},gpu-memory={MEMORY},class={class_name}"}},
        "spec": {"schedulingGates": [{"name": names.SCHEDULING_GATE}],
                 "containers": [{"name": "main", "image": "busybox:1.36",
                                 "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]},
    }


def _percentiles(latencies: list[float]) -> tuple[float, float]:
    if not latencies:
        return float("nan"), float("nan")
    ordered = sorted(latencies)
    return statistics.median(ordered), ordered[int(0.99 * (len(ordered) - 1))]


def _phase(kube: Any, *, create: Callable[[str], None], seen: dict[str, float],
           wait: Callable[[list[str], float], bool], prefix: str, rate: float, seconds: float,
           burst: int) -> dict[str, Any]:
    """Steady rate, then a burst; latency from each create's return to the watch seeing it done."""
    _settle(kube)
    total = int(rate * seconds)
    offered = [f"{prefix}-r{i}" for i in range(total)]
    returned: dict[str, float] = {}
    writes_before = _writes(kube)
    begin = time.monotonic() + 0.2

    def offer(index: int) -> None:
        delay = begin + index / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        create(offered[index])
        returned[offered[index]] = time.monotonic()

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(offer, range(total)))
    complete = wait(offered, 60)
    _settle(kube)  # the phase's own Events and statuses count towards it
    writes = _writes(kube)
    per_object = {k: (v - writes_before.get(k, 0.0)) / max(total, 1) for k, v in writes.items()
                  if v - writes_before.get(k, 0.0) > 0}
    p50, p99 = _percentiles([(seen[n] - returned[n]) * 1000 for n in offered if n in seen])

    _settle(kube)
    names_ = [f"{prefix}-b{i}" for i in range(burst)]
    start = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(create, names_))
    burst_complete = wait(names_, 120)
    last = max((seen[n] for n in names_ if n in seen), default=time.monotonic())
    done = sum(n in seen for n in names_)
    return {"p50_ms": p50, "p99_ms": p99, "complete": complete and burst_complete,
            "undone": total - sum(n in seen for n in offered), "writes": per_object,
            "burst_per_s": done / (last - start)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=200)
    parser.add_argument("--rate", type=float, default=20.0, help="objects created per second in the steady phase")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--phases", default="claims,pods,pods-wffc")
    args = parser.parse_args()
    (REPO / "bench" / "out").mkdir(exist_ok=True)

    from kubernetes import client

    from elasticgpu.controller.edge.kube import KubeApi

    results: dict[str, dict[str, Any]] = {}
    with test_server_with_crds() as (cluster, api):
        kube = KubeApi.from_kubeconfig(str(cluster.kubeconfig))
        core = client.CoreV1Api(api)
        model = "BENCH-PODS"
        nodes = sorted({f"pods-node-{i // 8}" for i in range(args.gpus)})
        for node in nodes:
            core.create_node({"metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}})
            allocatable = {"cpu": "64", "memory": "256Gi", "pods": "1000"}
            core.patch_node_status(node, {"status": {"allocatable": allocatable, "capacity": allocatable}})
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: kube.create_gpu(_gpu(f"gpu-pods-{i}", f"pods-node-{i // 8}", i % 8, model)),
                          range(args.gpus)))
        for name, mode in (("bench-now", "Immediate"), ("bench-wffc", "WaitForFirstConsumer")):
            kube.create_class({"apiVersion": names.API_VERSION, "kind": names.KIND_CLASS, "metadata": {"name": name},
                               "provisioner": names.PROVISIONER_GPUSHARE, "bindingMode": mode,
                               "parameters": {"gpuModel": model}})
        log = open(REPO / "bench" / "out" / "pods-controller.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen([sys.executable, "-m", "elasticgpu", "controller", "--kubeconfig",
                                 str(cluster.kubeconfig), "--log-level", "warning", "--no-leader-elect",
                                 "--health-port", "-1"], stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
        try:
            for phase in args.phases.split(","):
                namespace = f"bench-{phase}"
                core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
                print(f"{phase}: {args.rate:g}/s x {args.seconds:g} s, burst {args.burst} ...", flush=True)
                if phase == "claims":
                    claims = bound_watch(kube, namespace)
                    claims.start()
                    kube.create_claim(_claim("warmup", namespace, "bench-now"))
                    if not claims.wait(["warmup"], 60):
                        raise SystemExit("the controller did not bind a first claim in 60 s")
                    results[phase] = _phase(kube, create=lambda n, ns=namespace: kube.create_claim(
                        _claim(n, ns, "bench-now")), seen=claims.seen, wait=claims.wait, prefix="c",
                        rate=args.rate, seconds=args.seconds, burst=args.burst)
                    claims.stop()
                else:
                    class_name = "bench-wffc" if phase == "pods-wffc" else "bench-now"
                    pods = gate_watch(kube, namespace)
                    pods.start()
                    core.create_namespaced_pod(namespace, _pod("warmup", namespace, class_name))
                    if not pods.wait(["warmup"], 60):
                        raise SystemExit(f"{phase}: the controller did not lift a first gate in 60 s")
                    def create(name: str, ns: str = namespace, c: str = class_name) -> None:
                        kube._call("POST", f"/api/v1/namespaces/{ns}/pods", body=_pod(name, ns, c))

                    results[phase] = _phase(kube, create=create, seen=pods.seen, wait=pods.wait, prefix="p",
                                            rate=args.rate, seconds=args.seconds, burst=args.burst)
                    pods.stop()
                results[phase]["events"] = Counter(e.get("reason") for e in kube.list_events(namespace))
        finally:
            proc.kill()
            proc.wait(timeout=15)
            log.close()
            kube.close()
            api.close()

    print(f"\npods that use claims, local test server, {args.gpus} simulated GPUs on {len(nodes)} nodes,"
          f" {os.cpu_count()} CPUs; steady {args.rate:g}/s x {args.seconds:g} s, burst {args.burst}")
    print("| phase | created -> done p50 ms | p99 ms | burst /s | writes per object | beyond the bind |")
    print("|---|---|---|---|---|---|")
    # The bind's writes are the kinds the claim-only phase writes, its user's create aside; a
    # pod's writes beyond them are the other kinds (its own create aside) and the inline claim's
    # create. Counted by kind, not by difference of totals: the GPU writes of a burst are batched
    # per card, so their count per object moves with the load, not with the pod.
    bind_kinds = set(results["claims"]["writes"]) - {"POST elasticgpuclaims"} if "claims" in results else None
    for phase, r in results.items():
        total = sum(r["writes"].values())
        if bind_kinds is None:
            beyond = float("nan")
        elif phase == "claims":
            beyond = 0.0
        else:
            beyond = sum(v for k, v in r["writes"].items() if k not in bind_kinds and k != "POST pods")
        done = "Bound" if phase == "claims" else "gate lifted"
        flag = "" if r["complete"] else f" ({r['undone']} not {done} in 60 s)"
        print(f"| {phase} | {r['p50_ms']:.0f}{flag} | {r['p99_ms']:.0f} | {r['burst_per_s']:.0f} | {total:.2f}"
              f" | {beyond:.2f} |")
    print("\nAPI writes per object in the steady phase, by verb and resource:")
    for phase, r in results.items():
        print(f"  {phase}: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["writes"].items(), key=lambda kv: -kv[1])))
    print("\nEvents of each phase (steady and burst), by reason:")
    for phase, r in results.items():
        print(f"  {phase}: " + ", ".join(f"{k} {v}" for k, v in r["events"].most_common()))


if __name__ == "__main__":
    main()
