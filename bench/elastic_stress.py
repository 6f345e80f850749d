"""Elastic stress (issue 17, Measure 2): two controller processes, a resizable class, quotas on
some namespaces, and N threads doing random expand / shrink / create / delete of claims for a
while. Then, once everything is quiet, three figures read from the API objects alone:

- cards oversubscribed: a card whose reservations (`GPU.status.allocations`) sum above 100
  cores or its memory, or that holds a whole-card (exclusive) reservation beside another;
- quota keys exceeded: for each ElasticGPUQuota, the use recomputed from the reservations of its
  namespace (each reservation's ElasticGPU names its claim's namespace and class) against
  `spec.hard` (namespace-wide and per-class keys);
- leaked reservations: a reservation that does not belong to the ElasticGPU of an existing
  Bound claim, a Bound claim without its reservation, or one whose `status.capacity` is not
  its reservation.

Shrinks complete because no container runs: the GPUs have no `status.runningClaims` entry, so
the controller releases the freed part at once. Resize latency is the time from the patch of
the requests to a GET showing `status.capacity` at the new size (polled every 50 ms), for the
resizes that were carried out (a refused one, NoRoomOnCard or QuotaExceeded, is counted apart).

    python bench/elastic_stress.py                 # 60 s, 8 threads
    python bench/elastic_stress.py --seconds 10    # quick look

`tests/binding/test_elastic_stress.py` runs `stress()` for a few seconds and asserts the zeros.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from percentiles import percentile  # noqa: E402

from elasticgpu.api import names, parse_memory_mib  # noqa: E402
from elasticgpu.api.quota import parse_hard, quota_key  # noqa: E402

CORE, MEMORY = names.RESOURCE_CORE, names.RESOURCE_MEMORY
GPUS = 12
CARD_MIB = 81920
REFUSALS = ("NoRoomOnCard", "QuotaExceeded", "ShrinkBlocked", "WholeCardResize", "InvalidResize", "InvalidQuota")
ANSWER_S = 8.0
"""How long a thread waits for the answer to one resize before it counts it unanswered."""


@dataclass
class Report:
    """What one run did and what the API objects show after it."""

    ops: Counter[str] = field(default_factory=Counter)
    latencies_ms: dict[str, list[float]] = field(default_factory=lambda: {"expand": [], "shrink": []})
    oversubscribed: list[str] = field(default_factory=list)
    quota_exceeded: list[str] = field(default_factory=list)
    leaked: list[str] = field(default_factory=list)
    phases: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def print(self) -> None:
        """The figures, as a table for the report."""
        print(f"\nelastic stress: {self.seconds:.0f} s, local test server, {GPUS} simulated GPUs,"
              f" two controller processes, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
        print("operations: " + ", ".join(f"{k} {v}" for k, v in sorted(self.ops.items())))
        print(f"claims at the end: {dict(self.phases)}")
        print(f"cards oversubscribed: {len(self.oversubscribed)}  quota keys exceeded: {len(self.quota_exceeded)}"
              f"  leaked reservations: {len(self.leaked)}")
        for problem in (self.oversubscribed + self.quota_exceeded + self.leaked)[:20]:
            print(f"  {problem}")
        print("| resize | carried out | p50 ms | p99 ms | max ms |")
        print("|---|---|---|---|---|")
        for kind, values in [*self.latencies_ms.items(), ("all", [v for vs in self.latencies_ms.values() for v in vs])]:
            if values:
                print(f"| {kind} | {len(values)} | {percentile(values, 0.5):.1f} | {percentile(values, 0.99):.1f}"
                      f" | {max(values):.1f} |")
            else:
                print(f"| {kind} | 0 | - | - | - |")


def _mib(value: object) -> int:
    return parse_memory_mib(value, field="memory")


class Workers:
    """The random operations: each thread takes a claim out of the shared pool while it works on
    it, so no two threads act on one claim at once (as one user would not)."""

    def __init__(self, kube: Any, namespaces: list[str], classes: tuple[str, str], report: Report, seed: int) -> None:
        self.kube, self.namespaces, self.report = kube, namespaces, report
        self.share_class, self.whole_class = classes
        self.pool: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.seed = seed
        self.serial = 0

    def _count(self, op: str) -> None:
        with self.lock:
            self.report.ops[op] += 1

    def _take(self, rng: random.Random) -> tuple[str, str] | None:
        with self.lock:
            if not self.pool:
                return None
            return self.pool.pop(rng.randrange(len(self.pool)))

    def _give(self, key: tuple[str, str]) -> None:
        with self.lock:
            self.pool.append(key)

    def create(self, rng: random.Random) -> None:
        with self.lock:
            self.serial += 1
            name = f"s{self.serial}"
        namespace = rng.choice(self.namespaces)
        whole = rng.random() < 0.08  # now and then a whole card, so that "whole cards alone" is tried too
        requests: dict[str, Any] = ({names.RESOURCE_NVIDIA_GPU: 1} if whole else
                                    {CORE: rng.randrange(5, 35), MEMORY: f"{rng.randrange(1, 12)}Gi"})
        self.kube.create_claim({
            "apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM,
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"elasticGPUClassName": self.whole_class if whole else self.share_class,
                     "resources": {"requests": requests}}})
        self._count("create whole card" if whole else "create")
        self._give((namespace, name))

    def delete(self, rng: random.Random) -> None:
        key = self._take(rng)
        if key is None:
            return
        with contextlib.suppress(Exception):  # a 404 counts the same: the claim is gone
            self.kube.delete_claim(*key)
        self._count("delete")

    def resize(self, rng: random.Random, *, grow: bool) -> None:
        key = self._take(rng)
        if key is None:
            return
        try:
            self._resize(rng, key, grow=grow)
        finally:
            self._give(key)

    def _resize(self, rng: random.Random, key: tuple[str, str], *, grow: bool) -> None:
        namespace, name = key
        kind = "expand" if grow else "shrink"
        claim = self.kube.get_claim(namespace, name)
        status = claim.get("status") or {}
        if status.get("phase") != "Bound" or not status.get("resizable") or not status.get("capacity"):
            self._count(f"{kind} skipped (not Bound yet)")
            time.sleep(0.05)  # the controller is still binding it: give it the CPU
            return
        if names.RESOURCE_NVIDIA_GPU in claim["spec"]["resources"]["requests"]:
            self._whole(claim, grow=grow)
            return
        cores, memory = int(status["capacity"][CORE]), _mib(status["capacity"][MEMORY])
        if grow:
            # at most 90 cores: 100 is one whole card, which a share cannot become
            target = (min(90, cores + rng.randrange(5, 30)), min(60 * 1024, memory + 1024 * rng.randrange(1, 10)))
        else:
            target = (max(1, cores - rng.randrange(1, 20)), max(512, memory - 1024 * rng.randrange(1, 6)))
        if target == (cores, memory):
            return
        before = _refusal(status)
        start = time.monotonic()
        try:
            self.kube.patch_claim(namespace, name, {"spec": {"resources": {"requests": {
                CORE: target[0], MEMORY: f"{target[1]}Mi"}}}})
        except Exception as err:  # deleted meanwhile is impossible (we hold it); a CRD refusal is a finding
            self._count(f"{kind} patch refused ({type(err).__name__})")
            return
        deadline = start + ANSWER_S
        while time.monotonic() < deadline:
            status = self.kube.get_claim(namespace, name).get("status") or {}
            capacity = status.get("capacity") or {}
            if capacity and (int(capacity[CORE]), _mib(capacity[MEMORY])) == target:
                with self.lock:
                    self.report.latencies_ms[kind].append((time.monotonic() - start) * 1000)
                self._count(kind)
                return
            refusal = _refusal(status)
            # A refusal about an older request (re-decided when its card changed) is not ours:
            # the card and use refusals name the size they refuse.
            asked = f"{target[0]}% cores, {target[1]} MiB"
            if refusal is not None and refusal != before and (
                    refusal[0] not in ("NoRoomOnCard", "ShrinkBlocked") or asked in refusal[1]):
                self._count(f"{kind} refused ({refusal[0]})")
                return
            time.sleep(0.05)
        self._count(f"{kind} unanswered in {ANSWER_S:g} s")

    def _whole(self, claim: dict[str, Any], *, grow: bool) -> None:
        """One more whole card for a whole-card claim: the controller must refuse it (WholeCardResize)."""
        if not grow:
            return  # one card is the fewest
        namespace, name = claim["metadata"]["namespace"], claim["metadata"]["name"]
        before = _refusal(claim.get("status") or {})
        cards = int(claim["spec"]["resources"]["requests"][names.RESOURCE_NVIDIA_GPU])
        try:
            self.kube.patch_claim(namespace, name, {"spec": {"resources": {"requests": {
                names.RESOURCE_NVIDIA_GPU: cards + 1}}}})
        except Exception as err:
            self._count(f"whole-card resize patch refused ({type(err).__name__})")
            return
        deadline = time.monotonic() + ANSWER_S
        while time.monotonic() < deadline:
            refusal = _refusal(self.kube.get_claim(namespace, name).get("status") or {})
            if refusal is not None and refusal != before:
                self._count(f"whole-card resize refused ({refusal[0]})")
                return
            time.sleep(0.05)
        self._count(f"whole-card resize unanswered in {ANSWER_S:g} s")

    def run(self, index: int, until: float) -> None:
        rng = random.Random(self.seed * 1000 + index)
        while time.monotonic() < until:
            with self.lock:
                size = len(self.pool)
            # Keep the population around 40 claims: creates win below it, deletes above it.
            weights = [3 if size < 40 else 0.5, 1 if size > 20 else 0.2, 4, 3]
            op = rng.choices(["create", "delete", "expand", "shrink"], weights)[0]
            try:
                if op == "create":
                    self.create(rng)
                elif op == "delete":
                    self.delete(rng)
                else:
                    self.resize(rng, grow=op == "expand")
            except Exception as err:  # one failed call must not end the run; it is counted
                self._count(f"{op} error ({type(err).__name__})")
                time.sleep(0.05)


def _refusal(status: dict[str, Any]) -> tuple[str, str] | None:
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Resizing" and condition.get("status") == "False" and (
                condition.get("reason") in REFUSALS):
            return str(condition["reason"]), str(condition.get("message"))
    return None


def _wait_bound(kube: Any, namespaces: list[str], *, deadline_s: float) -> None:
    """Until no claim of the run is unbound (Bound, or Pending with a reason); fails after `deadline_s`."""
    deadline = time.monotonic() + deadline_s
    while True:
        claims = [c for ns in namespaces for c in kube.list_claims(ns)]
        if all((c.get("status") or {}).get("phase") == "Bound" or (c.get("status") or {}).get("conditions")
               for c in claims):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"elastic stress: the first claims are not bound after {deadline_s:.0f} s")
        time.sleep(0.2)


def wait_quiet(kube: Any, namespaces: list[str], gpu_names: list[str], *, quiet_s: float, deadline_s: float) -> None:
    """Until no claim, ElasticGPU or GPU of the run changed for `quiet_s`; fails after `deadline_s`."""
    start = time.monotonic()
    last: Any = None
    since = start
    while True:
        signature = (
            tuple(sorted((c["metadata"]["namespace"], c["metadata"]["name"], c["metadata"]["resourceVersion"])
                         for ns in namespaces for c in kube.list_claims(ns))),
            tuple(sorted((e["metadata"]["name"], e["metadata"]["resourceVersion"]) for e in kube.list_elastic_gpus()
                         if (e["spec"].get("claimRef") or {}).get("namespace") in namespaces)),
            tuple(kube.get_gpu(g)["metadata"]["resourceVersion"] for g in gpu_names),
        )
        now = time.monotonic()
        if signature != last:
            last, since = signature, now
        elif now - since >= quiet_s:
            return
        if now - start > deadline_s:
            raise AssertionError(f"elastic stress: objects still changing after {deadline_s:.0f} s")
        time.sleep(0.5)


def check(kube: Any, namespaces: list[str], gpu_names: list[str], report: Report) -> None:
    """The three figures, from the API objects alone."""
    gpus = {g: kube.get_gpu(g) for g in gpu_names}
    egpus = {e["metadata"]["name"]: e for e in kube.list_elastic_gpus()}
    claims = [c for ns in namespaces for c in kube.list_claims(ns)]
    held: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for gpu_name, gpu in gpus.items():
        allocations = (gpu.get("status") or {}).get("allocations") or []
        cores = sum(a["cores"] for a in allocations)
        memory = sum(a["memory"] for a in allocations)
        exclusive = any(a.get("exclusive") for a in allocations)
        if cores > names.CORES_PER_CARD or memory > gpu["spec"]["memory"] or (exclusive and len(allocations) > 1):
            report.oversubscribed.append(f"GPU {gpu_name}: {cores} cores, {memory} MiB, {len(allocations)}"
                                         f" reservations{' with a whole card' if exclusive else ''}")
        for allocation in allocations:
            held.setdefault(allocation["elasticGPU"], []).append((gpu_name, allocation))
    # Leaks: both ways between the reservations and the Bound claims.
    serving: set[str] = set()
    for claim in claims:
        status = claim.get("status") or {}
        report.phases[str(status.get("phase"))] += 1
        if status.get("phase") != "Bound":
            continue
        who = f"claim {claim['metadata']['namespace']}/{claim['metadata']['name']}"
        egpu_name = claim["spec"].get("elasticGPUName")
        egpu = egpus.get(egpu_name or "")
        if egpu is None or (egpu["spec"].get("claimRef") or {}).get("uid") != claim["metadata"]["uid"]:
            report.leaked.append(f"{who}: Bound to ElasticGPU {egpu_name}, which does not point back to it")
            continue
        serving.add(egpu_name)
        parts = held.get(egpu_name, [])
        cards = int((status.get("capacity") or {}).get(names.RESOURCE_NVIDIA_GPU, 0))
        if len(parts) != max(1, cards) or any(bool(a.get("exclusive")) != bool(cards) for _g, a in parts):
            report.leaked.append(f"{who}: {len(parts)} reservations for ElasticGPU {egpu_name}"
                                 f" ({cards or 'a share, not'} whole cards in status.capacity)")
            continue
        capacity = status.get("capacity") or {}
        shown = (int(capacity.get(CORE, -1)), _mib(capacity[MEMORY]) if MEMORY in capacity else -1)
        reserved = (sum(a["cores"] for _g, a in parts), sum(a["memory"] for _g, a in parts))
        if shown != reserved:
            report.leaked.append(f"{who}: status.capacity {shown} is not its reservation {reserved}")
    for key, parts in held.items():
        if key not in serving:
            egpu = egpus.get(key)
            phase = ((egpu or {}).get("status") or {}).get("phase", "missing")
            report.leaked.append(f"reservation of ElasticGPU {key} ({phase}) on {[g for g, _ in parts]}"
                                 " serves no Bound claim")
    # Quotas: use recomputed from the reservations of each namespace.
    used: Counter[tuple[str, str | None, str]] = Counter()
    for key, parts in held.items():
        egpu = egpus.get(key)
        if egpu is None:
            continue
        namespace = (egpu["spec"].get("claimRef") or {}).get("namespace")
        class_name = egpu["spec"].get("elasticGPUClassName")
        for gpu_name, allocation in parts:
            whole = bool(allocation.get("exclusive"))
            amount = {CORE: names.CORES_PER_CARD if whole else allocation["cores"],
                      MEMORY: gpus[gpu_name]["spec"]["memory"] if whole else allocation["memory"],
                      names.RESOURCE_NVIDIA_GPU: 1 if whole else 0}
            for resource, value in amount.items():
                used[(namespace, None, resource)] += value
                if class_name:  # a classless reservation counts for the namespace alone
                    used[(namespace, class_name, resource)] += value
    for namespace in namespaces:
        for quota in kube.list_quotas(namespace):
            for (class_name, resource), hard in parse_hard(quota["spec"]["hard"]).items():
                use = used[(namespace, class_name, resource)]
                if use > hard:
                    report.quota_exceeded.append(f"ElasticGPUQuota {namespace}/{quota['metadata']['name']}:"
                                                 f" {quota_key(class_name, resource)} used {use} > hard {hard}")


def stress(kubeconfig: Path, *, seconds: float, threads: int = 8, log_dir: Path, prefix: str,
           seed: int = 17) -> Report:
    """Set up, run the threads for `seconds` against two controller processes, wait for quiet,
    check; cleans up what it created. `prefix` names every object (unique per run)."""
    from kubernetes import client, config

    from elasticgpu.controller.edge.kube import KubeApi
    from tests.binding.processes import ControllerProcesses

    api = config.new_client_from_config(config_file=str(kubeconfig))
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    kube = KubeApi.from_kubeconfig(str(kubeconfig))
    namespaces = [f"{prefix}-a", f"{prefix}-b", f"{prefix}-c"]
    gpu_names = [f"gpu-{prefix}-{i}" for i in range(GPUS)]
    class_name, whole_class = f"{prefix}-elastic", f"{prefix}-whole"
    model = f"STRESS-{prefix}".upper()
    report = Report(seconds=seconds)
    procs = ControllerProcesses(kubeconfig, None, log_dir)
    try:
        for ns in namespaces:
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        for i, gpu_name in enumerate(gpu_names):
            kube.create_gpu({"apiVersion": names.API_VERSION, "kind": names.KIND_GPU, "metadata": {"name": gpu_name},
                             "spec": {"index": i % 8, "uuid": gpu_name.upper(), "model": model, "memory": CARD_MIB,
                                      "nodeName": f"{prefix}-node-{i // 8}"}})
        kube.create_class({"apiVersion": names.API_VERSION, "kind": names.KIND_CLASS, "metadata": {"name": class_name},
                           "provisioner": names.PROVISIONER_GPUSHARE, "parameters": {"gpuModel": model},
                           "allowClaimResize": True})
        kube.create_class({"apiVersion": names.API_VERSION, "kind": names.KIND_CLASS, "metadata": {"name": whole_class},
                           "provisioner": names.PROVISIONER_PHYSICAL, "parameters": {"gpuModel": model},
                           "allowClaimResize": True})
        # Namespace a: namespace-wide limits; b: a per-class limit; c: none (the cards limit it).
        for ns, hard in ((namespaces[0], {CORE: 300, MEMORY: "150Gi", names.RESOURCE_NVIDIA_GPU: 1}),
                         (namespaces[1], {f"{class_name}.{CORE}": 250})):
            custom.create_namespaced_custom_object(names.GROUP, names.VERSION, ns, names.PLURAL_QUOTA, {
                "apiVersion": names.API_VERSION, "kind": names.KIND_QUOTA, "metadata": {"name": "team"},
                "spec": {"hard": hard}})
        procs.start()
        procs.start()
        workers = Workers(kube, namespaces, (class_name, whole_class), report, seed)
        # A first population, bound before the clock starts: the threads resize from the first second.
        rng = random.Random(seed)
        for _ in range(30):
            workers.create(rng)
        _wait_bound(kube, namespaces, deadline_s=120.0)
        until = time.monotonic() + seconds
        pool = [threading.Thread(target=workers.run, args=(i, until), daemon=True) for i in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join(timeout=seconds + ANSWER_S + 60)
        wait_quiet(kube, namespaces, gpu_names, quiet_s=5.0, deadline_s=180.0)
        check(kube, namespaces, gpu_names, report)
    finally:
        procs.close()
        _cleanup(kube, core, namespaces, gpu_names, [class_name, whole_class])
        kube.close()
        api.close()
    return report


def _cleanup(kube: Any, core: Any, namespaces: list[str], gpu_names: list[str], classes: list[str]) -> None:
    """Remove what the run made (finalizers first: no controller runs any more)."""
    for ns in namespaces:
        for claim in _quiet(kube.list_claims, ns) or []:
            _quiet(kube.patch_claim, ns, claim["metadata"]["name"], {"metadata": {"finalizers": []}})
            _quiet(kube.delete_claim, ns, claim["metadata"]["name"])
    for egpu in _quiet(kube.list_elastic_gpus) or []:
        if (egpu["spec"].get("claimRef") or {}).get("namespace") in namespaces:
            _quiet(kube.patch_elastic_gpu, egpu["metadata"]["name"], {"metadata": {"finalizers": []}})
            _quiet(kube.delete_elastic_gpu, egpu["metadata"]["name"])
    for gpu_name in gpu_names:
        _quiet(kube.delete_gpu, gpu_name)
    for class_name in classes:
        _quiet(kube.delete_class, class_name)
    for ns in namespaces:
        _quiet(core.delete_namespace, ns)


def _quiet(call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except Exception:  # cleanup is best effort: the server is thrown away after the bench anyway
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seed", type=int, default=17)
    args = parser.parse_args()
    out = REPO / "bench" / "out" / "elastic-stress"
    out.mkdir(parents=True, exist_ok=True)

    sys.path.insert(0, str(REPO / "bench"))
    from crd_server import test_server_with_crds

    with test_server_with_crds() as (cluster, api):
        api.close()
        report = stress(cluster.kubeconfig, seconds=args.seconds, threads=args.threads, log_dir=out,
                        prefix="stress", seed=args.seed)
    report.print()
    if report.oversubscribed or report.quota_exceeded or report.leaked:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
