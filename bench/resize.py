"""Resize latency end to end through the API server (issue 17): a Bound claim's requests grow,
and the claim's `status.capacity` shows the new size.

Starts the local test server (tests/kube_cluster.py), installs the CRDs, creates simulated GPU
objects and a class with `allowClaimResize: true`, runs the real controller
(`python -m elasticgpu controller`) as a subprocess, binds N claims (10% cores, 2Gi each),
then expands them one after the other (to 20% cores, 4Gi; the class spreads them, 4 to a
card: always room on the same card) and measures for each the time from the patch request to the moment a watch sees
`status.capacity` at the new size. Writes per resize are counted from watches over the run of
the expands: every write of an object is one watch event (the server does not coalesce them).

    python bench/resize.py                 # 200 expands, 50 GPUs
    python bench/resize.py --claims 50     # quick look
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from crd_server import test_server_with_crds  # noqa: E402
from first_seen import FirstSeen  # noqa: E402
from percentiles import percentile  # noqa: E402

from elasticgpu.api import names  # noqa: E402

CORE, MEMORY = names.RESOURCE_CORE, names.RESOURCE_MEMORY


class Counting:
    """Counts MODIFIED events of a collection (one per write) while `counting` is set."""

    def __init__(self, kube: Any, path: str) -> None:
        self.kube, self.path = kube, path
        self.count = 0
        self.counting = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        page = self.kube._call("GET", self.path, query={"limit": "1"})
        resource_version = page["metadata"]["resourceVersion"]
        while not self._stop.is_set():
            try:
                for event in self.kube.watch(self.path, resource_version=resource_version, timeout_s=900):
                    obj = event.get("object") or {}
                    resource_version = obj.get("metadata", {}).get("resourceVersion", resource_version)
                    if event.get("type") == "MODIFIED" and self.counting.is_set():
                        self.count += 1
                    if self._stop.is_set():
                        return
            except Exception as err:  # re-opened from the last version seen: no event is counted twice
                print(f"  (watch re-opened: {err})", file=sys.stderr)
                time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--gpus", type=int, default=0, help="default: claims / 4")
    args = parser.parse_args()
    args.gpus = args.gpus or max(1, args.claims // 4)
    (REPO / "bench" / "out").mkdir(exist_ok=True)

    from kubernetes import client

    from elasticgpu.controller.edge.kube import KubeApi

    with test_server_with_crds() as (cluster, api):
        kube = KubeApi.from_kubeconfig(str(cluster.kubeconfig))
        namespace = "bench-resize"
        client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
        model = "BENCH-RESIZE"
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: kube.create_gpu({
                "apiVersion": names.API_VERSION, "kind": names.KIND_GPU, "metadata": {"name": f"gpu-resize-{i}"},
                "spec": {"index": i % 8, "uuid": f"GPU-RESIZE-{i}", "model": model, "memory": 81920,
                         "nodeName": f"resize-node-{i // 8}"}}), range(args.gpus)))
        kube.create_class({"apiVersion": names.API_VERSION, "kind": names.KIND_CLASS, "metadata": {"name": "resize"},
                           "provisioner": names.PROVISIONER_GPUSHARE,
                           "parameters": {"gpuModel": model, "policy": "spread"},
                           "allowClaimResize": True})  # spread: 4 claims a card, room for each to double
        claims_path = f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{namespace}/{names.PLURAL_CLAIM}"
        bound = FirstSeen(kube, claims_path, lambda e: ((e.get("object") or {}).get("status") or {}).get(
            "resizable") is True)
        grown = FirstSeen(kube, claims_path, lambda e: str((((e.get("object") or {}).get("status") or {}).get(
            "capacity") or {}).get(CORE)) == "20")
        writes = {kind: Counting(kube, f"/apis/{names.GROUP}/{names.VERSION}/{path}")
                  for kind, path in (("GPU", names.PLURAL_GPU), ("ElasticGPU", names.PLURAL_ELASTIC_GPU),
                                     ("claim", f"namespaces/{namespace}/{names.PLURAL_CLAIM}"))}
        for watch in (bound, grown, *writes.values()):
            watch.start()
        log = open(REPO / "bench" / "out" / "resize-controller.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen([sys.executable, "-m", "elasticgpu", "controller", "--kubeconfig",
                                 str(cluster.kubeconfig), "--namespace", namespace, "--log-level", "warning",
                                 "--no-leader-elect", "--health-port", "0"],
                                stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
        try:
            claims = [f"c{i}" for i in range(args.claims)]
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(lambda n: kube.create_claim({
                    "apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM,
                    "metadata": {"name": n, "namespace": namespace},
                    "spec": {"elasticGPUClassName": "resize",
                             "resources": {"requests": {CORE: 10, MEMORY: "2Gi"}}}}), claims))
            if not bound.wait(claims, 120):
                raise SystemExit("the controller did not bind every claim in 120 s")
            time.sleep(2.0)  # the binds' tail (ElasticGPU statuses, Events) out of the counts
            for counter in writes.values():
                counter.counting.set()
            latencies = []
            for name in claims:
                start = time.monotonic()  # from the request of the patch: its round trip counts too
                kube.patch_claim(namespace, name, {"spec": {"resources": {"requests": {CORE: 20, MEMORY: "4Gi"}}}})
                if not grown.wait([name], 30):
                    raise SystemExit(f"claim {name}: status.capacity not at the new size after 30 s:"
                                     f" {kube.get_claim(namespace, name).get('status')}")
                latencies.append((grown.seen[name] - start) * 1000)
            time.sleep(2.0)  # writes after status.capacity (none expected) still counted
            for counter in writes.values():
                counter.counting.clear()
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
            for watch in (bound, grown, *writes.values()):
                watch.stop()
            kube.close()
            api.close()
    per_resize = Counter({kind: c.count / len(claims) for kind, c in writes.items()})
    # The user's own patch of the requests is one of the claim's writes: not the controller's.
    per_resize["claim"] -= 1.0
    print(f"\nresize (expand with room) end to end, local test server, {args.gpus} simulated GPUs,"
          f" {len(claims)} expands one after the other, {os.cpu_count()} CPUs,"
          f" load average {os.getloadavg()[0]:.2f}")
    print("| expands | p50 ms | p99 ms | max ms | mean ms | controller writes per resize: GPU, ElasticGPU, claim |")
    print("|---|---|---|---|---|---|")
    print(f"| {len(latencies)} | {percentile(latencies, 0.5):.1f} | {percentile(latencies, 0.99):.1f}"
          f" | {max(latencies):.1f} | {statistics.mean(latencies):.1f}"
          f" | {per_resize['GPU']:.2f}, {per_resize['ElasticGPU']:.2f}, {per_resize['claim']:.2f} |")


if __name__ == "__main__":
    main()
