"""The claim floor: the fewest API writes any design that keeps a claim per pod as a custom resource needs
(issue 37), run by `bench/real_scheduler.py` as its kind `claim-floor`.

Per gated pod of its namespace it makes, from 32 threads, exactly three writes, with the bodies our
controller makes for an inline slice: the claim's create (the inline claim's body: owner pod,
request annotation, requests and class, and a finalizer, so no later spec write is needed; not
`spec.elasticGPUName`, ~50 bytes, which would make our controller judge the claim a static bind),
its Bound status (our `ClaimStatus.bound` body: capacity, node, card, condition, isolation,
policing, the pod as user), and the pod's gate lift (our `pod_gate.lift_patch`, pinning it to a
node). The scheduler then binds it and writes its Event, as for ours. No ElasticGPU, no GPU
reservation, no webhook (the bench creates the pod gated and labelled as using claims, the label
pods are watched by), no allocator: nodes in turn. So it is a
floor, not a controller: nothing stops two claims sharing a card's last share.

Its claims name the class `bench-floor`, whose provisioner is someone else's: our controller watches
them (that fan-out is part of any design) and leaves them alone. Their finalizer is the floor's
own, taken off by the bench's clean.

    python bench/claim_floor.py --kubeconfig K --namespace NS --nodes bench-node-0000,...
"""

from __future__ import annotations

import argparse
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from itertools import count
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import null_controller

from elasticgpu.api import names, timestamps
from elasticgpu.controller.decisions import pod_gate
from elasticgpu.controller.edge.kube import KubeApi

Body = dict[str, Any]
GATE = "bench.example.com/claim-floor"
CLASS = "bench-floor"
FINALIZER = "bench.example.com/claim-floor"
REQUESTS = {names.RESOURCE_CORE: 10, names.RESOURCE_MEMORY: "1Gi"}


def claim_body(pod: Body) -> Body:
    """The inline claim of `pod`'s container `main`, complete at its create."""
    meta = pod["metadata"]
    name = f"{meta['name']}-main"
    return {
        "apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM,
        "metadata": {
            "name": name, "namespace": meta["namespace"], "finalizers": [FINALIZER],
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"],
                                 "controller": True, "blockOwnerDeletion": True}],
            "annotations": {names.inline_request_annotation("main"): f"gpu-core=10,gpu-memory=1Gi,class={CLASS}"},
        },
        "spec": {"resources": {"requests": REQUESTS}, "elasticGPUClassName": CLASS},
    }  # fmt: skip


def bound_status(claim: Body, pod: Body, node: str) -> Body:
    """What our controller writes on a slice's bind (`ClaimStatus.bound`)."""
    card = f"GPU-{node.upper()}-0"
    message = f"bound to ElasticGPU egpu-{claim['metadata']['uid']} on {node} ({card})"
    return {
        "phase": "Bound", "reason": None, "message": message, "capacity": REQUESTS, "allocatedResources": REQUESTS,
        "nodeName": node, "gpus": [card],
        "conditions": [{"type": "Bound", "status": "True", "reason": "Bound", "message": message,
                        "lastTransitionTime": timestamps.now_rfc3339()}],
        "isolation": "None", "allowPrivileged": None,
        "policing": {"overLimitAction": "Warn", "overLimitGraceSeconds": 60},
        "users": [{"name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}],
    }  # fmt: skip


class Floor:
    """Binds each gated pod of one namespace with the three writes of the module docstring."""

    def __init__(self, kube: KubeApi, namespace: str, nodes: list[str]) -> None:
        self.kube, self.namespace, self.nodes = kube, namespace, nodes
        self.turn = count()
        self.seen: set[str] = set()
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(32)

    def offer(self, pod: Body) -> None:
        gates = [g.get("name") for g in (pod.get("spec") or {}).get("schedulingGates") or []]
        if GATE not in gates or (pod.get("metadata") or {}).get("deletionTimestamp"):
            return
        with self.lock:
            uid = pod["metadata"]["uid"]
            if uid in self.seen:
                return
            self.seen.add(uid)
            node = self.nodes[next(self.turn) % len(self.nodes)]
        self.pool.submit(self._bind_logged, pod, node)

    def _bind_logged(self, pod: Body, node: str) -> None:
        try:
            self.bind(pod, node)
        except Exception as err:  # one pod's failure is reported; the bench finds it unscheduled
            print(f"claim floor: pod {pod['metadata']['name']}: {err}", file=sys.stderr, flush=True)

    def bind(self, pod: Body, node: str) -> None:
        claim = self.kube.create_claim(claim_body(pod))
        meta = claim["metadata"]
        self.kube.patch_claim_status(self.namespace, meta["name"], {
            "metadata": {"resourceVersion": meta["resourceVersion"]}, "status": bound_status(claim, pod, node)})
        patch = pod_gate.lift_patch(pod, node)
        patch["spec"]["schedulingGates"] = [g for g in pod["spec"]["schedulingGates"] if g.get("name") != GATE] or None
        self.kube.patch_pod(self.namespace, pod["metadata"]["name"], patch)

    def watch(self) -> None:
        """Offer every pod of the namespace as the watch (through the controller's pod selector) sees it."""
        for pod in null_controller.watch_objects(self.kube, f"/api/v1/namespaces/{self.namespace}/pods"):
            self.offer(pod)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--nodes", required=True, help="comma-separated node names, taken in turn")
    args = parser.parse_args()
    kube = KubeApi.from_kubeconfig(args.kubeconfig)
    Floor(kube, args.namespace, args.nodes.split(",")).watch()


if __name__ == "__main__":
    main()
