"""Binding throughput and latency end to end through the API server, and controller memory.

Starts the local test server (tests/kube_cluster.py), installs the CRDs, creates simulated GPU
objects, and runs the real controller (`python -m elasticgpu controller`) as a subprocess, once
per variant (each in its own namespace, on its own GPUs):

  (a) burst: N claims created by 16 threads as fast as the server takes them; claims/s bound =
      N / (last Bound seen by a watch - first create);
  (b) fixed rates: claims offered at R/s for S seconds, per rate of --rates, each phase after
      the API server took no write for a second (the previous phase's tail, mostly Events);
      created->Bound latency per claim, from the return of its create call to the moment the
      watch sees phase Bound (p50/p99/max);
  CPU per bound claim in the burst of the controller, the server (apiserver + etcd) and this
  process (creates, watch), API writes per claim (the server's /metrics), and the ceiling they
  imply where all three share the machine's CPUs;
  (c) controller RSS with 10,000 GPUs and 50,000 Bound claims (and their ElasticGPUs): measured
      in a fresh process by loading the objects into the controller's picture directly
      (`Controller.observe`), not through the server (creating 110,000 objects takes too long here).

Variant `null` (bench/null_controller.py) does the watches and writes of a dynamic bind with no
decisions: the ceiling of this machine in the same run; `--rates half` offers half of its burst.
`null-baseline` is the null controller of the `--baseline` tree, over that tree's `KubeApi`
(what a change of the wire path did to the floor); it sets no ceiling.

    python bench/binding.py                         # 3 variants, 500 GPUs, burst 1000, 100/s x 20 s, RSS
    python bench/binding.py --baseline /tmp/base --variants null,after --burst 1000 --rates half --seconds 20
    python bench/binding.py --variants after --rates 25,50,75,100 --no-rss      # latency against load
    python bench/binding.py --variants after --burst 300 --seconds 5 --no-rss   # quick look
    git worktree add /tmp/base REV && python bench/binding.py --baseline /tmp/base --variants after
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from crd_server import test_server_with_crds  # noqa: E402
from first_seen import FirstSeen  # noqa: E402

from elasticgpu.api import names  # noqa: E402

VARIANTS: dict[str, dict[str, str]] = {
    # kopf's watches, everything on the binder thread, Events written inline: the controller
    # before this work.
    "before": {"ELASTICGPU_BINDING_WORKERS": "0", "ELASTICGPU_WATCH": "kopf"},
    # Reservations committed in batches per card, steps after the commit point on a worker
    # pool, Events off the hot path; still kopf's watches.
    "kopf-workers": {"ELASTICGPU_WATCH": "kopf"},
    # The default: all of the above with the controller's own watches.
    "after": {},
}
CORES = 10
MEMORY = "1Gi"


def _gpu(name: str, node: str, index: int, model: str) -> dict[str, Any]:
    return {"apiVersion": names.API_VERSION, "kind": names.KIND_GPU, "metadata": {"name": name},
            "spec": {"index": index, "uuid": name.upper(), "model": model, "memory": 81920, "nodeName": node}}


def _claim(name: str, namespace: str, class_name: str) -> dict[str, Any]:
    return {"apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM,
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"elasticGPUClassName": class_name,
                     "resources": {"requests": {names.RESOURCE_CORE: CORES, names.RESOURCE_MEMORY: MEMORY}}}}


def bound_watch(kube: Any, namespace: str) -> FirstSeen:
    """When each claim of the namespace was first seen Bound."""
    path = f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{namespace}/{names.PLURAL_CLAIM}"

    def bound(event: dict[str, Any]) -> bool:
        return ((event.get("object") or {}).get("status") or {}).get("phase") == "Bound"

    return FirstSeen(kube, path, bound)


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _server_pids() -> list[int]:
    """The API server and etcd: this process's children other than the controller. Matched on
    the executable's path: the kernel's `comm` is cut at 15 characters ("elasticgpu-test")."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                exe = os.readlink(entry / "exe")
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            if parent == os.getpid() and Path(exe).name in ("etcd", "elasticgpu-testserver"):
                pids.append(int(entry.name))
    return pids


def _self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _writes(kube: Any) -> dict[str, float]:
    """The API server's count of successful writes so far, by "VERB resource[/subresource]"
    (from its /metrics: apiserver_request_total)."""
    _method, url, headers, _body, _post = kube._api.param_serialize(
        method="GET", resource_path="/metrics", header_params={"Accept": "text/plain"}, auth_settings=["BearerToken"])
    text = kube._api.call_api("GET", url, header_params=headers).read().decode()
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels_text, value = line[len("apiserver_request_total{"):].rsplit("} ", 1)
        labels = dict(part.split("=", 1) for part in labels_text.split(",") if "=" in part)
        labels = {k: v.strip('"') for k, v in labels.items()}
        if labels.get("verb") in ("POST", "PUT", "PATCH", "DELETE") and labels.get("code", "").startswith("2"):
            what = labels.get("resource", "") + (f"/{labels['subresource']}" if labels.get("subresource") else "")
            key = f"{labels['verb']} {what}"
            counts[key] = counts.get(key, 0.0) + float(value)
    return counts


def _offer_at(kube: Any, watch: FirstSeen, namespace: str, class_name: str, *, rate: float,
              seconds: float) -> dict[str, Any]:
    """Create claims at `rate`/s for `seconds`; created->Bound latency percentiles."""
    total = int(rate * seconds)
    offered = [f"rate{rate:g}-{i}" for i in range(total)]
    returned: dict[str, float] = {}
    writes_before = _writes(kube)
    begin = time.monotonic() + 0.2

    def offer(index: int) -> None:
        delay = begin + index / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        kube.create_claim(_claim(offered[index], namespace, class_name))
        returned[offered[index]] = time.monotonic()

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(offer, range(total)))
    watch.wait(offered, 60)
    latencies = sorted((watch.seen[n] - returned[n]) * 1000 for n in offered if n in watch.seen)
    _settle(kube)  # the phase's own Events and ElasticGPU statuses count towards it
    writes = _writes(kube)
    writes_per_claim = {k: (v - writes_before.get(k, 0.0)) / max(total, 1) for k, v in writes.items()
                        if v - writes_before.get(k, 0.0) > 0}
    if os.environ.get("BENCH_DEBUG"):
        slow = sorted(((watch.seen[n] - returned[n]) * 1000, returned[n] - begin) for n in offered if n in watch.seen)
        print("slowest (ms, at s):", [(round(a), round(b, 2)) for a, b in slow[-12:]], file=sys.stderr)
    return {
        "rate": rate,
        "offered_per_s": total / (max(returned.values()) - begin),
        "latency_p50_ms": statistics.median(latencies) if latencies else float("nan"),
        "latency_p99_ms": latencies[int(0.99 * (len(latencies) - 1))] if latencies else float("nan"),
        "latency_max_ms": latencies[-1] if latencies else float("nan"),
        "unbound": total - len(latencies),
        "writes": writes_per_claim,
    }


def _settle(kube: Any, *, quiet_s: float = 1.0, timeout_s: float = 120.0) -> float:
    """Wait until the API server has taken no write for `quiet_s`; seconds waited."""
    start = time.monotonic()
    last = sum(_writes(kube).values())
    quiet_since = time.monotonic()
    while time.monotonic() - start < timeout_s:
        time.sleep(0.25)
        now = sum(_writes(kube).values())
        if now != last:
            last, quiet_since = now, time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_s:
            break
    return time.monotonic() - start


def _kind(variant: str) -> str:
    """The variant without a round suffix: "after-2" is a second round of "after" in the same run
    (alternating rounds show how much the load of other work on the machine moves the figures)."""
    return re.sub(r"-[0-9]+$", "", variant)


def run_variant(variant: str, args: argparse.Namespace, cluster: Any, kube: Any, core: Any) -> dict[str, Any]:
    from kubernetes import client

    namespace = f"bench-{variant}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    model = f"BENCH-{variant.upper()}"
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: kube.create_gpu(_gpu(f"gpu-{variant}-{i}", f"{variant}-node-{i // 8}", i % 8, model)),
                      range(args.gpus)))
    class_name = f"bench-{variant}"
    kube.create_class({"apiVersion": names.API_VERSION, "kind": names.KIND_CLASS, "metadata": {"name": class_name},
                       "provisioner": names.PROVISIONER_GPUSHARE, "parameters": {"gpuModel": model}})
    watch = bound_watch(kube, namespace)
    watch.start()
    log = open(REPO / "bench" / "out" / f"binding-controller-{variant}.log", "wb")  # noqa: SIM115
    kind = _kind(variant)
    tree = Path(args.baseline).resolve() if kind in ("baseline", "null-baseline") else REPO
    env = {**os.environ, "PYTHONPATH": str(tree), **VARIANTS.get(kind, {})}
    command = [sys.executable, "-m", "elasticgpu", "controller", "--kubeconfig", str(cluster.kubeconfig),
               "--namespace", namespace, "--log-level", "warning"]
    if kind in ("null", "null-baseline"):  # the ceiling: the same writes and watches, no decisions
        command = [sys.executable, str(tree / "bench" / "null_controller.py"), "--kubeconfig", str(cluster.kubeconfig),
                   "--namespace", namespace, "--model", model]
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=tree, env=env)
    result: dict[str, Any] = {"variant": variant}
    try:
        kube.create_claim(_claim("warmup", namespace, class_name))
        if not watch.wait(["warmup"], 60):
            raise SystemExit(f"{variant}: the controller did not bind a first claim in 60 s")

        # (a) burst
        burst = [f"burst-{i}" for i in range(args.burst)]
        servers = _server_pids()
        cpu_before = _cpu_s(proc.pid), sum(_cpu_s(p) for p in servers), _self_cpu_s()
        writes_before = _writes(kube)
        start = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda n: kube.create_claim(_claim(n, namespace, class_name)), burst))
        created = time.monotonic()
        ok = watch.wait(burst, 120)
        last = max((watch.seen[n] for n in burst if n in watch.seen), default=time.monotonic())
        bound = sum(n in watch.seen for n in burst)
        result["create_per_s"] = args.burst / (created - start)
        result["burst_per_s"] = bound / (last - start)
        result["burst_complete"] = ok
        result["controller_cpu_ms"] = (_cpu_s(proc.pid) - cpu_before[0]) * 1000 / max(bound, 1)
        result["server_cpu_ms"] = (sum(_cpu_s(p) for p in servers) - cpu_before[1]) * 1000 / max(bound, 1)
        result["bench_cpu_ms"] = (_self_cpu_s() - cpu_before[2]) * 1000 / max(bound, 1)
        writes_after = _writes(kube)
        # Counted until the last Bound: Events still queued then (and the creates) are included
        # as far as they were written by that moment.
        result["writes"] = {k: (v - writes_before.get(k, 0.0)) / max(bound, 1) for k, v in writes_after.items()
                            if v - writes_before.get(k, 0.0) > 0}

        # (b) fixed offered rates, lowest first; before each, the work the previous phase left
        # behind (mostly its Events, written off the hot path) is let finish, so that each phase
        # measures its own steady state and not the tail of the one before.
        result["rates"] = []
        if kind == "null":  # the latest one sets the rate of the phases after it
            args.ceiling = result["burst_per_s"]
        for token in args.rates:
            if token == "half":
                if args.ceiling is None:
                    raise SystemExit("--rates half needs the variant 'null' first (its burst is the ceiling)")
                rate = round(args.ceiling / 2, 1)
            else:
                rate = float(token)
            settle_s = _settle(kube)
            phase = _offer_at(kube, watch, namespace, class_name, rate=rate, seconds=args.seconds)
            result["rates"].append({**phase, "settle_s": settle_s})
        result["controller_rss_mib"] = _rss_mib(proc.pid)
    finally:
        proc.kill()
        proc.wait(timeout=15)
        watch.stop()
        log.close()
    return result


def rss_child(gpus: int, claims: int) -> None:
    """In a fresh process: load `gpus` GPUs with `claims` Bound claims into a Controller's picture;
    prints the RSS before and after (MiB), the load (s), a Bound claim's sync (µs) and one pass
    of syncs over every claim and ElasticGPU (CPU s)."""
    from elasticgpu.controller.process.reconciling import Controller

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    controller = Controller(kube=object(), namespace="rss")  # type: ignore[arg-type]
    per_card = -(-claims // gpus)
    start = time.monotonic()
    for index in range(gpus):
        name = f"gpu-rss-{index:05d}"
        allocations = [{"elasticGPU": f"egpu-{index:05d}-{k}", "cores": 10, "memory": 1024,
                        "claimRef": {"namespace": "rss", "name": f"c-{index:05d}-{k}", "uid": f"uid-{index:05d}-{k}"}}
                       for k in range(per_card) if index * per_card + k < claims]
        body = _gpu(name, f"node-{index // 8:04d}", index % 8, "A100-SXM4-80GB")
        body["metadata"]["resourceVersion"] = "1"
        body["status"] = {"allocations": allocations}
        controller.observe("gpu", "ADDED", body)
        for allocation in allocations:
            egpu = allocation["elasticGPU"]
            ref = allocation["claimRef"]
            controller.observe("egpu", "ADDED", {
                "apiVersion": names.API_VERSION, "kind": names.KIND_ELASTIC_GPU,
                "metadata": {"name": egpu, "resourceVersion": "1", "finalizers": [names.FINALIZER_EGPU_PROTECTION]},
                "spec": {"capacity": {names.RESOURCE_CORE: 10, names.RESOURCE_MEMORY: "1Gi"},
                         "gpuShare": {"gpuName": name}, "claimRef": ref, "elasticGPUClassName": "c"},
                "status": {"phase": "Bound", "nodeName": body["spec"]["nodeName"], "gpus": [name.upper()]}})
            controller.observe("claim", "ADDED", {
                "apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM,
                "metadata": {"name": ref["name"], "namespace": "rss", "uid": ref["uid"], "resourceVersion": "1",
                             "finalizers": [names.FINALIZER_CLAIM_PROTECTION]},
                "spec": {"elasticGPUName": egpu, "elasticGPUClassName": "c",
                         "resources": {"requests": {names.RESOURCE_CORE: 10, names.RESOURCE_MEMORY: "1Gi"}}},
                "status": {"phase": "Bound", "conditions": [{"type": "Bound", "status": "True", "reason": "Bound",
                                                              "message": "bound"}]}})
    loaded = time.monotonic() - start
    rss = _rss_mib(os.getpid())
    sync_start = time.monotonic()
    for key in controller.picture.claim_keys()[:1000]:
        controller.sync_claim(*key)  # InSync: decides, writes nothing
    sync_us = (time.monotonic() - sync_start) / 1000 * 1e6
    # What a periodic resync costs the controller: every claim and ElasticGPU synced once, in
    # the order the resync queues them (CPU seconds: less at the mercy of the machine's load).
    pass_start = time.process_time()
    for key in controller.picture.all_keys():
        if key[0] == "claim":
            controller.claims.sync(key[1], key[2])
        elif key[0] == "egpu":
            controller.elastic_gpus.sync(key[1])
    pass_s = time.process_time() - pass_start
    print(f"{base:.1f} {rss:.1f} {loaded:.1f} {sync_us:.1f} {pass_s:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=500)
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--rates", type=lambda v: v.split(","), default=["100"],
                        help="offered claims/s of the fixed-rate phases, comma-separated (default 100); 'half':"
                             " half the ceiling the variant 'null' measured in its burst of this run")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--variants", default="before,kopf-workers,after",
                        help="comma-separated; 'null' (bench/null_controller.py: the writes and watches of a"
                             " dynamic bind, no decisions) measures the ceiling, and must come first for --rates half")
    parser.add_argument("--baseline", metavar="TREE",
                        help="a checkout of another commit (git worktree add TREE REV): adds the variant"
                             " 'baseline', that commit's controller with its own defaults, measured in the same run")
    parser.add_argument("--no-rss", action="store_true")
    parser.add_argument("--rss-gpus", type=int, default=10_000)
    parser.add_argument("--rss-claims", type=int, default=50_000)
    parser.add_argument("--rss-child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.ceiling = None
    if args.rss_child:
        rss_child(*args.rss_child)
        return
    (REPO / "bench" / "out").mkdir(exist_ok=True)

    from kubernetes import client

    from elasticgpu.controller.edge.kube import KubeApi

    results = []
    if args.baseline and "baseline" not in args.variants.split(","):
        listed = args.variants.split(",")
        at = 1 if listed[0] == "null" else 0  # the ceiling first, so that --rates half can use it
        args.variants = ",".join([*listed[:at], "baseline", *listed[at:]])
    with test_server_with_crds() as (cluster, api):
        kube = KubeApi.from_kubeconfig(str(cluster.kubeconfig))
        core = client.CoreV1Api(api)
        for variant in args.variants.split(","):
            print(f"{variant}: {args.gpus} GPUs, burst {args.burst}, load average {os.getloadavg()[0]:.2f},"
                  f" {'/'.join(args.rates)}/s x {args.seconds:g} s ...",
                  flush=True)
            results.append(run_variant(variant, args, cluster, kube, core))
        kube.close()
        api.close()
    print(f"\nbinding end to end, local test server, {args.gpus} simulated GPUs, {os.cpu_count()} CPUs,"
          f" load average at the end {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print("| variant | creates/s | burst bound/s | of the ceiling | CPU ms/claim: controller, server, bench"
          " | controller RSS MiB |")
    print("|---|---|---|---|---|---|")
    for r in results:
        ceiling = next((c["burst_per_s"] for c in reversed(results[:results.index(r) + 1])
                        if _kind(c["variant"]) == "null"), None)
        share = f"{r['burst_per_s'] / ceiling:.0%}" if ceiling else "-"
        print(f"| {r['variant']} | {r['create_per_s']:.0f} | {r['burst_per_s']:.1f}"
              f"{'' if r['burst_complete'] else ' (incomplete)'} | {share}"
              f" | {r['controller_cpu_ms']:.2f}, {r['server_cpu_ms']:.1f}, {r['bench_cpu_ms']:.1f}"
              f" | {r['controller_rss_mib']:.0f} |")
    print("\ncreated -> Bound at fixed offered rates (each phase after the previous one settled)")
    print("| variant | offered/s | p50 ms | p99 ms | max ms | unbound after 60 s | API writes per claim (GPU) |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        for phase in r["rates"]:
            gpu_writes = phase["writes"].get("PUT gpus/status", 0.0)
            print(f"| {r['variant']} | {phase['offered_per_s']:.0f} | {phase['latency_p50_ms']:.0f}"
                  f" | {phase['latency_p99_ms']:.0f} | {phase['latency_max_ms']:.0f} | {phase['unbound']}"
                  f" | {sum(phase['writes'].values()):.2f} ({gpu_writes:.2f}) |")
    cores = os.cpu_count() or 1
    print(f"\nceiling on this machine ({cores} CPUs shared by all three): {cores} x 1000 ms / the CPU ms per claim")
    null = next((r for r in results if _kind(r["variant"]) == "null"), None)
    for r in results:
        per_claim = r["controller_cpu_ms"] + r["server_cpu_ms"] + r["bench_cpu_ms"]
        writes = sum(r["writes"].values())
        # Less sensitive to other work on the machine than the burst's wall-clock rate: CPU time
        # per claim of our own processes only.
        share = ""
        null = next((c for c in reversed(results[:results.index(r) + 1]) if _kind(c["variant"]) == "null"), null)
        if null is not None:
            null_per_claim = null["controller_cpu_ms"] + null["server_cpu_ms"] + null["bench_cpu_ms"]
            share = f" ({null_per_claim / per_claim:.0%} of the null controller's)"
        print(f"  {r['variant']}: {cores * 1000 / per_claim:.0f} claims/s{share}; the server alone"
              f" {r['server_cpu_ms'] / max(writes, 1e-9):.2f} ms CPU per write x {writes:.2f} writes per claim")
    print("\nAPI writes per bound claim in the burst (server = apiserver + etcd; bench = the claim creates"
          " and the Bound watch):")
    for r in results:
        writes = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["writes"].items(), key=lambda kv: -kv[1]))
        print(f"  {r['variant']}: {sum(r['writes'].values()):.2f} ({writes})")
    if not args.no_rss:
        out = subprocess.run([sys.executable, __file__, "--rss-child", str(args.rss_gpus), str(args.rss_claims)],
                             capture_output=True, text=True, check=True, timeout=900).stdout.split()
        base, rss, loaded, sync_us, pass_s = (float(x) for x in out)
        print(f"\ncontroller picture, {args.rss_gpus:,} GPUs + {args.rss_claims:,} Bound claims and ElasticGPUs"
              f" (loaded with Controller.observe, no server): RSS {rss:.0f} MiB (process before loading"
              f" {base:.0f} MiB), load {loaded:.1f} s, sync of a Bound claim {sync_us:.0f} µs, a resync's"
              f" pass over every claim and ElasticGPU {pass_s:.1f} s CPU")


if __name__ == "__main__":
    main()
