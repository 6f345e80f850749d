"""Pods that use claims on Kubernetes' own scheduler, against the scheduler's own ceiling.

Starts the real control plane (elasticgpu/demo/real_cluster.py: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler; `bash testcluster/build.sh` builds the binary), installs
the CRDs and writes, as kubelet and the node agent would:

  * N Node objects with allocatable (64 CPU, 256Gi, 110 pods) and a Ready condition, and their
    Leases in kube-node-lease renewed every 10 s (so the node lifecycle controller keeps them Ready
    and untainted; no kubelet runs, no runtime);
  * 8 GPU objects per node, spec and status built by the agent's own code (`gpu_spec`,
    `desired_status`: Healthy, a heartbeat); the controller runs with a heartbeat grace of 1 h, as
    nobody beats after that;

then runs the controller and the admission webhook as the demo does (`elasticgpu controller`,
`elasticgpu webhook` as processes, one namespace), and two runs of P pods each, in one invocation:

  claims   pods with one inline slice (`elasticgpu.io/request.main: gpu-core=10,gpu-memory=1Gi,...`):
           the webhook gates them, the controller makes and binds each pod's claim and lifts the
           gate (with the claim's node as affinity), the scheduler places them;
  plain    the same pods without the annotation, in their own namespace (the webhook's
           matchConditions keep them from it; the controller does not watch there): the scheduler's
           own ceiling on this machine in the same run.

Pods are created by 16 threads as fast as the API server takes them (`--rate 0`, a burst) or at
`--rate` per second. Measured (monotonic clock of this process; "created" is the return of the
create call, "scheduled"/"Bound" the first watch event showing `spec.nodeName` / phase Bound):
pods scheduled per second and claims bound per second (P / (last seen - first create)),
created -> scheduled and created -> Bound p50/p99, and the CPU seconds each component used during
the run (/proc/<pid>/stat). No kubelet runs, so no pod reaches Running: everything is measured to
scheduled.

    python bench/real_scheduler.py                              # 500 nodes x 8 cards, 5,000 pods per run
    python bench/real_scheduler.py --nodes 100 --pods 1000      # the smaller size
    python bench/real_scheduler.py --nodes 5 --pods 20          # smoke (tests/realcluster/test_real_scheduler_bench.py)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from first_seen import SeenClock  # noqa: E402

from elasticgpu.api import names, pod_claims  # noqa: E402

CARDS_PER_NODE = 8
MODEL = "NVIDIA BENCH-80GB"
CARD_MIB = 81920
REQUEST = "gpu-core=10,gpu-memory=1Gi"
CLASS = "bench-real"
CLAIMS_NS, PLAIN_NS = "bench-claims", "bench-plain"
LEASE_RENEW_S = 10.0
THREADS = 16


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _percentiles(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    ordered = sorted(values)
    return statistics.median(ordered), ordered[int(0.99 * (len(ordered) - 1))]


def _cpu_s(pid: int) -> float:
    """utime + stime of a process (and its waited-for children), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _self_cpu_s() -> float:
    return time.process_time()


class Nodes:
    """The simulated nodes: Node objects with allocatable and Ready, their Leases kept renewed."""

    def __init__(self, core: Any, coordination: Any, count: int) -> None:
        self.core, self.coordination = core, coordination
        self.names = [f"bench-node-{i:04d}" for i in range(count)]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, daemon=True)

    def create(self, pool: ThreadPoolExecutor) -> None:
        allocatable = {"cpu": "64", "memory": "256Gi", "pods": "110"}

        def one(node: str) -> None:
            self.core.create_node({"metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}})
            self.core.patch_node_status(node, {"status": {
                "allocatable": allocatable, "capacity": allocatable,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "message": "bench: simulated node", "lastHeartbeatTime": _now(),
                                "lastTransitionTime": _now()}]}})  # fmt: skip
            self.coordination.create_namespaced_lease("kube-node-lease", {
                "metadata": {"name": node},
                "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": _now()}})  # fmt: skip

        list(pool.map(one, self.names))
        self._thread.start()

    def _renew(self) -> None:
        # kubelet renews every 10 s; the node lifecycle controller marks a node Unknown (and taints
        # it unreachable) after its grace period (50 s) without a renewal. 16 threads: with 4, a
        # round of 500 renewals took longer than the grace under the claims burst (a node got
        # tainted, the pods of its claims stayed Pending).
        with ThreadPoolExecutor(THREADS) as pool:
            while not self._stop.wait(LEASE_RENEW_S):
                list(pool.map(lambda n: self.coordination.patch_namespaced_lease(
                    n, "kube-node-lease", {"spec": {"renewTime": _now()}}), self.names))

    def stop(self) -> None:
        self._stop.set()


def create_gpus(custom: Any, nodes: list[str], pool: ThreadPoolExecutor) -> None:
    """8 GPU objects per node, as the agent publishes them (its own spec and status builders)."""
    from elasticgpu.agent.discovery import Card
    from elasticgpu.agent.health import CardHealth
    from elasticgpu.agent.inventory import desired_status, gpu_spec

    def one(item: tuple[int, str]) -> None:
        n, node = item
        for index in range(CARDS_PER_NODE):
            uuid = f"GPU-BENCH-{n:04d}-{index}"
            card = Card(index=index, uuid=uuid, model=MODEL, memory_mib=CARD_MIB, minor=index,
                        device_path=f"/dev/nvidia{index}")  # fmt: skip
            name = names.gpu_object_name(uuid)
            body = {"apiVersion": names.API_VERSION, "kind": names.KIND_GPU,
                    "metadata": {"name": name, "labels": {names.LABEL_NODE: node}}, "spec": gpu_spec(card, node)}
            custom.create_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL_GPU, body)
            health = CardHealth(healthy=True, reason="NoFatalXid", message="bench: simulated card")
            status = desired_status({}, card=card, health=health, usage=None,
                                    node_name=node, now=time.time())  # fmt: skip
            custom.patch_cluster_custom_object_status(names.GROUP, names.VERSION, names.PLURAL_GPU, name,
                                                      {"status": status})  # fmt: skip

    list(pool.map(one, enumerate(nodes)))


def pod_body(name: str, *, claims: bool) -> dict[str, Any]:
    """A pod of one container; with `claims`, one inline slice (the webhook gates it)."""
    meta: dict[str, Any] = {"name": name}
    if claims:
        meta["annotations"] = {names.inline_request_annotation("main"): f"{REQUEST},class={CLASS}"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}}  # fmt: skip


class FirstSeen(SeenClock):
    """When each object of a list was first seen meeting `condition`, through a watch of the kubernetes
    client (`list_call(**kwargs)` is the list function; raw objects, no deserialisation)."""

    def __init__(self, list_call: Callable[..., Any], condition: Callable[[dict[str, Any]], bool],
                 **kwargs: Any) -> None:  # fmt: skip
        self.list_call, self.condition, self.kwargs = list_call, condition, kwargs
        super().__init__()
        self._version = self.list_call(**kwargs, _preload_content=False)
        self._version = json.loads(self._version.data)["metadata"]["resourceVersion"]

    def _run(self) -> None:
        from kubernetes import watch

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
            except Exception as err:  # reopened from the last version seen; the bench must not die of one drop
                print(f"  (watch re-opened: {err})", file=sys.stderr)
                time.sleep(0.05)


def scheduled_watch(core: Any, namespace: str) -> FirstSeen:
    """When each pod of the namespace was first seen with spec.nodeName."""
    return FirstSeen(core.list_namespaced_pod, lambda o: bool((o.get("spec") or {}).get("nodeName")),
                     namespace=namespace)  # fmt: skip


def bound_watch(custom: Any, namespace: str) -> FirstSeen:
    """When each claim of the namespace was first seen Bound."""
    return FirstSeen(custom.list_namespaced_custom_object, lambda o: (o.get("status") or {}).get("phase") == "Bound",
                     group=names.GROUP, version=names.VERSION, namespace=namespace, plural=names.PLURAL_CLAIM)


def run(custom: Any, core: Any, namespace: str, *, pods: int, rate: float, claims: bool, timeout_s: float,
        cpu: Callable[[], dict[str, float]], children: list[Any]) -> dict[str, Any]:  # fmt: skip
    """Create `pods` pods (a burst when `rate` is 0) and wait until every one is scheduled."""
    scheduled = scheduled_watch(core, namespace)
    bound = bound_watch(custom, namespace) if claims else None
    for watch in (scheduled, bound):
        if watch is not None:
            watch.start()
    time.sleep(1.0)  # the watches are open
    names_ = [f"p{i:05d}" for i in range(pods)]
    created: dict[str, float] = {}
    cpu_before = cpu()
    start = time.monotonic()

    def create(index: int) -> None:
        if rate > 0:
            delay = start + index / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        core.create_namespaced_pod(namespace, pod_body(names_[index], claims=claims))
        created[names_[index]] = time.monotonic()

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(create, range(pods)))
    created_s = time.monotonic() - start
    deadline = time.monotonic() + timeout_s
    while not (complete := scheduled.wait(names_, 1.0)) and time.monotonic() < deadline:
        for child in children:
            if child.process.poll() is not None:
                raise SystemExit(f"{child.name} exited ({child.process.returncode}):\n{child.tail(20)}")
    if bound is not None:
        complete = bound.wait([pod_claims.inline_claim_name(n, "main") for n in names_], 10) and complete
    cpu_after = cpu()
    if not complete:  # why: the scheduler's word on one pod left, and the first node's taints
        left = next(n for n in names_ if n not in scheduled.seen)
        pod = core.read_namespaced_pod(left, namespace)
        print(f"  pod {namespace}/{left}: nodeName={pod.spec.node_name} gates={pod.spec.scheduling_gates} "
              f"conditions={[(c.type, c.status, c.message) for c in pod.status.conditions or []]}", flush=True)
    for watch in (scheduled, bound):
        if watch is not None:
            watch.stop()
    result: dict[str, Any] = {"pods": pods, "complete": complete, "create_per_s": pods / created_s,
                              "cpu": {k: cpu_after[k] - cpu_before.get(k, 0.0) for k in cpu_after}}  # fmt: skip
    seen = [n for n in names_ if n in scheduled.seen]
    result["scheduled"] = len(seen)
    last = max((scheduled.seen[n] for n in seen), default=float("nan"))
    result["scheduled_per_s"] = len(seen) / (last - start) if seen else 0.0
    result["wall_s"] = last - start
    result["sched_p50_ms"], result["sched_p99_ms"] = _percentiles([(scheduled.seen[n] - created[n]) * 1000
                                                                  for n in seen])  # fmt: skip
    if bound is not None:
        by_claim = {pod_claims.inline_claim_name(n, "main"): n for n in names_}
        got = {by_claim[c]: t for c, t in bound.seen.items() if c in by_claim}
        result["bound"] = len(got)
        last_bound = max(got.values(), default=float("nan"))
        result["bound_per_s"] = len(got) / (last_bound - start) if got else 0.0
        result["bound_p50_ms"], result["bound_p99_ms"] = _percentiles([(t - created[n]) * 1000
                                                                      for n, t in got.items()])  # fmt: skip
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=5000, help="pods per run (claims, plain)")
    parser.add_argument("--rate", type=float, default=0.0, help="pods created per second; 0: a burst (default)")
    parser.add_argument("--runs", default="claims,plain", help="which runs, in order (default claims,plain)")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="per run, for every pod to be scheduled")
    args = parser.parse_args(argv)

    from kubernetes import client, config

    from elasticgpu.crd_installer import apply_crds
    from elasticgpu.demo import components, processes, real_cluster

    began = time.monotonic()
    results: dict[str, dict[str, Any]] = {}
    log_dir = Path(tempfile.mkdtemp(prefix="egk8s-bench-"))
    with real_cluster.running_control_plane(verbosity="0") as plane:
        print(f"control plane up in {time.monotonic() - began:.0f} s ({plane.server})", flush=True)
        for _ in apply_crds(kubeconfig=str(plane.kubeconfig)):
            pass
        api = config.new_client_from_config(config_file=str(plane.kubeconfig))
        api.configuration.connection_pool_maxsize = THREADS * 2
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        nodes = Nodes(core, client.CoordinationV1Api(api), args.nodes)
        children = processes.Children()
        try:
            t = time.monotonic()
            with ThreadPoolExecutor(THREADS) as pool:
                nodes.create(pool)
                create_gpus(custom, nodes.names, pool)
            print(f"{args.nodes} nodes, {args.nodes * CARDS_PER_NODE} GPU objects written in "
                  f"{time.monotonic() - t:.0f} s", flush=True)  # fmt: skip
            custom.create_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL_CLASS, {
                "apiVersion": names.API_VERSION, "kind": names.KIND_CLASS, "metadata": {"name": CLASS},
                "provisioner": names.PROVISIONER_GPUSHARE, "bindingMode": "Immediate",
                "parameters": {"gpuModel": MODEL}})  # fmt: skip
            for namespace in (CLAIMS_NS, PLAIN_NS):
                core.create_namespace({"metadata": {"name": namespace}})
                processes.wait_until(lambda ns=namespace: core.read_namespaced_service_account("default", ns),
                                     f"the default ServiceAccount of {namespace}", timeout_s=60)  # fmt: skip
            # Nobody beats for the simulated cards (the reports of running claims must outlive the grace).
            os.environ.update(ELASTICGPU_HEARTBEAT_GRACE_S="3600", ELASTICGPU_RUNNING_CLAIMS_EXPIRE_S="3600")
            controller = components.start_controller(children, kubeconfig=plane.kubeconfig, namespace=CLAIMS_NS,
                                                     log_dir=log_dir)  # fmt: skip
            webhook, _ = components.start_webhook(children, kubeconfig=plane.kubeconfig, namespace=CLAIMS_NS,
                                                  configuration="elasticgpu-bench", log_dir=log_dir)  # fmt: skip

            def gated() -> bool:
                probe = core.create_namespaced_pod(CLAIMS_NS, pod_body("probe", claims=True), dry_run="All")
                return any(g.name == names.SCHEDULING_GATE for g in probe.spec.scheduling_gates or [])

            processes.wait_until(gated, "the webhook to gate pods that use claims", timeout_s=120,
                                 children=[controller, webhook], interval_s=0.5)  # fmt: skip
            pids = {c.name: c.process.pid for c in [*plane.children.started, controller, webhook]}

            def cpu() -> dict[str, float]:
                return {**{name: _cpu_s(pid) for name, pid in pids.items()}, "bench": _self_cpu_s()}

            for which in args.runs.split(","):
                namespace = CLAIMS_NS if which == "claims" else PLAIN_NS
                how = f"{args.rate:g}/s" if args.rate > 0 else "burst"
                print(f"{which}: {args.pods} pods ({how}) ...", flush=True)
                results[which] = run(custom, core, namespace, pods=args.pods, rate=args.rate,
                                     claims=which == "claims", timeout_s=args.timeout_s, cpu=cpu,
                                     children=[*plane.children.started, controller, webhook])  # fmt: skip
        finally:
            nodes.stop()
            children.stop_all()
            api.close()

    how = f"created at {args.rate:g}/s" if args.rate > 0 else "created in a burst by 16 threads"
    print(f"\nreal kube-scheduler (v1.36.3), {args.nodes} simulated nodes x {CARDS_PER_NODE} cards, {args.pods} pods "
          f"per run, {how}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print("| run | pods created/s | pods scheduled/s | claims bound/s | created->scheduled p50 / p99 ms"
          " | created->Bound p50 / p99 ms | wall s |")
    print("|---|---|---|---|---|---|---|")
    ok = True
    for which, r in results.items():
        flag = "" if r["complete"] else f" ({r['pods'] - r['scheduled']} not scheduled)"
        ok = ok and r["complete"]
        bound = (f"{r['bound_per_s']:.1f}", f"{r['bound_p50_ms']:.0f} / {r['bound_p99_ms']:.0f}") if "bound" in r \
            else ("-", "-")  # fmt: skip
        print(f"| {which} | {r['create_per_s']:.1f} | {r['scheduled_per_s']:.1f}{flag} | {bound[0]} | "
              f"{r['sched_p50_ms']:.0f} / {r['sched_p99_ms']:.0f} | {bound[1]} | {r['wall_s']:.1f} |")
    print("\nCPU seconds per run, by component (share of the run's wall time):")
    for which, r in results.items():
        wall = r["wall_s"] if r["wall_s"] == r["wall_s"] else 1.0
        print(f"  {which}: " + ", ".join(f"{k} {v:.1f} ({100 * v / wall:.0f}%)"
                                          for k, v in sorted(r["cpu"].items(), key=lambda kv: -kv[1])))  # fmt: skip
    print(f"\nlogs of the controller and webhook: {log_dir}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
