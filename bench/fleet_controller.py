"""The controller at fleet size on the real local API server (issue 49 item 2).

Starts the local test server (tests/kube_cluster.py) with the CRDs, creates `--cards` GPU objects
(8 per node) and `--claims` claims of one gpushare class (25 cores, 10 GiB each: four per card,
so 50,000 claims need 12,500 of the 40,000 cards), in parallel, and lets the real controller
(`python -m elasticgpu controller`, leader election on) bind them all: every reservation, ElasticGPU
and claim status is the controller's own. The controller reaches the server through a TCP relay
(tests/controller/relay.py) that can refuse and cut its connections. Then, in order:

  1. start to first bind: the controller stopped (SIGTERM: it releases the Lease), a fresh one
     started and a probe claim created at once; seconds from the process start to the probe Bound
     (list everything, build the picture, take the Lease, bind), and its phases from the
     controller's own log (JSON, with times): imports until it lists, the lists and the picture,
     the Lease, the threads started;
  2. leader kill -9: a standby started beside the leader and standing by (it has listed and
     watches: its picture is warm), the leader killed with SIGKILL and a probe claim created at
     once; seconds to the standby taking the Lease (the lease, 10 s after the last renewal) and to
     the probe Bound;
  3. the API server restarted under it: the relay refuses new connections and cuts the open ones
     for `--outage` seconds, then accepts again; the LIST requests the server counts in the next
     60 s (a storm of relists would show), a probe created after the outage bound, every claim
     still Bound, and each Bound claim's ElasticGPU reserved exactly once on the GPUs;
  4. at rest: the leader restarted (SIGTERM), its CPU from its "ready" on, in successive windows
     (`--rest-window`, with its queue and syncs at each window's end) until the last `--rest`
     seconds are flat and its queue empty (`rest_cpu_share`; the series in `rest_series`), and its
     RSS, from /proc; then the same for the controller of each `--rest-also` checkout (`rest_also`).

`rss_mib` follows the RSS (and its anonymous part) of the process that ends as the leader, and of the
first one, at each step: what each step adds is what to cut. `--controller-env KEY=VALUE` sets an
environment variable in the controller processes only (MALLOC_ARENA_MAX=2, ELASTICGPU_MALLOC=off).

    python bench/fleet_controller.py                                  # 40,000 cards, 50,000 claims
    python bench/fleet_controller.py --cards 4000 --claims 5000       # a tenth (this shared box)
    python bench/fleet_controller.py --cards 80 --claims 100 --rest 5 --outage 3   # smoke run
    python bench/fleet_controller.py --prebound --rest 30                       # the set-up in minutes

`--prebound` replaces the fill: the writer processes write the bound state themselves with the
controller's own code (bench/fleet_prebound.py: `--pods-percent` of the claims are pods' inline
claims, the rest claims a user made), each over its own slice of the cards, much faster than one
controller binding them one by one. Then the controller's first start on that state, until its
queue is empty: the server's writes meanwhile (`first_start_repair_writes`: anything but its
Lease; 0 when the state is what the controller would leave). The steps below follow as before.

`--unselectable-too` measures start -> first bind once more before step 1, with the claim CRD's
selectableFields taken away (the controller then lists every claim before it binds, as before the
waiting claims could be selected; its log says so), and puts them back: the two starts compare
within one run.

The objects are created by `--writers` processes of `--threads` threads each (one Python process
tops out on its JSON and TLS well below what the server takes); the figures say objects per
second. SIGTERM or Ctrl-C stops it cleanly: the controllers, the relay and the server are
stopped on the way out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from binding import _cpu_s, _rss_mib, _server_pids, _writes, bound_watch  # noqa: E402
from crd_server import test_server_with_crds  # noqa: E402

from elasticgpu.api import names  # noqa: E402

NAMESPACE = "fleet"
CLASS = "fleet"
MODEL = "FLEET-A100"


def _gpu(index: int) -> dict[str, Any]:
    name = f"gpu-fleet-{index:06d}"
    return {"apiVersion": names.API_VERSION, "kind": names.KIND_GPU, "metadata": {"name": name},
            "spec": {"index": index % 8, "uuid": name.upper(), "model": MODEL, "memory": 81920,
                     "nodeName": f"fleet-node-{index // 8:05d}"}}


def _claim(name: str) -> dict[str, Any]:
    return {"apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM,
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"elasticGPUClassName": CLASS,
                     "resources": {"requests": {names.RESOURCE_CORE: 25, names.RESOURCE_MEMORY: "10Gi"}}}}


def _prebind_all(kubeconfig: Path, *, cards: int, claims: int, pods_percent: int, writers: int,
                 threads: int) -> dict[str, Any]:
    """`--prebound`: `writers` processes, each with a slice of the cards and of the claims, write the
    bound state with the controller's own code (bench/fleet_prebound.py); its figures."""
    began = time.monotonic()
    slices = [(cards * w // writers, cards * (w + 1) // writers, claims * w // writers, claims * (w + 1) // writers)
              for w in range(writers)]
    for a, b, c, d in slices:
        if d - c > 4 * (b - a):
            raise ValueError(f"--prebound: a writer's {d - c} claims do not fit its {b - a} cards (4 per card);"
                             " give more --cards or fewer --claims")
    request = f"gpu-core=25,gpu-memory=10Gi,class={CLASS}"  # the claim's size (`_claim`), as a pod asks it
    context = multiprocessing.get_context("spawn")  # the bench has threads: no fork
    with context.Pool(writers) as pool:
        results = pool.starmap(_prebind_slice, [(str(kubeconfig), a, b, c, d, request, pods_percent, threads)
                                                for a, b, c, d in slices])
    elapsed = time.monotonic() - began
    figures: dict[str, Any] = {"prebound_s": round(elapsed, 1),
                               "prebound_claims": int(sum(r["claims"] for r in results)),
                               "prebound_pods": int(sum(r["pods"] for r in results))}
    for step in ("gpus", "claims", "plan", "reserve", "bind", "lift"):
        figures[f"prebound_{step}_s"] = round(max(r[f"{step}_s"] for r in results), 1)  # the slowest writer's
        figures[f"prebound_{step}_cpu_s"] = round(sum(r[f"{step}_cpu_s"] for r in results), 1)  # all writers'
    assert figures["prebound_claims"] == claims
    return figures


def _prebind_slice(kubeconfig: str, a: int, b: int, c: int, d: int, request: str, pods_percent: int,
                   threads: int) -> dict[str, float]:
    from fleet_prebound import prebind_range

    return prebind_range(kubeconfig, NAMESPACE, [_gpu(i) for i in range(a, b)], list(range(c, d)),
                         user_claim=_claim("unnamed"), pod_request=request, pods_percent=pods_percent,
                         threads=threads)


def _relayed_kubeconfig(kubeconfig: Path, port: int, out: Path) -> Path:
    """The test server's kubeconfig, its server moved to the relay's port (same host, same TLS)."""
    config = yaml.safe_load(kubeconfig.read_text())
    for cluster in config["clusters"]:
        server = urllib.parse.urlsplit(cluster["cluster"]["server"])
        cluster["cluster"]["server"] = f"{server.scheme}://{server.hostname}:{port}"
    out.write_text(yaml.safe_dump(config))
    return out


def _create_range(kubeconfig: str, kind: str, start: int, stop: int, threads: int) -> int:
    """In a writer process: create objects `start`..`stop` of `kind` ("gpu" or "claim")."""
    from elasticgpu.controller.edge.kube import KubeApi

    kube = KubeApi.from_kubeconfig(kubeconfig)
    try:
        if kind == "gpu":
            def create(i: int) -> None:
                kube.create_gpu(_gpu(i))
        else:
            def create(i: int) -> None:
                kube.create_claim(_claim(f"claim-{i:06d}"))
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(create, range(start, stop)))
    finally:
        kube.close()
    return stop - start


def _create_all(kubeconfig: Path, kind: str, count: int, *, writers: int, threads: int) -> float:
    """Create `count` objects of `kind` with `writers` processes; objects per second."""
    began = time.monotonic()
    step = -(-count // writers)
    ranges = [(i, min(i + step, count)) for i in range(0, count, step)]
    context = multiprocessing.get_context("spawn")  # the bench has threads: no fork
    with context.Pool(len(ranges)) as pool:
        done = sum(pool.starmap(_create_range, [(str(kubeconfig), kind, a, b, threads) for a, b in ranges]))
    assert done == count
    return count / (time.monotonic() - began)


def _fill(args: argparse.Namespace, kubeconfig: Path, kube: Any, klass: dict[str, Any], watch: Any,
          controllers: Controllers, figures: dict[str, Any]) -> subprocess.Popen[bytes]:
    """The set-up without `--prebound`: the GPUs, then the claims with the real controller binding
    them as they come; the leader."""
    began = time.monotonic()
    figures["create_gpus_per_s"] = round(_create_all(kubeconfig, "gpu", args.cards, writers=args.writers,
                                                     threads=args.threads), 1)
    figures["create_gpus_s"] = round(time.monotonic() - began, 1)
    kube.create_class(klass)
    watch.start()
    leader = controllers.start()
    claims = [f"claim-{i:06d}" for i in range(args.claims)]
    began = time.monotonic()
    figures["create_claims_per_s"] = round(_create_all(kubeconfig, "claim", args.claims,
                                                       writers=args.writers, threads=args.threads), 1)
    figures["create_claims_s"] = round(time.monotonic() - began, 1)
    # A leader that cannot renew its Lease in time (a loaded server) exits to restart as a
    # standby, as under a Deployment; here the bench is its restartPolicy.
    deadline = time.monotonic() + args.fill_timeout
    figures["fill_restarts"] = 0
    while not watch.wait(claims, 5.0) and time.monotonic() < deadline:
        if leader.poll() is not None:
            figures["fill_restarts"] += 1
            leader = controllers.start()
    if not all(n in watch.seen for n in claims):
        figures["fill_unbound"] = sum(n not in watch.seen for n in claims)
    figures["fill_s"] = round(max(watch.seen.values()) - began, 1)
    print(f"filled: {json.dumps(figures)}", flush=True)
    return leader


PHASES = {"listing": "listing the cluster", "cards": "listed the cards", "listed": "listed the cluster",
          "leading": "leading: Lease", "ready": "controller ready"}
"""What the controller logs at each step of its start (`early_start.py`, `leader.py`, `starting.py`);
"cards": the early phase's lists done, new standalone claims bind from there."""


class Controllers:
    """Controller processes of the run, each with its log (JSON lines) under bench/out/."""

    def __init__(self, kubeconfig: Path, env: dict[str, str] | None = None) -> None:
        self.kubeconfig = kubeconfig
        self.env = env or {}
        """Set in the controller processes only (the server's and the writers' stay as they are)."""
        self.started = 0
        self.began: dict[int, float] = {}
        """Epoch time each process (by pid) was started."""
        self.logs: dict[int, Path] = {}
        self.ports: dict[int, int] = {}
        """The port of each process's /metrics (and probes)."""

    def start(self, repo: Path = REPO) -> subprocess.Popen[bytes]:
        """A controller process of the code in `repo` (a checkout: `--rest-also`)."""
        self.started += 1
        path = REPO / "bench" / "out" / f"fleet-controller-{self.started}.log"
        with socket.socket() as probe:  # a free port, so that the bench can read its /metrics
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        began = time.time()
        with path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "elasticgpu", "controller", "--kubeconfig", str(self.kubeconfig),
                 "--namespace", NAMESPACE, "--leader-elect-namespace", NAMESPACE, "--log-level", "info",
                 "--log-format", "json", "--health-probe-bind-address", f"127.0.0.1:{port}"],
                stdout=log, stderr=subprocess.STDOUT, cwd=repo, env={**os.environ, "PYTHONPATH": str(repo), **self.env})
        self.began[proc.pid], self.logs[proc.pid], self.ports[proc.pid] = began, path, port
        return proc

    def queue_depth(self, proc: subprocess.Popen[bytes]) -> float | None:
        """Keys waiting in the process's work queue (its /metrics); None while it serves none."""
        return self.queue_and_syncs(proc)[0]

    def queue_and_syncs(self, proc: subprocess.Popen[bytes]) -> tuple[float | None, dict[str, float]]:
        """Keys waiting in the process's work queue and its syncs so far by kind of key (its /metrics);
        (None, {}) while it serves none."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[proc.pid]}/metrics", timeout=10) as answer:
                text = answer.read().decode()
        except OSError:
            return None, {}
        depth = None
        syncs: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("elasticgpu_work_queue_depth "):
                depth = float(line.split()[1])
            elif line.startswith("elasticgpu_sync_duration_seconds_count{"):
                kind = re.search(r'kind="([^"]*)"', line)
                if kind:
                    syncs[kind[1]] = syncs.get(kind[1], 0.0) + float(line.split()[-1])
        return depth, syncs

    def settle(self, proc: subprocess.Popen[bytes], timeout_s: float) -> float | None:
        """Seconds from the process's start until it leads and its queue was empty at two reads 5 s
        apart (the keys its first list queued all synced); None when not within `timeout_s`. Read
        every 5 s: a scrape at 50,000 claims costs the controller about 0.3 s of CPU."""
        deadline = time.monotonic() + timeout_s
        empty_since: float | None = None
        while time.monotonic() < deadline and proc.poll() is None:
            depth = self.queue_depth(proc) if self.says(proc, PHASES["ready"]) else None
            now = time.time()
            empty_since = (empty_since or now) if depth == 0 else None
            if empty_since is not None and now - empty_since >= 5.0:
                return round(empty_since - self.began[proc.pid], 1)
            time.sleep(5.0)
        return None

    def phases(self, proc: subprocess.Popen[bytes], *, since: float | None = None) -> dict[str, float]:
        """Seconds from `since` (default: the process's start) to the first line of each phase."""
        origin = self.began[proc.pid] if since is None else since
        seen: dict[str, float] = {}
        for line in self.logs[proc.pid].read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            for phase, text in PHASES.items():
                if phase not in seen and str(entry.get("message", "")).startswith(text):
                    at = datetime.datetime.fromisoformat(entry["time"]).timestamp()
                    seen[phase] = round(at - origin, 1)
        return seen

    def early_split(self, proc: subprocess.Popen[bytes]) -> dict[str, Any]:
        """The early phase's lists as the controller logs them: seconds for the cards, how many
        claims and seconds for them ("waiting": `status.phase!=Bound`; "all": the full list)."""
        for line in self.logs[proc.pid].read_text(errors="replace").splitlines():
            found = re.search(r"listed the cards in ([\d.]+)s and (\d+) (claims \(all|waiting claims)[^)]*?\)? in"
                              r" ([\d.]+)s", line)
            if found:
                return {"cards_s": float(found[1]), "claims": int(found[2]),
                        "which": "all" if found[3].startswith("claims") else "waiting", "claims_s": float(found[4])}
        return {}

    def says(self, proc: subprocess.Popen[bytes], text: str) -> bool:
        return text in self.logs[proc.pid].read_text(errors="replace")

    def wait_for(self, proc: subprocess.Popen[bytes], text: str, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.says(proc, text):
            if time.monotonic() > deadline or proc.poll() is not None:
                return False
            time.sleep(0.5)
        return True


def _rest_windows(controllers: Controllers, leader: subprocess.Popen[bytes],
                  args: argparse.Namespace) -> dict[str, Any]:
    """The leader's CPU at rest, from its "ready" on: successive `--rest-window` windows until the
    CPU over the last `--rest` seconds of them (3 windows at least) is within `--rest-tolerance` of
    the CPU over the `--rest` seconds before, with its work queue empty at each window's end, or
    `--rest-cap` seconds; the settled share is the last span's (`rest_cpu_share`, None when it
    never settled). The queue is read
    between two windows (the scrape's CPU falls outside both): the first empty read is when the
    keys the start queued were all synced, to within a window."""
    ready = controllers.phases(leader).get("ready")
    origin = controllers.began[leader.pid] + (ready or 0.0)
    needed = max(3, -int(-args.rest // args.rest_window))
    series: list[dict[str, Any]] = []
    result: dict[str, Any] = {"rest_window_s": args.rest_window, "rest_series": series, "rest_cpu_share": None,
                              "rest_settled_at_s": None, "rest_queue_empty_at_s": None}
    deadline = time.monotonic() + args.rest_cap
    synced = controllers.queue_and_syncs(leader)[1]
    while time.monotonic() < deadline and leader.poll() is None:
        cpu, at = _cpu_s(leader.pid), time.monotonic()
        time.sleep(args.rest_window)
        spent, took = _cpu_s(leader.pid) - cpu, time.monotonic() - at
        depth, syncs = controllers.queue_and_syncs(leader)
        done = {kind: int(n - synced.get(kind, 0.0)) for kind, n in syncs.items() if n != synced.get(kind, 0.0)}
        synced = syncs
        series.append({"end_s": round(time.time() - origin, 1), "cpu_share": round(spent / took, 4),
                       "queue": depth, "syncs": done, "cpu_s": spent, "s": took})
        print(f"rest window {len(series)}: {series[-1]['end_s']:.1f} s after ready, CPU {spent / took:.2%} of a core,"
              f" queue {depth}, syncs {done}", flush=True)
        if depth == 0 and result["rest_queue_empty_at_s"] is None:
            result["rest_queue_empty_at_s"] = series[-1]["end_s"]
        # Two spans of `--rest` seconds in a row, each holding a resync pass (the walk's syncs
        # make one 10 s window in three read ~4% at 12,000 / 15,000): their CPU within the
        # tolerance of each other, the queue empty at every window's end.
        last = series[-2 * needed:]
        if len(last) == 2 * needed and all(w["queue"] == 0 for w in last):
            before, now = _share(last[:needed]), _share(last[needed:])
            if abs(now - before) <= args.rest_tolerance:
                result["rest_cpu_share"] = round(now, 4)
                result["rest_settled_at_s"] = series[-1]["end_s"]
                break
    for window in series:
        del window["cpu_s"], window["s"]
    print(f"rest: settled {result['rest_cpu_share']} at {result['rest_settled_at_s']} s after ready; queue first"
          f" empty {result['rest_queue_empty_at_s']} s after ready", flush=True)
    return result


def _share(windows: list[dict[str, Any]]) -> float:
    """The CPU share of a core over `windows` together."""
    return float(sum(w["cpu_s"] for w in windows) / sum(w["s"] for w in windows))


def _memory(pid: int) -> list[int]:
    """[RSS, its anonymous part] in MiB, from /proc: the anonymous part is the heap's (malloc's
    arenas and mmaps, pymalloc's arenas); the rest is mapped files (the interpreter, the libraries)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon"):
            fields[key] = round(int(value.split()[0]) / 1024)
    return [fields.get("VmRSS", 0), fields.get("RssAnon", 0)]


CLAIM_CRD = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{names.PLURAL_CLAIM}.{names.GROUP}"


def _claim_crd_selectable(kube: Any, selectable: bool) -> None:
    """Put the claim CRD's selectableFields back or take them away (the server of an install that
    did not apply this release's CRDs), until the server answers the controller's selector so."""
    from elasticgpu.controller import errors

    crd = kube._call("GET", CLAIM_CRD)
    for version in crd["spec"]["versions"]:
        if selectable:
            version["selectableFields"] = [{"jsonPath": ".status.phase"}]
        else:
            version.pop("selectableFields", None)
    kube._call("PUT", CLAIM_CRD, body=crd)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            kube.list_page(kube.collection_path("claim", NAMESPACE), field_selector="status.phase!=Bound", limit=1)
            if selectable:
                return
        except errors.Rejected:
            if not selectable:
                return
        except errors.ApiUnavailable:
            pass  # 429 while the claims' storage is set up again
        time.sleep(0.5)
    raise TimeoutError("the server did not take the claim CRD's selectableFields change in 120 s")


def _restart_and_probe(controllers: Controllers, leader: subprocess.Popen[bytes], kube: Any, watch: Any,
                       name: str) -> tuple[subprocess.Popen[bytes], float | None]:
    """SIGTERM the leader (it releases the Lease), start a fresh one and create the probe `name` at
    once: the new process and the seconds from its start to the probe Bound."""
    leader.send_signal(signal.SIGTERM)
    leader.wait(timeout=60)
    leader = controllers.start()
    started = time.monotonic()
    kube.create_claim(_claim(name))
    return leader, round(watch.seen[name] - started, 1) if watch.wait([name], 600) else None


def _probe(kube: Any, watch: Any, name: str, timeout_s: float) -> float | None:
    """Create the claim `name` now; seconds until the watch sees it Bound (None: not in time)."""
    began = time.monotonic()
    kube.create_claim(_claim(name))
    if not watch.wait([name], timeout_s):
        return None
    return round(watch.seen[name] - began, 1)


def _lists(kube: Any) -> float:
    return sum(v for k, v in _writes_all(kube).items() if k.startswith("LIST "))


def _writes_all(kube: Any) -> dict[str, float]:
    # `binding._writes` keeps writes only; the same /metrics, every verb.
    _method, url, headers, _body, _post = kube._api.param_serialize(
        method="GET", resource_path="/metrics", header_params={"Accept": "text/plain"}, auth_settings=["BearerToken"])
    text = kube._api.call_api("GET", url, header_params=headers).read().decode()
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(part.split("=", 1) for part in line[line.index("{") + 1:line.index("}")].split(","))
        verb = labels.get("verb", "").strip('"')
        resource = labels.get("resource", "").strip('"')
        key = f"{verb} {resource}"
        counts[key] = counts.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


def _check_books(kube: Any) -> dict[str, int]:
    """Every claim Bound; every Bound claim's ElasticGPU reserved exactly once over all GPUs."""
    claims = kube.list_claims(NAMESPACE)
    bound = {c["metadata"]["name"]: c["spec"].get("elasticGPUName") for c in claims
             if (c.get("status") or {}).get("phase") == "Bound"}
    held: dict[str, int] = {}
    for gpu in kube.list_gpus():
        for allocation in (gpu.get("status") or {}).get("allocations") or []:
            held[allocation["elasticGPU"]] = held.get(allocation["elasticGPU"], 0) + 1
    return {"claims": len(claims), "bound": len(bound),
            "lost": sum(1 for egpu in bound.values() if held.get(egpu or "", 0) == 0),
            "doubled": sum(1 for egpu in bound.values() if held.get(egpu or "", 0) > 1),
            "reservations": sum(held.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cards", type=int, default=40_000)
    parser.add_argument("--claims", type=int, default=50_000)
    parser.add_argument("--threads", type=int, default=8, help="threads per writer process")
    parser.add_argument("--writers", type=int, default=4, help="processes that create the objects")
    parser.add_argument("--fill-timeout", type=float, default=3600.0, help="seconds for every claim to bind")
    parser.add_argument("--outage", type=float, default=10.0, help="seconds the relay refuses the controller")
    parser.add_argument("--rest", type=float, default=60.0,
                        help="seconds of CPU measured at rest, once settled (the last windows, 3 at least)")
    parser.add_argument("--rest-window", type=float, default=10.0,
                        help="seconds of each CPU window from the leader's ready on")
    parser.add_argument("--rest-tolerance", type=float, default=0.03,
                        help="the last two --rest spans' CPU shares differ by at most this (share of a core)")
    parser.add_argument("--rest-only", action="store_true",
                        help="skip steps 1-3 (start, kill -9, outage): the set-up, then the rest (with --rest-also)")
    parser.add_argument("--rest-also", action="append", default=[], metavar="CHECKOUT",
                        help="after this code's rest, restart the controller from this checkout (another commit)"
                        " and measure its rest the same way (repeatable): old and new code in one run")
    parser.add_argument("--rest-cap", type=float, default=600.0,
                        help="seconds of windows at most; rest_cpu_share is null when not settled by then")
    parser.add_argument("--prebound", action="store_true",
                        help="write the bound state with the controller's own code in the writer processes"
                        " (bench/fleet_prebound.py), then start the controller on it and count its writes")
    parser.add_argument("--controller-env", action="append", default=[], metavar="KEY=VALUE",
                        help="an environment variable for the controller processes only (repeatable)")
    parser.add_argument("--pods-percent", type=int, default=80,
                        help="with --prebound: the share of claims that are pods' inline claims")
    parser.add_argument("--unselectable-too", action="store_true",
                        help="measure start -> first bind first with the claim CRD's selectableFields taken away"
                        " (the controller lists every claim before it binds, as before they existed), then as shipped")
    args = parser.parse_args()
    (REPO / "bench" / "out").mkdir(exist_ok=True)

    def terminated(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")  # unwinds through every finally below

    signal.signal(signal.SIGTERM, terminated)

    from kubernetes import client

    from elasticgpu.controller.edge.kube import KubeApi
    from tests.controller.relay import Relay

    figures: dict[str, Any] = {"cards": args.cards, "claims": args.claims, "cpus": os.cpu_count()}
    with test_server_with_crds() as (cluster, api):
        kube = KubeApi.from_kubeconfig(str(cluster.kubeconfig))
        client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
        server = urllib.parse.urlsplit(yaml.safe_load(cluster.kubeconfig.read_text())["clusters"][0]["cluster"]
                                       ["server"])
        relay = Relay((server.hostname or "127.0.0.1", server.port or 443))
        controllers = Controllers(_relayed_kubeconfig(cluster.kubeconfig, relay.port,
                                                      REPO / "bench" / "out" / "fleet-kubeconfig.yaml"),
                                  dict(item.split("=", 1) for item in args.controller_env))
        figures["controller_env"] = controllers.env
        rss: dict[str, list[int]] = {}
        figures["rss_mib"] = rss
        klass = {"apiVersion": names.API_VERSION, "kind": names.KIND_CLASS, "metadata": {"name": CLASS},
                 "provisioner": names.PROVISIONER_GPUSHARE, "parameters": {"gpuModel": MODEL}}
        watch = bound_watch(kube, NAMESPACE)
        leader: subprocess.Popen[bytes] | None = None
        standby = None
        try:
            if args.prebound:
                kube.create_class(klass)
                before = _writes(kube)
                server_cpu = sum(_cpu_s(pid) for pid in _server_pids())
                figures.update(_prebind_all(cluster.kubeconfig, cards=args.cards, claims=args.claims,
                                            pods_percent=args.pods_percent, writers=args.writers,
                                            threads=args.threads))
                written = {k: v - before.get(k, 0.0) for k, v in _writes(kube).items() if v != before.get(k, 0.0)}
                figures["prebound_writes"] = written
                figures["prebound_writes_per_s"] = round(sum(written.values()) / figures["prebound_s"], 1)
                # The API server's and etcd's CPU for the set-up, beside the writers' (prebound_*_cpu_s).
                figures["prebound_server_cpu_s"] = round(sum(_cpu_s(pid) for pid in _server_pids()) - server_cpu, 1)
                figures["prebound_books"] = _check_books(kube)
                print(f"prebound: {json.dumps(figures)}", flush=True)
                watch.start()
                # The controller's first start on the prebound state: every key its first list
                # queues synced, and what it wrote meanwhile (a repair would show; its Lease is its own).
                before = _writes(kube)
                leader = controllers.start()
                figures["first_start_settled_s"] = controllers.settle(leader, args.fill_timeout)
                figures["first_start_phases_s"] = controllers.phases(leader)
                figures["first_start_early_split"] = controllers.early_split(leader)
                after = _writes(kube)
                written = {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}
                figures["first_start_writes"] = written
                figures["first_start_repair_writes"] = sum(v for k, v in written.items() if "leases" not in k)
                print(f"first start: {json.dumps(figures)}", flush=True)
            else:
                leader = _fill(args, cluster.kubeconfig, kube, klass, watch, controllers, figures)

            if not args.rest_only:
                # 1. start to first bind
                if args.unselectable_too:  # first as on a server that cannot select claims by phase
                    _claim_crd_selectable(kube, False)
                    leader, figures["unselectable_start_to_first_bind_s"] = _restart_and_probe(
                        controllers, leader, kube, watch, "probe-start-unselectable")
                    figures["unselectable_start_phases_s"] = controllers.phases(leader)
                    figures["unselectable_start_early_split"] = controllers.early_split(leader)
                    _claim_crd_selectable(kube, True)
                    print(f"unselectable start: {json.dumps(figures)}", flush=True)
                leader, figures["start_to_first_bind_s"] = _restart_and_probe(controllers, leader, kube, watch,
                                                                             "probe-start")
                figures["start_phases_s"] = controllers.phases(leader)
                figures["start_early_split"] = controllers.early_split(leader)
                figures["start_rss_mib"] = round(_rss_mib(leader.pid))
                rss["first: first bind"] = _memory(leader.pid)
                # The early start binds before the whole picture is listed: RSS with all of it.
                controllers.wait_for(leader, PHASES["listed"], 600)
                rss["first: listed"] = _memory(leader.pid)

                # 2. leader kill -9 with a standby beside it, standing by with its picture listed
                standby = controllers.start()
                deadline = time.monotonic() + 600
                while not controllers.says(standby, "standing by") and time.monotonic() < deadline:
                    time.sleep(0.5)
                figures["standby_phases_s"] = controllers.phases(standby)
                rss["first: beside a standby"] = _memory(leader.pid)
                rss["standby: standing by"] = _memory(standby.pid)
                time.sleep(5.0 + random.uniform(0.0, 2.0))  # at a random moment between two renewals
                killed = time.time()
                leader.kill()
                leader.wait(timeout=30)
                figures["kill9_to_first_bind_s"] = _probe(kube, watch, "probe-kill", 600)
                figures["kill9_to_lease_s"] = controllers.phases(standby, since=killed).get("leading")
                leader, standby = standby, None
                controllers.wait_for(leader, PHASES["ready"], 600)
                rss["second: leading, first bind"] = _memory(leader.pid)

                # 3. the API server restarted under it
                lists_before = _lists(kube)
                relay.refuse()
                relay.cut()
                time.sleep(args.outage)
                relay.accept_again()
                back = time.monotonic()
                kube.create_claim(_claim("probe-outage"))
                # A leader that could not renew through the outage (renew deadline 10 s) exits to
                # restart as a standby: restarted here as its Deployment would.
                figures["outage_restarts"] = 0
                while not watch.wait(["probe-outage"], 2.0) and time.monotonic() - back < 600:
                    if leader.poll() is not None:
                        figures["outage_restarts"] += 1
                        leader = controllers.start()
                figures["after_outage_first_bind_s"] = (round(watch.seen["probe-outage"] - back, 1)
                                                        if "probe-outage" in watch.seen else None)
                time.sleep(max(0.0, 60.0 - (time.monotonic() - back)))
                figures["lists_in_60s_after_outage"] = _lists(kube) - lists_before
                figures["books"] = _check_books(kube)
                rss[f"second: 60 s after the outage (restarts {figures['outage_restarts']})"] = _memory(leader.pid)

            # 4. at rest: a leader restarted (SIGTERM: it releases the Lease), from its "ready" on
            # (its first pass after the start included), until its CPU is flat; then the same for
            # each --rest-also checkout's controller, so that old and new code compare in one run.
            figures["rest_also"] = []
            for repo in [REPO, *(Path(path).resolve() for path in args.rest_also)]:
                leader.send_signal(signal.SIGTERM)
                leader.wait(timeout=60)
                leader = controllers.start(repo)
                controllers.wait_for(leader, PHASES["ready"], 900)
                rested = _rest_windows(controllers, leader, args)
                rested["rest_start_phases_s"] = controllers.phases(leader)
                rested["rest_rss_mib"] = round(_rss_mib(leader.pid))
                if repo == REPO:
                    figures.update(rested)
                    rss["third: at rest"] = _memory(leader.pid)
                else:
                    figures["rest_also"].append({"repo": str(repo), **rested})
            figures["writes_total"] = {k: v for k, v in _writes(kube).items() if v}
        finally:
            for proc in (leader, standby):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=30)
            watch.stop()
            relay.close()
            kube.close()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
