"""Pods that use claims on Kubernetes' own scheduler: ours against DRA's and plain pods, same nodes.

Starts the real control plane (elasticgpu/testbed/real_cluster.py: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler v1.36.3; `bash testcluster/build.sh` builds the binary),
installs the CRDs and writes, as kubelet, the node agent and a DRA driver would:

  * N Node objects with allocatable (64 CPU, 256Gi, 110 pods) and a Ready condition, written with
    their status in the create, and no Leases: the controller manager's node grace is 24 h, so no
    node goes Unknown (`--lease-renew-s S`: Leases in kube-node-lease renewed every S s, spread over
    the period, the grace at 5 periods, at least 300 s; no kubelet runs, no runtime); the
    controller manager and scheduler run with leader election off;
  * 8 GPU objects per node, built by the agent's own `gpu_spec`/`desired_status` (the controller
    runs with a heartbeat grace of 24 h: nobody beats after that), when an ours kind runs; before
    the first run the bench waits until our controller has digested them (its CPU below 10%);
  * nodes, GPU objects and ResourceSlices are written by `--writers` processes (4) of
    `--writer-threads` threads (8) from 500 nodes (bench/real_scheduler_setup.py);
  * for DRA (resource.k8s.io/v1, GA; consumable capacity is beta and on by default in 1.36), two
    made-up drivers, a DeviceClass each: `one.bench.example.com`, 8 devices per node for exclusive
    use, and `shared.bench.example.com`, 8 devices per node with `allowMultipleAllocations` and
    capacity `cores` 100 / `memory` 80Gi. A DRA run publishes one ResourceSlice per node of its own
    driver only (before its idle window) and withdraws them after, so the scheduler sees 8 usable
    devices per node, never both drivers' 16;
  * for DRA served by our driver (issue 48), the cards handed to DRA (spec.owner, our controller
    moves status.owner) and one ResourceSlice per node published by the agent's own publisher
    (bench/real_scheduler_dra.py), only for the runs of those kinds;

then runs our controller (all namespaces, leader election off) and webhook as processes, and runs
of P pods per kind, each kind in its own namespace:

  plain       pods with no claim: the scheduler's own ceiling on this machine;
  ours-whole  one inline whole card (`gpu=1`, class with provisioner elasticgpu.io/physical);
  ours-slice  one inline slice (`gpu-core=10,gpu-memory=1Gi`, provisioner elasticgpu.io/gpushare);
  dra-one     a ResourceClaimTemplate asking for one device of class bench-one;
  dra-shared  a ResourceClaimTemplate asking for `cores: 10`, `memory: 1Gi` of one shared device;
  dra-ours    a ResourceClaimTemplate asking for one card of our driver (class gpu.elasticgpu.io;
              no capacity named: the whole card);
  dra-ours-shared  `cores: 10`, `memory: 1Gi` of one card of our driver (class gpu-slice.elasticgpu.io);
  claim-floor the fewest writes a claim kept as a custom resource needs (bench/claim_floor.py, a
              process of its own): per pod the claim's create, complete, its Bound status and the
              gate lift; no ElasticGPU, no reservation, no decisions. Not a product: a floor.

Ours: the webhook gates the pod, the controller makes and binds its claim and lifts the gate, the
scheduler places it. DRA: the controller manager's resourceclaim controller makes the claim from
the template, the scheduler's DRA plugin allocates it and binds the pod. Either way a pod counts as
scheduled when a watch first shows its `spec.nodeName`; afterwards the bench checks that every
claim is Bound (ours) or allocated and reserved for its pod (DRA).

`--repeat N` runs N rounds, the kinds rotated by one each round so that no kind always runs
first; between runs the namespace's pods are deleted (grace 0) and its claims, and the bench
waits until they and our ElasticGPUs are gone. Pods are created by 16 threads as fast as the API
server takes them (`--rate R` for a steady rate). Per run: pods scheduled/s (P / (last scheduled
- first create)), created -> scheduled p50/p99 (create call's return to the watch event), CPU ms
per pod of each component (/proc/<pid>/stat, from the first create to the last pod scheduled,
less the component's idle rate over `--idle-s` (20 s) just before the run times as long), and
writes per pod by resource, subresource and verb from the API server's own
`apiserver_request_total` (deltas until the writes settle after the last pod is scheduled;
`leases` are the nodes' heartbeats and leader election, time-bound, and left out of the totals).
The watch that times pods re-opens from the last version after an error and lists again after
410 Gone.

`--limits raised` starts the controller manager and the scheduler with `--kube-api-qps=500
--kube-api-burst=1000` (stock: 20/30 and 50/100); `--kube-api-qps/--kube-api-burst` set other
values. Our controller (Python kubernetes client) has no client-side rate limit; its work queue
limits only retries (50/s, burst 500).

`--profile KIND[,KIND]`: after the measured rounds, one more run of each such kind with the API
server's CPU profiled throughout (/debug/pprof/profile in back-to-back 3 s windows; the files, a
`go tool pprof -top` of them and bench/pprof_buckets.py's buckets, ms per pod side by side, go to
`--out`). Profiled runs are reported apart, not averaged in.

    python bench/real_scheduler.py --nodes 100 --pods 800 --repeat 2                  # stock limits
    python bench/real_scheduler.py --nodes 100 --pods 800 --repeat 2 --limits raised
    python bench/real_scheduler.py --nodes 100 --pods 800 --kinds ours-slice,dra-one --repeat 0 \\
        --profile ours-slice,dra-one                                                  # profiles only
    python bench/real_scheduler.py --nodes 3 --pods 6     # smoke (tests/realcluster/test_real_scheduler_bench.py)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import claim_floor  # noqa: E402
import pprof_buckets  # noqa: E402
import real_scheduler_dra as ours_dra  # noqa: E402
import real_scheduler_setup as setup  # noqa: E402
from first_seen import SeenClock  # noqa: E402

from elasticgpu.api import names  # noqa: E402

CARDS_PER_NODE, MODEL, RESOURCE = setup.CARDS_PER_NODE, setup.MODEL, setup.RESOURCE
ONE_DRIVER, SHARED_DRIVER, SLICE_LABEL = setup.ONE_DRIVER, setup.SHARED_DRIVER, setup.SLICE_LABEL
_now, raw = setup.now, setup.raw

SLICE_CLASS, WHOLE_CLASS = "bench-slice", "bench-whole"
ONE_CLASS, SHARED_CLASS = "bench-one", "bench-shared"
KINDS = ("plain", "ours-whole", "ours-slice", "dra-one", "dra-shared", *ours_dra.KINDS, "claim-floor")
CLAIMS_OF_OURS = ("ours-whole", "ours-slice", "claim-floor")
"""Kinds whose pods get ElasticGPUClaims."""
LEASE_RENEW_S = 10.0
"""kubelet's renewal period, for `--lease-renew-s` (renewals are off by default, below)."""
NODE_GRACE_RENEWALS = 5
NODE_GRACE_MIN_S = 300
"""With renewals, the node lifecycle controller's grace (stock 50 s): 5 renewal periods, at least 300 s."""
NODE_GRACE_NO_LEASES_S = 24 * 3600
"""Without Leases (the default): a grace longer than any invocation, so no node goes Unknown. Nobody
reads a node's Lease but the node lifecycle controller, and the renewals cost the API server 50
writes/s at 5,000 nodes (renewed every 100 s) for nothing the runs measure."""
THREADS = 16
PROFILE_WINDOW_S = 3
RAISED = (500.0, 1000)
WRITE_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "APPLY": "apply", "DELETE": "delete",
               "DELETECOLLECTION": "deletecollection"}
"""apiserver_request_total's write verbs (it says POST and PUT) and what the tables call them."""
COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "controller", "webhook", "etcd",
              "claim-floor", "bench")


def _percentiles(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    ordered = sorted(values)
    return statistics.median(ordered), ordered[int(0.99 * (len(ordered) - 1))]


def _cpu_s(pid: int) -> float:
    """utime + stime of a process (and its waited-for children), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def patiently(call: Callable[[], Any], what: str, timeout_s: float = 600) -> Any:
    """`call()`, again with backoff while the API server answers 429/5xx or the connection fails
    (a delete of 1,000 pods on a loaded machine outlives the server's 60 s request timeout)."""
    from kubernetes.client.rest import ApiException

    deadline, delay = time.monotonic() + timeout_s, 0.5
    while True:
        try:
            return call()
        except (ApiException, OSError) as err:
            status = getattr(err, "status", None)
            if (status is not None and status != 429 and status < 500) or time.monotonic() > deadline:
                raise
            print(f"  ({what}: {status or err}; again in {delay:.1f} s)", file=sys.stderr, flush=True)
            time.sleep(delay)
            delay = min(2 * delay, 15.0)


def namespace_of(kind: str) -> str:
    return f"bench-{kind}"


class Nodes:
    """The simulated nodes: Node objects with allocatable and Ready; with `renew_s`, Leases kept renewed."""

    def __init__(self, coordination: Any, count: int, renew_s: float) -> None:
        self.coordination, self.renew_s = coordination, renew_s
        self.names = [setup.node_name(i) for i in range(count)]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, daemon=True)

    def create(self, kubeconfig: str, *, writers: int, threads: int) -> float:
        """Write the nodes (and their Leases when renewed); the seconds it took."""
        jobs = ("node", "lease") if self.renew_s > 0 else ("node",)
        took = setup.write(kubeconfig, jobs, list(range(len(self.names))), writers=writers, threads=threads)
        if self.renew_s > 0:
            self._thread.start()
        return took

    def _renew(self) -> None:
        # kubelet renews every 10 s; the node lifecycle controller marks a node Unknown (and taints
        # it unreachable) after its grace period (50 s) without a renewal. 16 threads: with 4, a
        # round of 500 renewals took longer than the grace under the claims burst (a node got
        # tainted, the pods of its claims stayed Pending).
        # The renewals of a round are spread over the period, as kubelets' phases are: a burst of
        # 5,000 every 100 s would make an idle window's rate depend on whether it caught one.
        def renew(node: str) -> None:
            raw(self.coordination.patch_namespaced_lease(node, "kube-node-lease", {"spec": {"renewTime": _now()}},
                                                         _preload_content=False))  # fmt: skip

        step = self.renew_s / max(1, len(self.names))
        with ThreadPoolExecutor(THREADS) as pool:
            while not self._stop.is_set():
                began = time.monotonic()
                for i, node in enumerate(self.names):
                    if self._stop.wait(max(0.0, began + i * step - time.monotonic())):
                        return
                    pool.submit(renew, node)
                self._stop.wait(max(0.0, began + self.renew_s - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()


class FirstSeen(SeenClock):
    """When each object of a list was first seen meeting `condition`, through a watch of the kubernetes
    client (`list_call(**kwargs)` is the list function; raw objects, no deserialisation). After an
    error the watch re-opens from the last version seen; after 410 Gone (that version is compacted
    away) it lists again, and what the list shows meeting `condition` counts as seen at the list."""

    def __init__(self, list_call: Callable[..., Any], condition: Callable[[dict[str, Any]], bool],
                 **kwargs: Any) -> None:  # fmt: skip
        self.list_call, self.condition, self.kwargs = list_call, condition, kwargs
        super().__init__()
        self.relists = 0
        self._version = self._list()

    def _list(self) -> str:
        """List, note what meets the condition already, and return the list's resourceVersion."""
        answer = json.loads(self.list_call(**self.kwargs, _preload_content=False).data)
        for obj in answer.get("items") or []:
            if self.condition(obj):
                self.note(obj["metadata"]["name"])
        return str(answer["metadata"]["resourceVersion"])

    def _run(self) -> None:
        from kubernetes import watch
        from kubernetes.client.rest import ApiException

        while not self._stop.is_set():
            stream = watch.Watch()
            try:
                for event in stream.stream(self.list_call, **self.kwargs, resource_version=self._version,
                                           timeout_seconds=60, allow_watch_bookmarks=True):  # fmt: skip
                    obj = event["raw_object"]
                    self._version = obj.get("metadata", {}).get("resourceVersion", self._version)
                    if event["type"] != "DELETED" and event["type"] != "BOOKMARK" and self.condition(obj):
                        self.note(obj["metadata"]["name"])
                    if self._stop.is_set():
                        stream.stop()
            except ApiException as err:
                if err.status == 410:  # the version is gone: only a list says what happened meanwhile
                    print(f"  (watch expired: {err.reason}; listing again)", file=sys.stderr)
                    self.relists += 1
                    self._relist()
                else:
                    self._reopen(err)
            except Exception as err:  # reopened from the last version seen; the bench must not die of one drop
                self._reopen(err)

    def _relist(self) -> None:
        try:
            self._version = self._list()
        except Exception as err:  # the next pass lists again (the version is still gone)
            self._reopen(err)

    def _reopen(self, err: Exception) -> None:
        print(f"  (watch re-opened: {err})", file=sys.stderr)
        self._stop.wait(0.05)


def create_device_classes(custom: Any) -> None:
    """A DeviceClass per made-up DRA driver (CEL selector on the driver)."""
    for klass, driver in ((ONE_CLASS, ONE_DRIVER), (SHARED_CLASS, SHARED_DRIVER)):
        custom.create_cluster_custom_object(*RESOURCE, "deviceclasses", {
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": klass},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]}})  # fmt: skip


DRIVER_OF = {"dra-one": ONE_DRIVER, "dra-shared": SHARED_DRIVER}


def publish_slices(kubeconfig: str, driver: str, nodes: list[str], *, writers: int, threads: int) -> None:
    """One ResourceSlice per node of one made-up driver, as its kubelet plugin would publish them
    (real_scheduler_setup.slice_devices). Only the running DRA kind's driver is published, so its
    scheduler sees 8 devices per node, all usable, as on a node with one GPU driver."""
    setup.write(kubeconfig, (f"slice:{driver}",), list(range(len(nodes))), writers=writers, threads=threads)


def withdraw_slices(custom: Any, driver: str, timeout_s: float = 600) -> None:
    """Delete one driver's ResourceSlices and wait until none is listed."""
    selector = f"{SLICE_LABEL}={driver.split('.')[0]}"
    patiently(lambda: custom.delete_collection_cluster_custom_object(*RESOURCE, "resourceslices",
                                                                     label_selector=selector), "delete slices")
    deadline = time.monotonic() + timeout_s
    while patiently(lambda: custom.list_cluster_custom_object(*RESOURCE, "resourceslices", label_selector=selector,
                                                              limit=1)["items"], "list slices"):  # fmt: skip
        if time.monotonic() > deadline:
            raise SystemExit(f"{driver}'s ResourceSlices not gone after {timeout_s:.0f} s")
        time.sleep(1.0)


def create_templates(custom: Any) -> None:
    """The ResourceClaimTemplates of the two DRA kinds, in their namespaces."""
    requests = {
        "dra-one": {"deviceClassName": ONE_CLASS, "allocationMode": "ExactCount", "count": 1},
        "dra-shared": {"deviceClassName": SHARED_CLASS, "allocationMode": "ExactCount", "count": 1,
                       "capacity": {"requests": {"cores": "10", "memory": "1Gi"}}},
        **ours_dra.REQUESTS,
    }  # fmt: skip
    for kind, exactly in requests.items():
        custom.create_namespaced_custom_object(*RESOURCE, namespace_of(kind), "resourceclaimtemplates", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "gpu"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}})  # fmt: skip


def pod_body(name: str, kind: str) -> dict[str, Any]:
    """A pod of one container asking for 100m CPU and 64Mi, and for a GPU as `kind` does."""
    meta: dict[str, Any] = {"name": name}
    container: dict[str, Any] = {"name": "main", "image": "registry.k8s.io/pause:3.10",
                                 "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}  # fmt: skip
    spec: dict[str, Any] = {"containers": [container]}
    if kind == "ours-slice":
        request = f"gpu-core=10,gpu-memory=1Gi,class={SLICE_CLASS}"
        meta["annotations"] = {names.inline_request_annotation("main"): request}
    elif kind == "ours-whole":
        meta["annotations"] = {names.inline_request_annotation("main"): f"gpu=1,class={WHOLE_CLASS}"}
    elif kind == "claim-floor":
        spec["schedulingGates"] = [{"name": claim_floor.GATE}]  # the floor lifts it (no webhook)
        meta["labels"] = {names.LABEL_USES_CLAIMS: "true"}  # what the floor (and our controller) watches
    elif kind.startswith("dra-"):
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "gpu"}]
        container["resources"]["claims"] = [{"name": "gpu"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def scheduled_watch(core: Any, namespace: str) -> FirstSeen:
    """When each pod of the namespace was first seen with spec.nodeName."""
    return FirstSeen(core.list_namespaced_pod, lambda o: bool((o.get("spec") or {}).get("nodeName")),
                     namespace=namespace)  # fmt: skip


_LABELS = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


class ApiServer:
    """The API server's own endpoints over HTTPS with the admin's certificate: /metrics, pprof."""

    def __init__(self, server: str, context: ssl.SSLContext) -> None:
        self.server, self.context = server, context

    def get(self, path: str, timeout_s: float = 30) -> bytes:
        with urllib.request.urlopen(f"{self.server}{path}", timeout=timeout_s, context=self.context) as answer:
            return bytes(answer.read())

    def writes(self) -> Counter[str]:
        """apiserver_request_total of the write verbs, summed over codes and versions, keyed
        `resource[/subresource] VERB` (the group left out: no two kinds here share a plural)."""
        return self.requests(WRITE_VERBS)

    def lists(self) -> Counter[str]:
        """apiserver_request_total of LISTs, keyed as `writes` (`gpus list`): a LIST of 40,000 GPU
        objects costs the API server seconds, and one inside a run's CPU window shows there."""
        return self.requests({"LIST": "list"})

    def requests(self, verbs: dict[str, str]) -> Counter[str]:
        """apiserver_request_total of `verbs` (the metric's verb -> the tables' word), keyed as `writes`."""
        out: Counter[str] = Counter()
        for line in self.get("/metrics").decode().splitlines():
            if not line.startswith("apiserver_request_total{"):
                continue
            labels_text, _, value = line.rpartition("} ")
            labels = dict(_LABELS.findall(labels_text))
            if labels.get("verb") not in verbs:
                continue
            what = labels.get("resource", "?") + (f"/{labels['subresource']}" if labels.get("subresource") else "")
            out[f"{what} {verbs[labels['verb']]}"] += int(float(value))
        return out


class Profiler:
    """The API server's CPU profile in back-to-back windows until stopped (pprof cannot stop early)."""

    def __init__(self, api: ApiServer, folder: Path) -> None:
        self.api, self.folder = api, folder
        folder.mkdir(parents=True, exist_ok=True)
        self.files: list[Path] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            data = self.api.get(f"/debug/pprof/profile?seconds={PROFILE_WINDOW_S}", timeout_s=PROFILE_WINDOW_S + 60)
            path = self.folder / f"cpu-{len(self.files):03d}.pb.gz"
            path.write_bytes(data)
            self.files.append(path)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Run:
    kind: str
    label: str
    pods: int
    complete: bool = False
    scheduled: int = 0
    ready_claims: int = 0
    create_per_s: float = 0.0
    scheduled_per_s: float = 0.0
    wall_s: float = 0.0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    cpu_s: dict[str, float] = field(default_factory=dict)
    """Net CPU seconds per component from the first create to the last pod scheduled: `cpu_raw_s`
    less what the component used at idle (`idle_cpu_per_s`, measured just before) over as long."""
    cpu_raw_s: dict[str, float] = field(default_factory=dict)
    idle_cpu_per_s: dict[str, float] = field(default_factory=dict)
    cpu_window_s: float = 0.0
    writes: dict[str, int] = field(default_factory=dict)
    lists: dict[str, int] = field(default_factory=dict)
    """LISTs the API server answered in the CPU window, by resource."""
    load: float = 0.0
    nodes: int = 0

    def cpu_ms_per_pod(self, component: str) -> float:
        return 1000 * self.cpu_s.get(component, 0.0) / self.pods

    def writes_per_pod(self) -> float:
        return sum(v for k, v in self.writes.items() if not k.startswith("leases")) / self.pods


class Bench:
    """One control plane with its nodes, drivers, controller and webhook; runs kinds on it."""

    def __init__(self, core: Any, custom: Any, api: ApiServer, cpu: Callable[[], dict[str, float]],
                 children: list[Any], nodes: list[str], idle_s: float, publish: Callable[[str], None],
                 our_driver: ours_dra.OurDriver | None = None) -> None:  # fmt: skip
        self.core, self.custom, self.api, self.cpu, self.children = core, custom, api, cpu, children
        self.nodes, self.idle_s, self.our_driver = nodes, idle_s, our_driver
        self.publish = publish
        """Publishes one made-up driver's ResourceSlices, one per node."""

    def quiet(self, component: str, *, below: float = 0.1, window_s: float = 5.0, timeout_s: float = 420.0) -> float:
        """Wait until `component` uses less than `below` of a core over `window_s` and the writes have
        stopped; the seconds it took. Our controller digests every GPU object after set-up (40,000 at
        5,000 nodes): a run started meanwhile had 144 ms/s of its CPU in the idle window (at 2,000 nodes)."""
        began = time.monotonic()
        while time.monotonic() - began < timeout_s:
            self._alive()
            before, t = self.cpu(), time.monotonic()
            time.sleep(window_s)
            rate = (self.cpu()[component] - before[component]) / (time.monotonic() - t)
            if rate < below:
                self.settle()
                return time.monotonic() - began
        print(f"  ({component} still busy after {timeout_s:.0f} s; running anyway)", flush=True)
        return time.monotonic() - began

    def settle(self, quiet_s: float = 3.0, timeout_s: float = 120.0) -> None:
        """Wait until the API server's writes (but the time-bound Leases) have stopped for `quiet_s`."""
        deadline, last, since = time.monotonic() + timeout_s, None, time.monotonic()
        while time.monotonic() < deadline:
            current = {k: v for k, v in self.api.writes().items() if not k.startswith("leases")}
            if current != last:
                last, since = current, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                return
            time.sleep(1.0)
        print(f"  (writes still going after {timeout_s:.0f} s; measuring anyway)", flush=True)

    def idle_rates(self) -> dict[str, float]:
        """CPU seconds per second of each component with no pods coming: leases, resyncs, probes."""
        before, t = self.cpu(), time.monotonic()
        time.sleep(self.idle_s)
        after, elapsed = self.cpu(), time.monotonic() - t
        return {k: (after[k] - before.get(k, 0.0)) / elapsed for k in after}

    def _alive(self) -> None:
        for child in self.children:
            if child.process.poll() is not None:
                raise SystemExit(f"{child.name} exited ({child.process.returncode}):\n{child.tail(20)}")

    def run(self, kind: str, label: str, *, pods: int, rate: float, timeout_s: float,
            profile: Path | None = None) -> Run:  # fmt: skip
        """Create `pods` pods of `kind` (a burst when `rate` is 0), wait until every one is
        scheduled and the writes stop, then check its claims and clean the namespace."""
        namespace = namespace_of(kind)
        result = Run(kind, label, pods, nodes=len(self.nodes))
        driver = DRIVER_OF.get(kind)
        if driver:
            t = time.monotonic()
            self.publish(driver)
            print(f"  {len(self.nodes)} ResourceSlices of {driver} in {time.monotonic() - t:.0f} s", flush=True)
        ours = kind in ours_dra.KINDS
        if kind in ours_dra.NEEDS_OWNER and self.our_driver is not None:
            with ThreadPoolExecutor(THREADS) as pool:
                self.our_driver.hand_to(ours_dra.NEEDS_OWNER[kind], pool)
                if ours:
                    t = time.monotonic()
                    wrote = self.our_driver.publish(pool)
                    print(f"  {wrote} ResourceSlices of {ours_dra.dra_names.DRIVER_NAME} (the agent's publisher) in "
                          f"{time.monotonic() - t:.0f} s", flush=True)  # fmt: skip
            # An owner move's tail (the controller's OwnerMoved Events, status writes) must not fall in the
            # idle window: seen at 100 nodes, the API server's idle rate 4x the usual (and net CPU too low).
            self.settle()
        # The idle window also lets the scheduler's informers and the writes before it settle.
        result.idle_cpu_per_s = self.idle_rates()
        scheduled = scheduled_watch(self.core, namespace)
        scheduled.start()
        time.sleep(1.0)  # the watch is open
        pod_names = [f"p{i:05d}" for i in range(pods)]
        created: dict[str, float] = {}
        profiler = Profiler(self.api, profile) if profile else None
        writes_before, lists_before, cpu_before = self.api.writes(), self.api.lists(), self.cpu()
        if profiler:
            profiler.start()
        start = time.monotonic()

        def create(index: int) -> None:
            if rate > 0:
                delay = start + index / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            self.core.create_namespaced_pod(namespace, pod_body(pod_names[index], kind))
            created[pod_names[index]] = time.monotonic()

        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(create, range(pods)))
        result.create_per_s = pods / (time.monotonic() - start)
        deadline = time.monotonic() + timeout_s
        while not (complete := scheduled.wait(pod_names, 1.0)) and time.monotonic() < deadline:
            self._alive()
        # CPU to the last pod scheduled: what comes after (Events, a claim's status) is not on the
        # pod's path, and a window that waits for it takes in background work too.
        cpu_after, window_s = self.cpu(), time.monotonic() - start
        lists_after = self.api.lists()
        result.lists = {k.removesuffix(" list"): v - lists_before.get(k, 0) for k, v in lists_after.items()
                        if v - lists_before.get(k, 0) > 0}  # fmt: skip
        # The work a pod causes goes on after it is scheduled (the scheduler's and our Events, a
        # claim's status): the window closes once the writes (but the time-bound Leases) stop.
        writes_after, last = self.api.writes(), None
        settle_deadline = time.monotonic() + 15
        while time.monotonic() < settle_deadline:
            current = {k: v for k, v in writes_after.items() if not k.startswith("leases")}
            if current == last:
                break
            last = current
            time.sleep(1.0)
            writes_after = self.api.writes()
        if profiler:
            profiler.stop()
        scheduled.stop()
        result.complete = complete
        result.load = os.getloadavg()[0]
        result.cpu_window_s = window_s
        result.cpu_raw_s = {k: cpu_after[k] - cpu_before.get(k, 0.0) for k in cpu_after}
        result.cpu_s = {k: v - result.idle_cpu_per_s.get(k, 0.0) * window_s for k, v in result.cpu_raw_s.items()}
        result.writes = {k: v - writes_before.get(k, 0) for k, v in writes_after.items()
                         if v - writes_before.get(k, 0) > 0}  # fmt: skip
        seen = [n for n in pod_names if n in scheduled.seen]
        result.scheduled = len(seen)
        last_seen = max((scheduled.seen[n] for n in seen), default=float("nan"))
        result.scheduled_per_s = len(seen) / (last_seen - start) if seen else 0.0
        result.wall_s = last_seen - start
        result.p50_ms, result.p99_ms = _percentiles([(scheduled.seen[n] - created[n]) * 1000 for n in seen])
        if not complete:  # why: the scheduler's word on one pod left
            left = next(n for n in pod_names if n not in scheduled.seen)
            pod = self.core.read_namespaced_pod(left, namespace)
            print(f"  pod {namespace}/{left}: nodeName={pod.spec.node_name} gates={pod.spec.scheduling_gates} "
                  f"conditions={[(c.type, c.status, c.message) for c in pod.status.conditions or []]}", flush=True)
        result.ready_claims = self.ready_claims(kind)
        self.clean(kind)
        if driver:
            withdraw_slices(self.custom, driver)
        if ours and self.our_driver is not None:
            with ThreadPoolExecutor(THREADS) as pool:
                self.our_driver.withdraw(pool)
        return result

    def ready_claims(self, kind: str) -> int:
        """Claims of the run that are Bound (ours) or allocated and reserved for their pod (DRA)."""
        namespace = namespace_of(kind)
        if kind in CLAIMS_OF_OURS:
            items = self.custom.list_namespaced_custom_object(names.GROUP, names.VERSION, namespace,
                                                              names.PLURAL_CLAIM)["items"]  # fmt: skip
            return sum(1 for c in items if (c.get("status") or {}).get("phase") == "Bound")
        if kind.startswith("dra-"):
            # allocated from the kind's own driver, reserved for its pod; an exclusive kind's claims hold
            # distinct devices (a whole card of our driver is a shareable device whose default takes it all)
            driver = DRIVER_OF.get(kind) or ours_dra.dra_names.DRIVER_NAME
            items = self.custom.list_namespaced_custom_object(*RESOURCE, namespace, "resourceclaims")["items"]
            held: list[tuple[str, str]] = []
            for c in items:
                status = c.get("status") or {}
                results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
                if status.get("reservedFor") and results and all(r.get("driver") == driver for r in results):
                    held += [(r.get("pool"), r.get("device")) for r in results]
            if kind in ("dra-one", "dra-ours") and len(set(held)) != len(held):
                print(f"  {len(held) - len(set(held))} devices of {kind} allocated twice", flush=True)
                return len(set(held))
            return len(held)
        return 0

    def strip_floor_finalizers(self, namespace: str) -> None:
        """Take the claim floor's finalizer off its claims (nobody else would)."""
        items = self.custom.list_namespaced_custom_object(names.GROUP, names.VERSION, namespace,
                                                          names.PLURAL_CLAIM)["items"]  # fmt: skip
        for claim in items:
            kept = [f for f in claim["metadata"].get("finalizers") or [] if f != claim_floor.FINALIZER]
            if kept != (claim["metadata"].get("finalizers") or []):
                self.custom.patch_namespaced_custom_object(names.GROUP, names.VERSION, namespace, names.PLURAL_CLAIM,
                    claim["metadata"]["name"], {"metadata": {"finalizers": kept or None}})  # fmt: skip

    def clean(self, kind: str, timeout_s: float = 600) -> None:
        """Delete the namespace's pods (grace 0: no kubelet confirms) and claims; wait until they
        and our ElasticGPUs of the namespace are gone, so that the next run starts on free cards."""
        namespace = namespace_of(kind)
        patiently(lambda: self.core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0), "delete pods")
        claims = ((names.GROUP, names.VERSION, names.PLURAL_CLAIM) if kind in CLAIMS_OF_OURS
                  else (*RESOURCE, "resourceclaims") if kind.startswith("dra-") else None)  # fmt: skip
        if claims:
            patiently(lambda: self.custom.delete_collection_namespaced_custom_object(*claims[:2], namespace, claims[2]),
                      "delete claims")  # fmt: skip

        def gone() -> bool:
            if kind == "claim-floor":
                self.strip_floor_finalizers(namespace)
            if self.core.list_namespaced_pod(namespace, limit=1).items:
                return False
            if claims and self.custom.list_namespaced_custom_object(claims[0], claims[1], namespace, claims[2],
                                                                    limit=1)["items"]:  # fmt: skip
                return False
            if kind.startswith("ours-"):
                egpus = self.custom.list_cluster_custom_object(names.GROUP, names.VERSION,
                                                               names.PLURAL_ELASTIC_GPU)["items"]  # fmt: skip
                return not any(((e.get("spec") or {}).get("claimRef") or {}).get("namespace") == namespace
                               for e in egpus)  # fmt: skip
            return True

        deadline = time.monotonic() + timeout_s
        while not patiently(gone, f"{namespace} clean"):
            self._alive()
            if time.monotonic() > deadline:
                raise SystemExit(f"{namespace} not clean after {timeout_s:.0f} s")
            time.sleep(1.0)
        time.sleep(2.0)  # the release's last writes (GPU status) settle before the next run


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def report(runs: list[Run], title: str) -> str:
    """The per-run table, the per-kind means, and the writes per pod by resource."""
    lines = [title, "", "| run | pods/s | created->scheduled p50 / p99 ms | claims ready | API server | controller "
             "manager | scheduler | our controller | our webhook | etcd | claim floor | bench | writes/pod | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in runs:
        flag = "" if r.complete else f" ({r.pods - r.scheduled} not scheduled)"
        cpu = " | ".join(f"{r.cpu_ms_per_pod(c):.1f}" for c in COMPONENTS)
        lines.append(f"| {r.label} | {r.scheduled_per_s:.1f}{flag} | {r.p50_ms:.0f} / {r.p99_ms:.0f} | "
                     f"{r.ready_claims if r.kind != 'plain' else '-'} | {cpu} | {r.writes_per_pod():.2f} | "
                     f"{r.load:.1f} |")  # fmt: skip
    lines.append("\n(CPU in ms per pod, from the first create to the last pod scheduled, less the idle rate just "
                 "before the run over as long; writes per pod without leases, until they settle.)")
    lines += ["", "Idle before each run (CPU ms per s: leases, resyncs, the bench's probes) and the CPU window:", "",
              "| run | window s | " + " | ".join(COMPONENTS) + " | LISTs in the window |",
              "|---|---|" + "---|" * len(COMPONENTS) + "---|"]  # fmt: skip
    for r in runs:
        idle = " | ".join(f"{1000 * r.idle_cpu_per_s.get(c, 0.0):.1f}" for c in COMPONENTS)
        listed = ", ".join(f"{k} {v}" for k, v in sorted(r.lists.items())) or "-"
        lines.append(f"| {r.label} | {r.cpu_window_s:.1f} | {idle} | {listed} |")
    kinds = list(dict.fromkeys(r.kind for r in runs if not r.label.endswith("(profiled)")))
    if not kinds:
        return "\n".join(lines)
    by_kind = {k: [r for r in runs if r.kind == k and not r.label.endswith("(profiled)")] for k in kinds}
    lines += ["", "Means over the rounds:", "",
              "| kind | runs | pods/s | p50 / p99 ms | API server ms/pod | controller manager | scheduler "
              "| our controller | our webhook | etcd | claim floor | writes/pod |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for kind, rs in by_kind.items():
        cpu = " | ".join(f"{_mean([r.cpu_ms_per_pod(c) for r in rs]):.1f}" for c in COMPONENTS[:-1])
        lines.append(f"| {kind} | {len(rs)} | {_mean([r.scheduled_per_s for r in rs]):.1f} | "
                     f"{_mean([r.p50_ms for r in rs]):.0f} / {_mean([r.p99_ms for r in rs]):.0f} | {cpu} | "
                     f"{_mean([r.writes_per_pod() for r in rs]):.2f} |")  # fmt: skip
    keys = sorted({k for rs in by_kind.values() for r in rs for k in r.writes})
    lines += ["", "Writes per pod by resource and verb (apiserver_request_total; leases are time-bound):", "",
              "| resource verb | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]  # fmt: skip
    for key in keys:
        cells = [f"{_mean([r.writes.get(key, 0) / r.pods for r in by_kind[k]]):.2f}" for k in kinds]
        if all(c == "0.00" for c in cells):  # a write or two in a run (a token, a lease): not per pod
            continue
        lines.append(f"| {key} | " + " | ".join("-" if c == "0.00" else c for c in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--pods", type=int, default=800, help="pods per run")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"kinds to run (default {','.join(KINDS)})")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of every kind, rotated each round (0: none)")
    parser.add_argument("--limits", choices=("stock", "raised"), default="stock",
                        help="client limits of the controller manager and scheduler (raised: qps 500, burst 1000)")
    parser.add_argument("--kube-api-qps", type=float, help="the controller manager's and scheduler's QPS (overrides)")
    parser.add_argument("--kube-api-burst", type=int, help="their burst (overrides --limits)")
    parser.add_argument("--profile", default="", help="kinds to run once more with the API server profiled")
    parser.add_argument("--out", type=Path, help="folder for profiles and results (default bench/out/real-scheduler-*)")
    parser.add_argument("--rate", type=float, default=0.0, help="pods created per second; 0: a burst (default)")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="per run, for every pod to be scheduled")
    parser.add_argument("--idle-s", type=float, default=2 * LEASE_RENEW_S,
                        help="idle window before each run whose CPU rate is subtracted (default %(default)g s)")
    parser.add_argument("--lease-renew-s", type=float, default=0.0,
                        help="nodes' Lease renewal period (kubelet: 10 s); 0 (default): no Leases, node grace 24 h")
    parser.add_argument("--writers", type=int, default=4,
                        help="processes that write the nodes, GPU objects and ResourceSlices (default %(default)s)")
    parser.add_argument("--writer-threads", type=int, default=8, help="threads per writer (default %(default)s)")
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    profiled = [k for k in args.profile.split(",") if k]
    for kind in {*kinds, *profiled} - set(KINDS):
        parser.error(f"unknown kind {kind!r} (kinds: {', '.join(KINDS)})")
    whole = [k for k in {*kinds, *profiled} if k in ("ours-whole", "dra-one", "dra-ours")]
    if whole and args.pods > args.nodes * CARDS_PER_NODE:
        parser.error(f"{whole} need a card per pod: at most {args.nodes * CARDS_PER_NODE} pods on {args.nodes} nodes")
    qps, burst = RAISED if args.limits == "raised" else (None, None)
    qps, burst = args.kube_api_qps or qps, args.kube_api_burst or burst
    limit_flags = [*([f"--kube-api-qps={qps:g}"] if qps else []), *([f"--kube-api-burst={burst}"] if burst else [])]
    limits = " ".join(limit_flags) or "stock (controller manager 20/30, scheduler 50/100)"
    renew_s = args.lease_renew_s
    cards = args.nodes * CARDS_PER_NODE if {*ours_dra.NEEDS_OWNER} & {*kinds, *profiled} else 0
    # Generous: the node lifecycle is not what is measured, and a loaded machine delays renewals (at
    # load 35, 500 nodes' renewals every 10 s fell behind the stock 50 s and every node was tainted).
    grace_s = max(NODE_GRACE_RENEWALS * renew_s, NODE_GRACE_MIN_S) if renew_s > 0 else NODE_GRACE_NO_LEASES_S
    grace = [f"--node-monitor-grace-period={grace_s:.0f}s"]
    leases = f"leases renewed every {renew_s:g} s" if renew_s > 0 else "no node Leases"
    out = args.out or REPO / "bench" / "out" / f"real-scheduler-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)

    from kubernetes import client, config

    from elasticgpu.crd_installer import apply_crds
    from elasticgpu.testbed import components, processes, real_cluster

    began = time.monotonic()
    runs: list[Run] = []
    log_dir = Path(tempfile.mkdtemp(prefix="egk8s-bench-"))
    # One of each: a lost leader lease (renewals miss their 10 s deadline on a loaded machine) would
    # end the scheduler mid-run.
    alone = ["--leader-elect=false"]
    extra = {"kube-controller-manager": [*limit_flags, *grace, *alone], "kube-scheduler": [*limit_flags, *alone]}
    with real_cluster.running_control_plane(verbosity="0", extra_args=extra) as plane:
        print(f"control plane up in {time.monotonic() - began:.0f} s ({plane.server}); limits: {limits}", flush=True)
        for _ in apply_crds(kubeconfig=str(plane.kubeconfig)):
            pass
        api = config.new_client_from_config(config_file=str(plane.kubeconfig))
        api.configuration.connection_pool_maxsize = THREADS * 2
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        nodes = Nodes(client.CoordinationV1Api(api), args.nodes, renew_s)
        kubeconfig, fan = str(plane.kubeconfig), {"writers": args.writers, "threads": args.writer_threads}
        children = processes.Children()
        try:
            took = nodes.create(kubeconfig, **fan)
            if cards:  # 2 writes per card: at 5,000 nodes, 80,000 writes that only ours needs
                took += setup.write(kubeconfig, ("gpus",), list(range(args.nodes)), **fan)
            create_device_classes(custom)
            ours_dra.create_device_classes(custom)
            # a node (its status in the create), its Lease when renewed; a card's object and its status
            setup_writes = (2 if renew_s > 0 else 1) * args.nodes + 2 * cards
            print(f"{args.nodes} nodes, {cards} GPU objects written in {took:.0f} s ({setup_writes / took:.0f} "
                  f"writes/s, {args.writers} writers x {args.writer_threads} threads); {leases} "
                  f"{' '.join(grace)}", flush=True)  # fmt: skip
            for klass, provisioner in ((SLICE_CLASS, names.PROVISIONER_GPUSHARE),
                                       (WHOLE_CLASS, names.PROVISIONER_PHYSICAL)):  # fmt: skip
                custom.create_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL_CLASS, {
                    "apiVersion": names.API_VERSION, "kind": names.KIND_CLASS, "metadata": {"name": klass},
                    "provisioner": provisioner, "bindingMode": "Immediate",
                    "parameters": {"gpuModel": MODEL}})  # fmt: skip
            # The claim floor's class belongs to someone else: our controller leaves its claims alone.
            custom.create_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL_CLASS, {
                "apiVersion": names.API_VERSION, "kind": names.KIND_CLASS, "metadata": {"name": claim_floor.CLASS},
                "provisioner": "bench.example.com/claim-floor", "bindingMode": "Immediate"})  # fmt: skip
            for namespace in map(namespace_of, KINDS):
                core.create_namespace({"metadata": {"name": namespace}})
                processes.wait_until(lambda ns=namespace: core.read_namespaced_service_account("default", ns),
                                     f"the default ServiceAccount of {namespace}", timeout_s=60)  # fmt: skip
            create_templates(custom)
            # Nobody beats for the simulated cards (the reports of running claims must outlive the grace).
            # The controller watches every namespace (ours-whole and ours-slice have one each), with
            # its default resync; it watches only pods labelled as using claims.
            controller = children.start("controller", [
                sys.executable, "-m", "elasticgpu", "controller", "--kubeconfig", str(plane.kubeconfig),
                "--leader-elect=false", "--health-probe-bind-address", "0"], log=log_dir / "controller.log", cwd=REPO,
                env={"ELASTICGPU_HEARTBEAT_GRACE_S": "86400",
                     "ELASTICGPU_RUNNING_CLAIMS_EXPIRE_S": "86400"})  # fmt: skip
            webhook, _ = components.start_webhook(children, kubeconfig=plane.kubeconfig, namespace="default",
                                                  configuration="elasticgpu-bench", log_dir=log_dir)  # fmt: skip

            floor = children.start("claim-floor", [
                sys.executable, str(REPO / "bench" / "claim_floor.py"), "--kubeconfig", str(plane.kubeconfig),
                "--namespace", namespace_of("claim-floor"), "--nodes", ",".join(nodes.names)],
                log=log_dir / "claim-floor.log", cwd=REPO)  # fmt: skip

            def gated() -> bool:
                probe = core.create_namespaced_pod(namespace_of("ours-slice"), pod_body("probe", "ours-slice"),
                                                   dry_run="All")  # fmt: skip
                return any(g.name == names.SCHEDULING_GATE for g in probe.spec.scheduling_gates or [])

            processes.wait_until(gated, "the webhook to gate pods that use claims", timeout_s=120,
                                 children=[controller, webhook], interval_s=0.5)  # fmt: skip
            pids = {c.name: c.process.pid for c in [*plane.children.started, controller, webhook, floor]}

            def cpu() -> dict[str, float]:
                return {**{name: _cpu_s(pid) for name, pid in pids.items()}, "bench": time.process_time()}

            bench = Bench(core, custom, ApiServer(plane.server, plane.ssl_context()), cpu,
                          [*plane.children.started, controller, webhook, floor], nodes.names, args.idle_s,
                          lambda driver: publish_slices(kubeconfig, driver, nodes.names, **fan),
                          ours_dra.OurDriver(api, custom, nodes.names) if cards else None)  # fmt: skip
            if cards:
                print(f"our controller quiet after {bench.quiet('controller'):.0f} s (it digests every GPU object)",
                      flush=True)  # fmt: skip
            how = f"{args.rate:g}/s" if args.rate > 0 else "burst"
            plan = [(kinds[(i + r) % len(kinds)], r, None) for r in range(args.repeat) for i in range(len(kinds))]
            plan += [(k, -1, out / f"profile-{k}") for k in profiled]
            for kind, round_, folder in plan:
                label = f"{kind} #{round_ + 1}" if folder is None else f"{kind} (profiled)"
                print(f"{label}: {args.pods} pods ({how}) ...", flush=True)
                r = bench.run(kind, label, pods=args.pods, rate=args.rate, timeout_s=args.timeout_s, profile=folder)
                runs.append(r)
                (out / "runs.json").write_text(json.dumps([r.__dict__ for r in runs], indent=1))  # kept if cut off
                print(f"  {r.scheduled_per_s:.1f} pods/s, API server {r.cpu_ms_per_pod('kube-apiserver'):.1f} ms/pod, "
                      f"{r.writes_per_pod():.2f} writes/pod, claims ready {r.ready_claims}, load {r.load:.1f}",
                      flush=True)  # fmt: skip
        finally:
            nodes.stop()
            children.stop_all()
            api.close()

    title = (f"real kube-scheduler (v1.36.3), {args.nodes} simulated nodes x {CARDS_PER_NODE} cards, {args.pods} pods "
             f"per run, {'created at ' + how if args.rate > 0 else 'created in a burst by 16 threads'}, "
             f"{os.cpu_count()} CPUs; limits: {limits}; {leases}; CPU to the last pod "
             f"scheduled less {args.idle_s:g} s idle's rate; "
             f"load average at the end {os.getloadavg()[0]:.1f}")  # fmt: skip
    text = report(runs, title)
    profiles = {r.kind: out / f"profile-{r.kind}" for r in runs if r.label.endswith("(profiled)")}
    if profiles:
        loaded = {kind: pprof_buckets.load(str(folder)) for kind, folder in profiles.items()}
        text += ("\n\nkube-apiserver CPU by bucket (bench/pprof_buckets.py; profiled runs only):\n\n"
                 + pprof_buckets.table(loaded, args.pods))  # fmt: skip
        go = shutil.which("go")
        for folder in profiles.values():
            if go:
                files = sorted(map(str, folder.glob("*.pb.gz")))
                top = subprocess.run([go, "tool", "pprof", "-top", "-nodecount=60", *files],
                                     capture_output=True, text=True, timeout=300)  # fmt: skip
                (folder / "top.txt").write_text(top.stdout + top.stderr)
        text += f"\n\nprofiles (and `go tool pprof -top` in top.txt): {', '.join(map(str, profiles.values()))}"
    print("\n" + text)
    (out / "report.md").write_text(text + "\n")
    (out / "runs.json").write_text(json.dumps([r.__dict__ for r in runs], indent=1))
    print(f"\nreport and runs in {out}; logs of the controller and webhook: {log_dir}")
    ready = all(r.ready_claims == r.pods for r in runs if r.kind != "plain")
    return 0 if ready and all(r.complete for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
