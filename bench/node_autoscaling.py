"""Node autoscaling (issue 47 item 4): time from a claim to Bound on a node that a node autoscaler
added for it, and how many nodes (and cards) were asked for.

Starts the local test server (tests/kube_cluster.py) and a controller with its threads
(informer, worker, node autoscaling passes every `--interval` s). A simulated node autoscaler
plays Karpenter's part: every 0.2 s it takes the placeholder pods it has not served yet, packs
their `nvidia.com/gpu` requests into nodes of `--cards-per-node` cards (first fit, as a
bin-packing autoscaler does), waits `--boot-s` (a node's launch and join; 0 measures the
controller alone) and creates each Node with its agent's GPU objects (the simulated agent). Per
scenario, on a pool scaled to zero:

- claims, what each asks, nodes asked for (placeholder pods made), cards they asked, nodes the
  autoscaler launched, and what a placeholder per claim would have asked;
- claim creation -> Bound (p50, max), boot time included.

    python bench/node_autoscaling.py
    python bench/node_autoscaling.py --boot-s 5 --interval 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from crd_server import test_server_with_crds  # noqa: E402

from elasticgpu.api import names  # noqa: E402
from elasticgpu.controller.decisions import node_requests  # noqa: E402
from elasticgpu.controller.edge.kube import KubeApi  # noqa: E402
from elasticgpu.controller.process.reconciling import Controller  # noqa: E402
from elasticgpu.controller.settings import AutoscaleSettings, ControllerSettings  # noqa: E402

SCENARIOS: list[tuple[str, str, int, dict[str, Any]]] = [
    # (name, provisioner, claims, requests)
    ("one share, from zero", names.PROVISIONER_GPUSHARE, 1, {names.RESOURCE_CORE: 30, names.RESOURCE_MEMORY: "10Gi"}),
    ("10 shares of 30%", names.PROVISIONER_GPUSHARE, 10, {names.RESOURCE_CORE: 30, names.RESOURCE_MEMORY: "10Gi"}),
    ("10 claims of 1 card", names.PROVISIONER_PHYSICAL, 10, {names.RESOURCE_NVIDIA_GPU: 1}),
    ("4 claims of 4 cards", names.PROVISIONER_PHYSICAL, 4, {names.RESOURCE_NVIDIA_GPU: 4}),
]


class SimulatedAutoscaler:
    """Serves placeholder pods with nodes of `cards` cards (see the module docstring)."""

    def __init__(self, kube: KubeApi, namespace: str, *, pool: str, model: str, cards: int, boot_s: float) -> None:
        self.kube, self.namespace, self.pool, self.model = kube, namespace, pool, model
        self.cards, self.boot_s = cards, boot_s
        self.served: set[str] = set()
        self.used: list[int] = []
        """Cards given to placeholders, per node launched."""
        self.nodes = 0

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(0.2):
            pods = self.kube.list_labelled_pods(self.namespace, f"{node_requests.LABEL_NODE_REQUEST}=true")
            fresh = [p for p in pods if p["metadata"]["name"] not in self.served]
            if not fresh:
                continue
            launched = len(self.used)
            for pod in fresh:
                self.served.add(pod["metadata"]["name"])
                want = int(pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"])
                # The room of the nodes launched (or launching) first, as the scheduler and the
                # autoscaler's own simulation place a pending pod; a new node only for the rest.
                for i, used in enumerate(self.used):
                    if used + want <= self.cards:
                        self.used[i] += want
                        break
                else:
                    self.used.append(want)
            if len(self.used) > launched:
                time.sleep(self.boot_s)
            for _ in range(launched, len(self.used)):
                self._launch()

    def _launch(self) -> None:
        node = f"{self.pool}-{self.nodes}"
        self.nodes += 1
        self.kube._call("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node",
                                                         "metadata": {"name": node, "labels": {"pool": self.pool}}})
        for index in range(self.cards):
            gpu = f"gpu-{node}-{index}"
            self.kube.create_gpu({"apiVersion": names.API_VERSION, "kind": names.KIND_GPU, "metadata": {"name": gpu},
                                  "spec": {"index": index, "uuid": gpu.upper(), "model": self.model, "memory": 81920,
                                           "nodeName": node}})


def _scenario(kube: KubeApi, index: int, args: argparse.Namespace, title: str, provisioner: str, count: int,
              requests: dict[str, Any]) -> list[str]:
    namespace = f"bench-scale-{index}"
    pool, model = f"pool{index}", f"BENCH-SCALE-{index}"
    kube._call("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                     "metadata": {"name": namespace}})
    kube.create_class({"apiVersion": names.API_VERSION, "kind": names.KIND_CLASS, "metadata": {"name": pool},
                       "provisioner": provisioner, "parameters": {"gpuModel": model, "nodeSelector": f"pool={pool}"}})
    settings = ControllerSettings(autoscale=AutoscaleSettings(enabled=True, namespace=namespace,
                                                              interval_s=args.interval))
    controller = Controller(kube, settings, namespace=namespace)
    stop = threading.Event()
    listed = controller.rebuild()
    threads = controller.informer.start(stop, timeout_s=5, listed=listed)
    autoscaler = SimulatedAutoscaler(kube, namespace, pool=pool, model=model, cards=args.cards_per_node,
                                     boot_s=args.boot_s)
    for target in (controller.run_worker, controller.node_autoscaling.run, autoscaler.run):
        threads.append(threading.Thread(target=target, args=(stop,), daemon=True))
        threads[-1].start()
    created: dict[str, float] = {}
    for i in range(count):
        name = f"c{i}"
        kube.create_claim({"apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM,
                           "metadata": {"name": name, "namespace": namespace},
                           "spec": {"elasticGPUClassName": pool, "resources": {"requests": requests}}})
        created[name] = time.monotonic()
    bound: dict[str, float] = {}
    deadline = time.monotonic() + 120
    while len(bound) < count and time.monotonic() < deadline:
        for claim in kube.list_claims(namespace):
            name = claim["metadata"]["name"]
            if name not in bound and (claim.get("status") or {}).get("phase") == "Bound":
                bound[name] = time.monotonic()
        time.sleep(0.05)
    stop.set()
    controller.close()
    waits = sorted(bound[n] - created[n] for n in bound)
    per_claim = count if provisioner == names.PROVISIONER_GPUSHARE else sum(
        int(requests[names.RESOURCE_NVIDIA_GPU]) for _ in range(count))
    return [title, str(count), str(controller.node_autoscaling.asked), str(sum(autoscaler.used)), str(autoscaler.nodes),
            f"{per_claim} cards in {count} pods", f"{len(bound)}/{count}",
            f"{statistics.median(waits):.2f}" if waits else "-", f"{waits[-1]:.2f}" if waits else "-"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between node autoscaling passes")
    parser.add_argument("--boot-s", type=float, default=0.0, help="a new node's launch and join, in seconds")
    parser.add_argument("--cards-per-node", type=int, default=8)
    args = parser.parse_args()
    rows = [["scenario", "claims", "placeholders", "cards asked", "nodes launched", "a pod per claim would ask",
             "bound", "claim->Bound p50 s", "max s"]]
    with test_server_with_crds() as (cluster, _api):
        kube = KubeApi.from_kubeconfig(str(cluster.kubeconfig))
        for index, (title, provisioner, count, requests) in enumerate(SCENARIOS):
            rows.append(_scenario(kube, index, args, title, provisioner, count, requests))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print(f"node autoscaling: passes every {args.interval:g}s, node boot {args.boot_s:g}s,"
          f" {args.cards_per_node} cards per node")
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()
