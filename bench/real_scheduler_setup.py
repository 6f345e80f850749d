"""The simulated cluster of bench/real_scheduler.py, written by several processes: Node objects (Ready,
allocatable), optionally their Leases, the 8 GPU objects of each node (the agent's own spec and status
builders), and a made-up DRA driver's ResourceSlices.

Why processes: one Python process of 16 threads topped out at ~106 writes/s on its own JSON, TLS and
client machinery (2,000 nodes + 16,000 GPU objects: 38,000 writes in 360 s), and 5,000 nodes for ours
is ~85,000 writes. `writers` spawned processes of `threads` threads each split the items; below
`FAN_OUT_MIN` items (500: the smoke test's 3 nodes, 100 nodes) the writes stay in this process, where a spawn would
cost more than it saves.

Why a Node is written with its status in the create: the API server keeps a Node's status on create
(kubelet registers that way), so the Ready condition and allocatable take one write, not two; the
object the scheduler sees is the same.
"""

from __future__ import annotations

import datetime
import multiprocessing
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from elasticgpu.api import names

CARDS_PER_NODE = 8
MODEL = "NVIDIA BENCH-80GB"
CARD_MIB = 81920
ONE_DRIVER, SHARED_DRIVER = "one.bench.example.com", "shared.bench.example.com"
RESOURCE = ("resource.k8s.io", "v1")
SLICE_LABEL = "bench.example.com/driver"
FAN_OUT_MIN = 500
"""Fewer items than this are written by threads of the calling process (no spawn): at 100 nodes four
spawned writers (each importing the kubernetes client) took 37 s for 1,700 writes, one process 18-24 s."""


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def raw(response: Any) -> bytes:
    """The body of a `_preload_content=False` answer, read whole and its connection given back to the pool
    (unread, each such call would leave its connection and the next one would pay a TLS handshake)."""
    try:
        return bytes(response.data)
    finally:
        response.release_conn()


def node_name(index: int) -> str:
    return f"bench-node-{index:04d}"


def node_body(node: str) -> dict[str, Any]:
    allocatable = {"cpu": "64", "memory": "256Gi", "pods": "110"}
    return {"metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}},
            "status": {"allocatable": allocatable, "capacity": allocatable,
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "message": "bench: simulated node", "lastHeartbeatTime": now(),
                                       "lastTransitionTime": now()}]}}  # fmt: skip


def slice_devices(driver: str) -> list[dict[str, Any]]:
    """`one`: 8 exclusive devices; `shared`: 8 shareable devices with consumable capacity (any whole
    number of cores 1..100, memory in MiB steps)."""
    model = {"model": {"string": MODEL}}
    if driver == ONE_DRIVER:
        return [{"name": f"gpu-{i}", "attributes": model, "capacity": {"memory": {"value": "80Gi"}}}
                for i in range(CARDS_PER_NODE)]  # fmt: skip
    return [{"name": f"gpu-{i}", "attributes": model, "allowMultipleAllocations": True, "capacity": {
        "cores": {"value": "100", "requestPolicy": {"default": "100", "validRange": {"min": "1", "step": "1"}}},
        "memory": {"value": "80Gi", "requestPolicy": {"default": "80Gi", "validRange": {"min": "1Mi", "step": "1Mi"}}}}}
        for i in range(CARDS_PER_NODE)]  # fmt: skip


class Writer:
    """The writes of one process, each taking one item (a node's index)."""

    def __init__(self, api: Any) -> None:
        from kubernetes import client

        self.core, self.custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        self.coordination = client.CoordinationV1Api(api)

    def node(self, n: int) -> None:
        # raw answers: not turned into a V1Node (client CPU that bounded set-up with the server's)
        raw(self.core.create_node(node_body(node_name(n)), _preload_content=False))

    def lease(self, n: int) -> None:
        node = node_name(n)
        raw(self.coordination.create_namespaced_lease("kube-node-lease", {
            "metadata": {"name": node},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": now()}},
            _preload_content=False))  # fmt: skip

    def gpus(self, n: int) -> None:
        """The node's 8 GPU objects, as the agent publishes them (its own spec and status builders):
        a create and a status write each (a custom resource's status is dropped on create)."""
        from elasticgpu.agent.discovery import Card
        from elasticgpu.agent.health import CardHealth
        from elasticgpu.agent.inventory import desired_status, gpu_spec

        node = node_name(n)
        for index in range(CARDS_PER_NODE):
            uuid = f"GPU-BENCH-{n:04d}-{index}"
            card = Card(index=index, uuid=uuid, model=MODEL, memory_mib=CARD_MIB, minor=index,
                        device_path=f"/dev/nvidia{index}")  # fmt: skip
            name = names.gpu_object_name(uuid)
            body = {"apiVersion": names.API_VERSION, "kind": names.KIND_GPU,
                    "metadata": {"name": name, "labels": {names.LABEL_NODE: node}}, "spec": gpu_spec(card, node)}
            raw(self.custom.create_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL_GPU, body,
                                                         _preload_content=False))  # fmt: skip
            health = CardHealth(healthy=True, reason="NoFatalXid", message="bench: simulated card")
            status = desired_status({}, card=card, health=health, usage=None, node_name=node, now=time.time())
            raw(self.custom.patch_cluster_custom_object_status(names.GROUP, names.VERSION, names.PLURAL_GPU, name,
                                                               {"status": status}, _preload_content=False))  # fmt: skip

    def slice(self, driver: str, n: int) -> None:
        """One ResourceSlice of `driver` for node `n`, as its kubelet plugin would publish it."""
        node, short = node_name(n), driver.split(".")[0]
        raw(self.custom.create_cluster_custom_object(*RESOURCE, "resourceslices", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{short}", "labels": {SLICE_LABEL: short}},
            "spec": {"driver": driver, "nodeName": node, "devices": slice_devices(driver),
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}}},
            _preload_content=False))  # fmt: skip

    def job(self, what: str) -> Callable[[int], None]:
        """`node`, `lease`, `gpus`, or `slice:<driver>`."""
        if what.startswith("slice:"):
            driver = what.split(":", 1)[1]
            return lambda n: self.slice(driver, n)
        jobs: dict[str, Callable[[int], None]] = {"node": self.node, "lease": self.lease, "gpus": self.gpus}
        return jobs[what]


def _client(kubeconfig: str, threads: int) -> Any:
    from kubernetes import config

    api = config.new_client_from_config(config_file=kubeconfig)
    api.configuration.connection_pool_maxsize = threads * 2
    return api


def _write_range(kubeconfig: str, jobs: tuple[str, ...], items: list[int], threads: int) -> int:
    """In a writer process (or this one): each job for each item, by `threads` threads."""
    api = _client(kubeconfig, threads)
    try:
        writer = Writer(api)
        for what in jobs:  # one job after the other: a node exists before its lease or GPU objects
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(writer.job(what), items))
    finally:
        api.close()
    return len(items)


def write(kubeconfig: str, jobs: tuple[str, ...], items: list[int], *, writers: int, threads: int) -> float:
    """Do `jobs` for every item with `writers` processes of `threads` threads (in this process below
    FAN_OUT_MIN items or with one writer); returns the seconds it took."""
    began = time.monotonic()
    if writers <= 1 or len(items) < FAN_OUT_MIN:
        _write_range(kubeconfig, jobs, items, threads)
        return time.monotonic() - began
    # interleaved shares: every process has nodes of the whole range (no process ends long after the rest)
    shares = [items[i::writers] for i in range(writers)]
    context = multiprocessing.get_context("spawn")  # the bench has threads (lease renewals, watches): no fork
    with context.Pool(writers) as pool:
        done = sum(pool.starmap(_write_range, [(kubeconfig, jobs, share, threads) for share in shares]))
    if done != len(items):
        raise SystemExit(f"set-up: {done} of {len(items)} items written ({jobs}); fix: see the writers' errors above")
    return time.monotonic() - began
