"""The null controller: the API traffic of a dynamic bind with no decisions (issue 8 item 10).

`bench/binding.py` runs it like the real controller, in its own namespace on its own GPUs, to
measure in the same run the ceiling of this machine: how fast the API server (sharing the CPUs
with the load and the controller) takes the writes a bind cannot do without. It does what the
real controller does on the wire and nothing else:

- the same watches: claims of its namespace, GPUs and ElasticGPUs (the last two read and
  discarded: the server's fan-out costs the same);
- per claim, in the real controller's order: the reservation in a GPU's `status.allocations`
  (PUT with the resourceVersion; the claims of one card share a write, as the real worker's
  batches do, see `dispatch`), the ElasticGPU's create, the claim's spec (finalizer, elasticGPUName)
  and status (Bound) as merge patches with the resourceVersion, the ElasticGPU's status, and one
  Event from a background writer. Bodies have the shape of the real ones.

No allocator, no picture, no indexes: each claim takes the next free 10% slot of the next card
(first fit), its name and uid come from the watch event, and every body is built from them.

    python bench/null_controller.py --kubeconfig K --namespace NS --model BENCH-NULL
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from elasticgpu.api import names, timestamps
from elasticgpu.controller.edge.kube import KubeApi

Body = dict[str, Any]
SLOTS = 10  # claims of 10% cores per card
CORES, MEMORY_MIB = 10, 1024
COMPONENT = "elasticgpu-null-controller"


class Card:
    """One GPU: its last body, for the resourceVersion of the next write."""

    def __init__(self, body: Body) -> None:
        self.body = body
        self.lock = threading.Lock()
        """One write of a card at a time (two batches can share a card): no 409s between them."""

    def reserve(self, kube: KubeApi, allocations: list[Body]) -> None:
        """One PUT of the card's status with `allocations` added (the commit point of them all)."""
        with self.lock:
            self._reserve(kube, allocations)

    def _reserve(self, kube: KubeApi, allocations: list[Body]) -> None:
        status = dict(self.body.get("status") or {})
        held = list(status.get("allocations") or []) + allocations
        status["allocations"] = held
        free_cores = max(0, names.CORES_PER_CARD - sum(a["cores"] for a in held))
        free_memory = max(0, int(self.body["spec"]["memory"]) - sum(a["memory"] for a in held))
        status["allocatable"] = {names.RESOURCE_CORE: free_cores, names.RESOURCE_MEMORY: f"{free_memory}Mi"}
        self.body = kube.replace_gpu_status({"apiVersion": names.API_VERSION, "kind": names.KIND_GPU,
                                             "metadata": self.body["metadata"], "spec": self.body["spec"],
                                             "status": status})


class NullController:
    """Binds every new claim of `namespace` to the next slot, with the real controller's writes."""

    def __init__(self, kube: KubeApi, namespace: str, model: str, *, workers: int = 32,
                 linger_s: float = 0.05) -> None:
        self.kube, self.namespace, self.linger_s = kube, namespace, linger_s
        gpus = [g for g in kube._list(f"/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL_GPU}")[0]
                if g["spec"].get("model") == model]
        self.cards = [Card(g) for g in sorted(gpus, key=lambda g: g["metadata"]["name"])]
        self._next = 0
        self._seen: set[str] = set()
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="bind")
        self.commit_pool = ThreadPoolExecutor(workers, thread_name_prefix="commit")
        self.claims: queue.Queue[Body] = queue.Queue()
        self.events: queue.Queue[tuple[str, Body]] = queue.Queue()

    def dispatch(self) -> None:
        """Assign each claim the next free 10% slot (first fit) and commit a card's waiting
        reservations in one write once its slots are all taken or the first has waited
        `linger_s`: at most as many GPU writes per claim as the real controller's batches make
        (fewer writes can only raise the ceiling). The cards are written in parallel."""
        waiting: dict[int, tuple[float, list[tuple[Body, Body]]]] = {}
        while True:
            due = min((since for since, _ in waiting.values()), default=None)
            timeout = None if due is None else max(0.0, due + self.linger_s - time.monotonic())
            try:
                claim = self.claims.get(timeout=timeout)
            except queue.Empty:
                claim = None
            if claim is not None:
                card = self._next // SLOTS
                self._next += 1
                waiting.setdefault(card, (time.monotonic(), []))[1].append((claim, self._allocation(claim)))
            now = time.monotonic()
            for card in [c for c, (since, items) in waiting.items()
                         if len(items) == SLOTS or now - since >= self.linger_s or c < self._next // SLOTS]:
                self.commit_pool.submit(self._commit, card, waiting.pop(card)[1])

    def _allocation(self, claim: Body) -> Body:
        meta = claim["metadata"]
        ref = {"apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM, "namespace": meta["namespace"],
               "name": meta["name"], "uid": meta["uid"]}
        return {"elasticGPU": names.elastic_gpu_name_for_claim(meta["uid"]), "claimRef": ref, "cores": CORES,
                "memory": MEMORY_MIB, "exclusive": False, "reservedAt": timestamps.now_rfc3339()}

    def _commit(self, card: int, items: list[tuple[Body, Body]]) -> None:
        try:
            self.cards[card].reserve(self.kube, [allocation for _, allocation in items])
        except Exception as err:  # a bench process: say it and go on with the others
            print(f"null controller: GPU write: {err}", file=sys.stderr, flush=True)
            return
        for claim, allocation in items:
            self.pool.submit(self._bind_logged, claim, allocation, self.cards[card])

    def bind(self, claim: Body, allocation: Body, card: Card) -> None:
        """The writes after the commit point, in the real controller's order."""
        meta = claim["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        gpu_name, node = card.body["metadata"]["name"], card.body["spec"]["nodeName"]
        gpu_uuid = card.body["spec"]["uuid"]
        key, ref = allocation["elasticGPU"], allocation["claimRef"]
        class_name = claim["spec"].get("elasticGPUClassName", "")
        # the ElasticGPU
        capacity = {names.RESOURCE_MEMORY: "1Gi", names.RESOURCE_CORE: CORES}
        egpu = self.kube.create_elastic_gpu({
            "apiVersion": names.API_VERSION, "kind": names.KIND_ELASTIC_GPU,
            "metadata": {"name": key, "labels": {names.LABEL_NODE: node, names.LABEL_CLAIM_NAMESPACE: namespace,
                                                 names.LABEL_CLAIM_NAME: name, names.LABEL_CLASS: class_name},
                         "finalizers": [names.FINALIZER_EGPU_PROTECTION]},
            "spec": {"capacity": capacity, "claimRef": ref, "nodeName": node, "elasticGPUClassName": class_name,
                     "reclaimPolicy": "Delete",
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [
                         {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
                     "gpuShare": {"gpuName": gpu_name}}})
        # the claim: spec, then status
        patched = self.kube.patch_claim(namespace, name, {
            "metadata": {"finalizers": [names.FINALIZER_CLAIM_PROTECTION], "resourceVersion": meta["resourceVersion"]},
            "spec": {"elasticGPUName": key}})
        message = f"bound to ElasticGPU {key} on {node} ({gpu_uuid})"
        answer = self.kube.patch_claim_status(namespace, name, {
            "metadata": {"resourceVersion": patched["metadata"]["resourceVersion"]},
            "status": {"phase": "Bound", "capacity": capacity, "nodeName": node, "gpus": [gpu_uuid],
                       "conditions": [{"type": "Bound", "status": "True", "reason": "Bound", "message": message,
                                       "lastTransitionTime": timestamps.now_rfc3339()}]}})
        # the ElasticGPU's status
        self.kube.patch_elastic_gpu_status(key, {
            "metadata": {"resourceVersion": egpu["metadata"]["resourceVersion"]},
            "status": {"phase": "Bound", "reason": "Bound", "message": f"provisioned for claim {namespace}/{name}",
                       "capacity": capacity, "nodeName": node, "gpus": [gpu_uuid], "gpuList": gpu_uuid,
                       "claim": f"{namespace}/{name}"}})
        # one Event, off the hot path
        self.events.put((namespace, _event(answer, f"provisioned ElasticGPU {key} and {message}")))

    def _bind_logged(self, claim: Body, allocation: Body, card: Card) -> None:
        try:
            self.bind(claim, allocation, card)
        except Exception as err:  # a bench process: say it and go on with the others
            print(f"null controller: {claim['metadata']['name']}: {err}", file=sys.stderr, flush=True)

    def write_events(self) -> None:
        while True:
            namespace, body = self.events.get()
            self.kube.create_event(namespace, body)

    def watch_claims(self) -> None:
        path = f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{self.namespace}/{names.PLURAL_CLAIM}"
        for obj in watch_objects(self.kube, path):
            name = obj["metadata"]["name"]
            if not (obj.get("status") or {}).get("phase") and name not in self._seen:
                self._seen.add(name)
                self.claims.put(obj)


def _event(obj: Body, message: str) -> Body:
    meta = obj["metadata"]
    now = timestamps.now_rfc3339()
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta.get("uid"),
                               "resourceVersion": meta.get("resourceVersion")},
            "type": "Normal", "reason": "Bound", "message": message, "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT, "firstTimestamp": now, "lastTimestamp": now, "count": 1}


def watch_objects(kube: KubeApi, path: str) -> Any:
    """Objects of every ADDED/MODIFIED event of `path`, from a fresh list version, forever."""
    version = ""
    while True:
        try:
            if not version:
                items, version = kube._list(path)
                yield from items
            for event in kube.watch(path, resource_version=version, timeout_s=900):
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    version = ""
                    break
                version = obj.get("metadata", {}).get("resourceVersion", version)
                if event.get("type") in ("ADDED", "MODIFIED"):
                    yield obj
        except Exception as err:  # reopen; a bench process must not die of one dropped watch
            print(f"{Path(sys.argv[0]).stem}: watch {path} reopened: {err}", file=sys.stderr, flush=True)


def _drain(kube: KubeApi, path: str) -> None:
    for _ in watch_objects(kube, path):
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--model", required=True, help="spec.model of the GPUs to bind to")
    args = parser.parse_args()
    kube = KubeApi.from_kubeconfig(args.kubeconfig)
    null = NullController(kube, args.namespace, args.model)
    for target, arg in ((_drain, f"/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL_GPU}"),
                        (_drain, f"/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL_ELASTIC_GPU}")):
        threading.Thread(target=target, args=(kube, arg), daemon=True).start()
    threading.Thread(target=null.write_events, daemon=True).start()
    threading.Thread(target=null.dispatch, daemon=True).start()
    null.watch_claims()


if __name__ == "__main__":
    main()
