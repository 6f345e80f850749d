"""The controller's start-up list, in-process: its cost per object by stage (issue 49 item 2).

`bench/fleet_controller.py --prebound` measured the phase "listed" (every kind listed in pages
of 500 and merged into the picture before the controller leads) at ~0.35 ms per object: ~60 s
at 40,000 cards / 50,000 claims, against a 15 s budget for start -> first bind. This script
splits that phase without an API server: it builds the list pages the server would send at a
size (GPU objects with 4 reservations on each card in use, Bound claims, their ElasticGPUs,
one pod per inline claim, `--pods-percent` of the claims; metadata with managedFields as the
server writes them) as bytes, then runs the controller's own `Informer.relist(start=True)` on
them through `KubeApi` (only `_send`, the socket, is replaced: it answers the pages), timing:

  json     `KubeApi._list`: orjson.loads of each page (the controller's own parse);
  picture  `Picture.merge_lists` per kind (model validation and the picture's indexes);
  model    of that, `model_validate` alone per object (measured apart, on the same bodies);
  queue    `WorkQueue.add` of every key.

CPU seconds per 1,000 objects for each, the page bytes, and the process RSS. `--profile`: a
cProfile top-20 by cumulative time of the relist. `--experiments`: what other take-in paths
would cost on the same bodies (json instead of orjson; `model_construct` instead of validation).
`--held`: the bytes the picture holds per object, by kind (tracemalloc after a collection: the
relist again with the kinds served one more at a time, gpu+class, +egpu, +claim, +pod, each
kind's the growth it adds; the goal of issue 49 item 2 is ~5 KiB per object or less, all kinds).
`--only gpu,class`: the server answers those kinds alone (what a safe first placement needs). `--gc off|freeze`: the
relist with Python's cyclic garbage collector disabled, or with the objects built before it frozen.

    python bench/first_list.py                               # 2,000 cards / 2,500 claims
    python bench/first_list.py --cards 8000 --claims 10000 --experiments
    python bench/first_list.py --cards 40000 --claims 50000 --profile
    python bench/first_list.py --cards 8000 --claims 10000 --held
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import gc
import json
import pstats
import resource
import sys
import time
import tracemalloc
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kubernetes import client  # noqa: E402

from elasticgpu.api import names  # noqa: E402
from elasticgpu.api.claim import ElasticGPUClaim  # noqa: E402
from elasticgpu.api.elastic_gpu import ElasticGPU  # noqa: E402
from elasticgpu.api.gpu import GPU  # noqa: E402
from elasticgpu.api.gpu_class import ElasticGPUClass  # noqa: E402
from elasticgpu.controller.admission import reviewing  # noqa: E402
from elasticgpu.controller.edge.kube import KubeApi  # noqa: E402
from elasticgpu.controller.flow.machinery.informer import Informer  # noqa: E402
from elasticgpu.controller.flow.machinery.workqueue import WorkQueue  # noqa: E402
from elasticgpu.controller.picture.picture import Picture  # noqa: E402
from elasticgpu.controller.settings import ControllerSettings  # noqa: E402

NAMESPACE = "fleet"
CLASS = "fleet"
MODEL = "FLEET-A100"
CONTAINER = "main"
PAGE = 500
STAMP = "2026-12-07T03:00:00Z"
KINDS = ("gpu", "egpu", "class", "claim", "pod")
MODELS: dict[str, Any] = {"gpu": GPU, "egpu": ElasticGPU, "class": ElasticGPUClass, "claim": ElasticGPUClaim}


def _uid(kind: str, index: int) -> str:
    return f"{zlib.crc32(kind.encode()):08x}-{index // 0x10000:04x}-4{index % 0x1000:03x}-8000-{index:012x}"


def _meta(kind: str, index: int, name: str, managers: list[tuple[str, str, dict[str, Any]]], *,
          namespace: str | None = None, **more: Any) -> dict[str, Any]:
    """Metadata as the server returns it: uid, resourceVersion, generation, creationTimestamp and
    one managedFields entry per writer (the server sends them in lists; they are most of a small
    object's bytes)."""
    meta: dict[str, Any] = {"name": name, "uid": _uid(kind, index), "resourceVersion": str(1000 + index),
                            "generation": 1, "creationTimestamp": STAMP}
    if namespace:
        meta["namespace"] = namespace
    meta.update(more)
    meta["managedFields"] = [{"manager": manager, "operation": "Update", "apiVersion": api, "time": STAMP,
                              "fieldsType": "FieldsV1", "fieldsV1": fields,
                              **({"subresource": "status"} if "f:status" in fields else {})}
                             for manager, api, fields in managers]
    return meta


def _fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """A FieldsV1 set naming every field of `body` (what the server records for a writer)."""
    out: dict[str, Any] = {}
    for key, value in body.items():
        if isinstance(value, Mapping):
            out[f"f:{key}"] = _fields(value) or {}
        elif isinstance(value, list):
            out[f"f:{key}"] = {}
        else:
            out[f"f:{key}"] = {}
    return out


def gpu(index: int, holders: list[tuple[str, str, str]]) -> dict[str, Any]:
    """A card as the agent creates it, with the controller's reservations (elasticGPU, claimRef) in
    its status: `holders` (ElasticGPU, claim name, claim uid), 25 cores / 10 GiB each."""
    name = f"gpu-fleet-{index:06d}"
    spec = {"index": index % 8, "uuid": name.upper(), "model": MODEL, "memory": 81920,
            "nodeName": f"fleet-node-{index // 8:05d}"}
    status: dict[str, Any] = {
        "capacity": {names.RESOURCE_CORE: 100, names.RESOURCE_MEMORY: 81920},
        "allocatable": {names.RESOURCE_CORE: 100 - 25 * len(holders),
                        names.RESOURCE_MEMORY: 81920 - 10240 * len(holders)},
        "health": "Healthy",
        "conditions": [{"type": "Ready", "status": "True", "reason": "Healthy", "message": "",
                        "lastTransitionTime": STAMP}],
        "allocations": [{"elasticGPU": egpu, "claimRef": {"kind": names.KIND_CLAIM, "namespace": NAMESPACE,
                                                          "name": claim, "uid": uid},
                         "cores": 25, "memory": 10240, "reservedAt": STAMP} for egpu, claim, uid in holders]}
    body = {"spec": spec, "status": status}
    managers = [("elasticgpu-agent", names.API_VERSION, _fields({"spec": spec})),
                ("elasticgpu-controller", names.API_VERSION, _fields({"status": status}))]
    return {"apiVersion": names.API_VERSION, "kind": names.KIND_GPU,
            "metadata": _meta("gpu", index, name, managers), **body}


def claim(index: int, name: str, egpu: str, card: int, pod: tuple[str, str] | None) -> dict[str, Any]:
    """A Bound claim as the controller leaves it (owned by its pod when inline)."""
    gpu_name = f"gpu-fleet-{card:06d}"
    spec = {"elasticGPUClassName": CLASS, "elasticGPUName": egpu,
            "resources": {"requests": {names.RESOURCE_CORE: 25, names.RESOURCE_MEMORY: "10Gi"}}}
    status = {"phase": "Bound", "capacity": {names.RESOURCE_CORE: 25, names.RESOURCE_MEMORY: "10Gi"},
              "allocatedResources": {names.RESOURCE_CORE: 25, names.RESOURCE_MEMORY: "10Gi"},
              "resizable": True, "nodeName": f"fleet-node-{card // 8:05d}", "gpus": [gpu_name.upper()],
              "conditions": [{"type": "Bound", "status": "True", "reason": "Bound", "message": f"bound to {egpu}",
                              "lastTransitionTime": STAMP}],
              "users": [{"name": pod[0], "uid": pod[1]}] if pod else []}
    more: dict[str, Any] = {"finalizers": [names.FINALIZER_CLAIM_PROTECTION]}
    if pod:
        more["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": pod[0], "uid": pod[1],
                                    "controller": True, "blockOwnerDeletion": True}]
    managers = [("elasticgpu-controller", names.API_VERSION, _fields({"spec": spec})),
                ("elasticgpu-controller", names.API_VERSION, _fields({"status": status}))]
    return {"apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM,
            "metadata": _meta("claim", index, name, managers, namespace=NAMESPACE, **more),
            "spec": spec, "status": status}


def elastic_gpu(index: int, name: str, claim_name: str, claim_uid: str, card: int) -> dict[str, Any]:
    """The ElasticGPU of a Bound gpushare claim (a slice of one card)."""
    gpu_name = f"gpu-fleet-{card:06d}"
    node = f"fleet-node-{card // 8:05d}"
    spec = {"capacity": {names.RESOURCE_CORE: 25, names.RESOURCE_MEMORY: "10Gi"}, "gpuShare": {"gpuName": gpu_name},
            "claimRef": {"kind": names.KIND_CLAIM, "namespace": NAMESPACE, "name": claim_name, "uid": claim_uid},
            "nodeName": node, "elasticGPUClassName": CLASS, "reclaimPolicy": "Delete"}
    status = {"phase": "Bound", "capacity": {names.RESOURCE_CORE: 25, names.RESOURCE_MEMORY: "10Gi"},
              "nodeName": node, "gpus": [gpu_name.upper()], "claim": f"{NAMESPACE}/{claim_name}"}
    managers = [("elasticgpu-controller", names.API_VERSION, _fields({"spec": spec})),
                ("elasticgpu-controller", names.API_VERSION, _fields({"status": status}))]
    return {"apiVersion": names.API_VERSION, "kind": names.KIND_ELASTIC_GPU,
            "metadata": _meta("egpu", index, name, managers, labels={"elasticgpu.io/claim-name": claim_name},
                              finalizers=[names.FINALIZER_EGPU_PROTECTION]),
            "spec": spec, "status": status}


def pod(index: int, name: str, card: int) -> dict[str, Any]:
    """A running pod with one inline request, as the webhook let it in (its patch applied by
    `reviewing.decide`), its gate lifted, with the fields the server and kubelet add."""
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE,
                     "annotations": {names.inline_request_annotation(CONTAINER): "gpu-core=25,gpu-memory=10Gi"}},
        "spec": {"containers": [{"name": CONTAINER, "image": "busybox:1.36",
                                 "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}}
    verdict = reviewing.decide({"operation": "CREATE", "kind": {"kind": "Pod"}, "namespace": NAMESPACE,
                                "object": copy.deepcopy(body)})
    for op in verdict.patch:  # RFC 6902 add, as bench/fleet_prebound.py applies it
        parts = op["path"].lstrip("/").split("/")
        target: Any = body
        for part in parts[:-1]:
            target = target.setdefault(part.replace("~1", "/"), {}) if isinstance(target, dict) else target[int(part)]
        last = parts[-1].replace("~1", "/")
        if isinstance(target, list):
            target.append(op["value"])
        else:
            target[last] = op["value"]
    body["spec"].pop("schedulingGates", None)  # lifted
    node = f"fleet-node-{card // 8:05d}"
    container = body["spec"]["containers"][0]
    container.update({"terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                      "imagePullPolicy": "IfNotPresent",
                      "volumeMounts": [{"name": "kube-api-access-x", "readOnly": True,
                                        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]})
    body["spec"].update({
        "nodeName": node, "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default", "serviceAccount": "default", "securityContext": {},
        "schedulerName": "default-scheduler", "priority": 0, "enableServiceLinks": True, "preemptionPolicy":
        "PreemptLowerPriority",
        "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                         "tolerationSeconds": 300},
                        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                         "tolerationSeconds": 300}],
        "volumes": [{"name": "kube-api-access-x", "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1",
                                                                           "fieldPath": "metadata.namespace"}}]}}]}}]})
    body["status"] = {
        "phase": "Running", "hostIP": "10.0.0.1", "podIP": f"10.1.{index // 250 % 250}.{index % 250}",
        "startTime": STAMP, "qosClass": "Burstable",
        "conditions": [{"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": STAMP}
                       for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                                 "PodScheduled")],
        "containerStatuses": [{"name": CONTAINER, "ready": True, "restartCount": 0, "started": True,
                               "image": "docker.io/library/busybox:1.36", "imageID": "docker.io/library/busybox@sha256:"
                               + "0" * 64, "containerID": "containerd://" + f"{index:064x}",
                               "state": {"running": {"startedAt": STAMP}}, "lastState": {}}]}
    meta = body["metadata"]
    managers = [("kubectl-create", "v1", _fields({"metadata": meta, "spec": body["spec"]})),
                ("elasticgpu-controller", "v1", {"f:spec": {"f:schedulingGates": {}}}),
                ("kubelet", "v1", _fields({"status": body["status"]}))]
    body["metadata"] = _meta("pod", index, name, managers, namespace=NAMESPACE,
                             labels=meta.get("labels", {}), annotations=meta.get("annotations", {}))
    return body


def build(cards: int, claims: int, pods_percent: int) -> dict[str, list[dict[str, Any]]]:
    """Every object of the cluster by kind: claims packed 4 per card from card 0."""
    objects: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
    holders: dict[int, list[tuple[str, str, str]]] = {}
    user = 100 - pods_percent
    for i in range(claims):
        card = i // 4
        inline = (i * user) // 100 == ((i + 1) * user) // 100
        egpu_name = f"egpu-{i:06d}"
        if inline:
            pod_name = f"pod-{i:06d}"
            objects["pod"].append(pod(i, pod_name, card))
            owner: tuple[str, str] | None = (pod_name, objects["pod"][-1]["metadata"]["uid"])
            claim_name = f"{pod_name}-{CONTAINER}"
        else:
            owner, claim_name = None, f"claim-{i:06d}"
        body = claim(i, claim_name, egpu_name, card, owner)
        objects["claim"].append(body)
        objects["egpu"].append(elastic_gpu(i, egpu_name, claim_name, body["metadata"]["uid"], card))
        holders.setdefault(card, []).append((egpu_name, claim_name, body["metadata"]["uid"]))
    objects["gpu"] = [gpu(i, holders.get(i, [])) for i in range(cards)]
    objects["class"] = [{"apiVersion": names.API_VERSION, "kind": names.KIND_CLASS,
                         "metadata": _meta("class", 0, CLASS, []), "provisioner": names.PROVISIONER_GPUSHARE,
                         "parameters": {"gpuModel": MODEL}}]
    return objects


def pages(items: list[dict[str, Any]], plural: str) -> list[bytes]:
    """The list answers of one collection, pages of `PAGE`, as bytes (what `_send` returns)."""
    out = []
    for start in range(0, max(len(items), 1), PAGE):
        more = start + PAGE < len(items)
        meta: dict[str, Any] = {"resourceVersion": "999999"}
        if more:
            meta["continue"] = f"{plural}-{start + PAGE}"
        out.append(orjson.dumps({"apiVersion": "v1", "kind": "List", "metadata": meta,
                                 "items": items[start:start + PAGE]}))
    return out


class PagedKube(KubeApi):
    """The controller's KubeApi with its socket replaced by the pages: every other step of a list
    (`_call`'s orjson parse, `_list`'s paging) is the product's."""

    def __init__(self, served: dict[str, list[bytes]]) -> None:
        super().__init__(client.ApiClient(client.Configuration(host="http://127.0.0.1:9")))
        self.served = served
        self.json_s: dict[str, float] = {}

    def _send(self, method: str, path: str, *, body: object, query: Mapping[str, str] | None,  # type: ignore[override]
              content_type: str, timeout_s: float | None, accept: str = "application/json") -> tuple[int, bytes]:
        key = next((k for k in self.served if path.endswith("/" + k)), None)
        if key is None:
            return 200, b'{"kind":"List","metadata":{"resourceVersion":"999999"},"items":[]}'
        token = (query or {}).get("continue", "")
        return 200, self.served[key][int(token.rsplit("-", 1)[1]) // PAGE if token else 0]

    def list_collection(self, path: str, *, accept: str = "application/json") -> tuple[list[dict[str, Any]], str]:
        began = time.process_time()
        try:
            return super().list_collection(path, accept=accept)
        finally:
            kind = path.rsplit("/", 1)[1]
            self.json_s[kind] = self.json_s.get(kind, 0.0) + time.process_time() - began


def _timed(owner: Any, attr: str, spent: dict[str, float], label: str) -> None:
    """Wrap `owner.attr` so that its CPU seconds add up under `label`."""
    inner: Callable[..., Any] = getattr(owner, attr)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.process_time()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[label] = spent.get(label, 0.0) + time.process_time() - began
    setattr(owner, attr, wrapper)


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


PLURALS = {"gpu": names.PLURAL_GPU, "egpu": names.PLURAL_ELASTIC_GPU, "class": names.PLURAL_CLASS,
           "claim": names.PLURAL_CLAIM, "pod": "pods"}


def relist(served: dict[str, list[bytes]], *, profile: bool) -> tuple[dict[str, float], float, int, Picture]:
    """One `Informer.relist(start=True)` on the pages: CPU seconds by stage, the wall seconds,
    the keys queued and the picture."""
    kube = PagedKube(served)
    picture = Picture()
    queue = WorkQueue(ControllerSettings().retry)
    informer = Informer(kube=kube, picture=picture, queue=queue, namespace=None)
    spent: dict[str, float] = {}
    _timed(picture.ledger, "observe_gpu", spent, "picture gpu")
    _timed(picture, "_egpu_keys", spent, "picture egpu")
    _timed(picture, "_store_claim", spent, "picture claim")
    _timed(picture.pods, "merge", spent, "picture pod (index)")
    _timed(picture, "_merge_pods", spent, "picture pod (claims)")
    _timed(queue, "add", spent, "queue")
    profiler = cProfile.Profile() if profile else None
    began = time.monotonic()
    if profiler:
        profiler.enable()
    informer.relist(start=True)
    if profiler:
        profiler.disable()
    wall = time.monotonic() - began
    for plural, seconds in kube.json_s.items():
        kind = next((k for k, p in PLURALS.items() if p == plural), plural)
        spent[f"json {kind}"] = seconds
    if profiler:
        stats = pstats.Stats(profiler)
        stats.sort_stats("cumulative").print_stats(20)
    return spent, wall, len(queue), picture


def per_object_model(served: dict[str, list[bytes]]) -> dict[str, float]:
    """CPU seconds of `model_validate` alone per kind, on bodies parsed afresh (the picture keeps
    what it validated)."""
    spent: dict[str, float] = {}
    for kind, model in MODELS.items():
        bodies = [b for page in served[PLURALS[kind]] for b in orjson.loads(page)["items"]]
        began = time.process_time()
        for body in bodies:
            model.model_validate(body)
        spent[kind] = time.process_time() - began
    return spent


HELD_ORDER: tuple[tuple[str, ...], ...] = ((), ("gpu", "class"), ("egpu",), ("claim",), ("pod",))
"""The stages of `held_by_kind`: each serves the kinds before it too (a claim's pod index needs
the claim, an ElasticGPU's accounting its GPU), as the controller's own merge order does; the
first serves nothing (what an empty picture holds, and caches filled once, are no kind's)."""


def held_by_kind(served: dict[str, list[bytes]], counts: dict[str, int]) -> dict[str, int]:
    """Bytes the picture holds after a relist (tracemalloc, after a full collection), by kind:
    the relist run once per stage of `HELD_ORDER`, each stage's growth over the one before
    charged to the kinds it adds. The page bytes and the parsed lists are freed by then: what
    remains is what the picture keeps (models, JSON, indexes, the allocator's inventory)."""
    held: dict[str, int] = {}
    serving: list[str] = []
    before = 0
    for stage in HELD_ORDER:
        serving += stage
        if stage and not any(counts[k] for k in stage):
            continue
        pages_now = {PLURALS[k]: served[PLURALS[k]] if k in serving else pages([], PLURALS[k]) for k in KINDS}
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        picture = relist(pages_now, profile=False)[3]
        gc.collect()
        total = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        del picture
        if stage:
            held["+".join(stage)] = total - before
        before = total
    return held


def experiments(counts: dict[str, int], served: dict[str, list[bytes]]) -> None:
    """Other take-in paths on the same bodies, CPU seconds per kind; the parses with the garbage
    collector off (on, its passes over the picture already held dominate and scatter them)."""
    gc.disable()
    for kind in KINDS:
        raw = served[PLURALS[kind]]
        began = time.process_time()
        for page in raw:
            orjson.loads(page)
        fast = time.process_time() - began
        began = time.process_time()
        for page in raw:
            json.loads(page)
        slow = time.process_time() - began
        line = f"  {kind:6} orjson {fast:6.2f} s  json {slow:6.2f} s"
        if kind in MODELS:
            bodies = [b for page in raw for b in orjson.loads(page)["items"]]
            began = time.process_time()
            for body in bodies:
                MODELS[kind].model_construct(**body)
            line += f"  model_construct {time.process_time() - began:6.2f} s"
        print(line)
    gc.enable()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cards", type=int, default=2000)
    parser.add_argument("--claims", type=int, default=2500)
    parser.add_argument("--pods-percent", type=int, default=80, help="claims that are pods' inline requests")
    parser.add_argument("--profile", action="store_true", help="cProfile top-20 (cumulative) of the relist")
    parser.add_argument("--experiments", action="store_true", help="json vs orjson, model_construct")
    parser.add_argument("--held", action="store_true",
                        help="bytes the picture holds per object by kind (tracemalloc, one relist per kind added)")
    parser.add_argument("--only", default=",".join(KINDS),
                        help="the kinds the server answers (the others list empty), e.g. gpu,class: what a safe"
                             " first placement needs")
    parser.add_argument("--gc", choices=("on", "off", "freeze", "threshold"), default="on",
                        help="the cyclic garbage collector during the relist: as the controller runs (on), disabled"
                             " (off), every object built before it frozen out of its generations (freeze), or its first"
                             " generation's threshold at 50,000 allocations instead of 700 (threshold)")
    args = parser.parse_args()
    if args.claims > 4 * args.cards:
        parser.error(f"--claims {args.claims} do not fit {args.cards} cards (4 per card)")
    began = time.monotonic()
    objects = build(args.cards, args.claims, args.pods_percent)
    only = args.only.split(",")
    objects = {k: (v if k in only else []) for k, v in objects.items()}
    served = {PLURALS[k]: pages(v, PLURALS[k]) for k, v in objects.items()}
    sizes = {k: sum(len(p) for p in served[PLURALS[k]]) for k in KINDS}
    counts = {k: len(v) for k, v in objects.items()}
    objects.clear()  # only the bytes stay, as in the controller (the built dicts would be RSS and gc work)
    print(f"built {counts} in {time.monotonic() - began:.1f} s; RSS {rss_mib():.0f} MiB")
    for kind in KINDS:
        print(f"  {kind:6} {counts[kind]:7} objects, {sizes[kind] / 2**20:7.1f} MiB of pages,"
              f" {sizes[kind] / max(counts[kind], 1):6.0f} bytes each")
    gc.collect()
    if args.gc == "freeze":
        gc.freeze()
    if args.gc == "off":
        gc.disable()
    if args.gc == "threshold":
        gc.set_threshold(50_000, 10, 10)
    collections = sum(st["collections"] for st in gc.get_stats())
    rss_before = rss_mib()
    cpu_before = time.process_time()
    spent, wall, queued, picture = relist(served, profile=args.profile)
    cpu = time.process_time() - cpu_before
    collections = sum(st["collections"] for st in gc.get_stats()) - collections
    gc.enable()
    print(f"gc {args.gc}: {collections} collections during the relist")
    total = sum(counts.values())
    print(f"relist(start=True): {wall:.2f} s wall, {cpu:.2f} s CPU, {total} objects:"
          f" {1000 * cpu / total:.3f} ms CPU per object; {queued} keys queued;"
          f" RSS {rss_before:.0f} -> {rss_mib():.0f} MiB (+{(rss_mib() - rss_before) * 1024 / total:.1f} KiB/object)")
    model = per_object_model(served)
    print("stage                  CPU s   per 1,000 objects")
    for label in sorted(spent):
        kind = label.split()[1] if " " in label else ""
        n = counts.get(kind, total)
        print(f"  {label:22} {spent[label]:6.2f}  {1000 * spent[label] / max(n, 1):7.3f} s")
    for kind, seconds in model.items():
        print(f"  {'model ' + kind + ' (apart)':22} {seconds:6.2f}  {1000 * seconds / max(counts[kind], 1):7.3f} s")
    if args.held:
        del picture
        held = held_by_kind(served, counts)
        print("held by the picture after a collection (tracemalloc), bytes per object:")
        for stage, size in held.items():
            n = sum(counts[k] for k in stage.split("+"))
            print(f"  {stage:10} {n:7} objects {size / 2**20:8.1f} MiB {size / max(n, 1):8.0f} B/object")
        everything = sum(held.values())
        print(f"  {'all':10} {total:7} objects {everything / 2**20:8.1f} MiB {everything / total:8.0f} B/object"
              f" ({everything / total / 1024:.2f} KiB)")
        picture = None
    if args.experiments:
        print("experiments (CPU s, same bodies):")
        experiments(counts, served)
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    del picture


if __name__ == "__main__":
    main()
