"""Benchmark of the node agent: CPU, RSS and API writes per minute in steady state.

    .venv/bin/python tests/agent/bench_agent.py [--cards 8] [--claims 40] [--seconds 60]

Starts the local test API server, a Node, claims, and `elasticgpu agent run` with the simulated
backend (cards in YAML, one real `sleep` process per claim in its own cgroup v2 with a containerd
path, memory and SM use of every process changing every second through the inject directory) and
the ledger rows the CRI hook would have written. Samples usage at 1 Hz. After a warm-up
(initial publication and first writes) it measures for `--seconds`: the agent's CPU (utime +
stime from /proc, in millicores), its peak RSS, and API writes from its own /metrics.
Targets (issue 10): under 50 millicores and 100 MiB (DCGM exporter asks 200m / 512Mi).
Needs root (cgroups); not a pytest test (the name does not start with test_).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from kubernetes import client, config  # noqa: E402

from elasticgpu.agent.discovery import simulated  # noqa: E402
from elasticgpu.agent.ledger.store import LedgerStore  # noqa: E402
from elasticgpu.api import names  # noqa: E402
from tests.agent.conftest import free_port, scrape  # noqa: E402
from tests.conftest import crd_documents  # noqa: E402
from tests.kube_cluster import kube_request, running_cluster, server_side_apply, wait_established  # noqa: E402

CGROUP_ROOT = Path("/sys/fs/cgroup/unified")
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def api_writes(port: int) -> dict[str, float]:
    return {dict(labels)["write"]: value for (name, labels), value in scrape(port).items()
            if name == "elasticgpu_agent_api_writes_total"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cards", type=int, default=8)
    parser.add_argument("--claims", type=int, default=40)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--malloc-arena-max", type=int, default=0,
                        help="MALLOC_ARENA_MAX for the agent (glibc; a DaemonSet can set it), 0: glibc's default")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="egpu-bench-agent-"))
    tag = uuid.uuid4().hex[:8]
    cgroups: list[Path] = []
    sleepers: list[subprocess.Popen[bytes]] = []
    agent: subprocess.Popen[bytes] | None = None
    with running_cluster() as cluster:
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        crds = crd_documents()
        for doc in crds:
            server_side_apply(api, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{doc['metadata']['name']}",
                              doc)
        wait_established(api, [doc["metadata"]["name"] for doc in crds])
        time.sleep(2)
        node = f"bench-node-{tag}"
        namespace = f"bench-{tag}"
        core = client.CoreV1Api(api)
        core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=node)))
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
        claims_path = f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{namespace}/{names.PLURAL_CLAIM}"
        rng = random.Random(1)
        processes: list[tuple[int, int, int]] = []  # card, pid, base memory
        ledger_url = f"sqlite:///{work / 'ledger.db'}"
        ledger = LedgerStore.open(ledger_url)
        try:
            for i in range(args.claims):
                name = f"claim-{i}"
                body = {"apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM,
                        "metadata": {"name": name, "namespace": namespace},
                        "spec": {"resources": {"requests": {names.RESOURCE_CORE: 20, names.RESOURCE_MEMORY: "8Gi"}}}}
                answer = kube_request(api, "POST", claims_path, body=body)
                assert answer.status == 201, answer.body
                container = uuid.uuid4().hex * 2
                cgroup = CGROUP_ROOT / f"egpu-bench-{tag}" / f"cri-containerd-{container}.scope"
                cgroup.mkdir(parents=True)
                cgroups.append(cgroup)
                sleeper = subprocess.Popen(["sleep", "3600"])
                sleepers.append(sleeper)
                (cgroup / "cgroup.procs").write_text(str(sleeper.pid))
                card = i % args.cards
                row = ledger.record_started(
                    pod_uid=str(uuid.uuid4()), pod_namespace=namespace, pod_name=f"pod-{i}", container_name="main",
                    claim_namespace=namespace, claim_name=name, elastic_gpu=f"egpu-{i}",
                    gpu_uuids=[simulated.simulated_uuid(node, card)], cores=20, memory_mib=8192)
                ledger.mark_created(row, container)
                processes.append((card, sleeper.pid, rng.randint(2048, 6144)))
        finally:
            ledger.close()
        description = {"cards": [{"model": "NVIDIA A100-SXM4-80GB", "memory": "80Gi", "numa": 0,
                                  "count": args.cards}]}
        (work / "sim.yaml").write_text(json.dumps(description))  # JSON is YAML
        stop = threading.Event()

        def drive() -> None:
            # Once a second, what the driver would report: memory wanders by less than the write threshold,
            # SM use by anything: the steady state of busy claims.
            while not stop.wait(1.0):
                simulated.inject(work / "inject", [
                    {"process": {"card": card, "pid": pid, "memory": base + rng.randint(-200, 200),
                                 "sm": rng.randint(0, 20)}} for card, pid, base in processes])

        driver = threading.Thread(target=drive, daemon=True)
        driver.start()
        port = free_port()
        environment = dict(os.environ)
        if args.malloc_arena_max:
            environment["MALLOC_ARENA_MAX"] = str(args.malloc_arena_max)
        with (work / "agent.log").open("w") as log:
            agent = subprocess.Popen(
                [sys.executable, "-m", "elasticgpu.agent", "run", "--backend", "simulated",
                 "--simulation", str(work / "sim.yaml"), "--device-dir", str(work / "dev"), "--node-name", node,
                 "--inject-dir", str(work / "inject"),
                 "--kubeconfig", str(cluster.kubeconfig), "--ledger-url", ledger_url, "--sample-interval-s", "1",
                 "--metrics-port", str(port), "--metrics-address", "127.0.0.1",
                 "--cri-proxy", "false"],  # inventory, usage and health; the proxy is measured by bench/cri_proxy.py
                stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                env=environment)
        try:
            time.sleep(args.warmup)
            assert agent.poll() is None, (work / "agent.log").read_text()
            cpu0, writes0, t0 = cpu_seconds(agent.pid), api_writes(port), time.monotonic()
            after_warmup = peak = rss_mib(agent.pid)
            while time.monotonic() - t0 < args.seconds:
                peak = max(peak, rss_mib(agent.pid))
                time.sleep(1)
            cpu1, writes1, t1 = cpu_seconds(agent.pid), api_writes(port), time.monotonic()
            peak = max(peak, rss_mib(agent.pid))
            minutes = (t1 - t0) / 60
            per_minute = {k: (writes1.get(k, 0) - writes0.get(k, 0)) / minutes for k in sorted(writes1)}
            print(f"agent, {args.cards} simulated cards, {args.claims} claims with real processes in cgroups,"
                  f" usage sampled at 1 Hz, measured {t1 - t0:.0f} s after {args.warmup} s of warm-up:")
            print(f"  CPU  {1000 * (cpu1 - cpu0) / (t1 - t0):.1f} millicores (target < 50; DCGM exporter asks 200)")
            print(f"  RSS  {peak:.1f} MiB peak, {after_warmup:.1f} after the warm-up (target < 100; DCGM exporter"
                  f" asks 512){f'; MALLOC_ARENA_MAX={args.malloc_arena_max}' if args.malloc_arena_max else ''}")
            print(f"  API writes per minute in steady state: {sum(per_minute.values()):.1f}"
                  f" ({', '.join(f'{k} {v:.1f}' for k, v in per_minute.items())})")
        finally:
            stop.set()
            agent.terminate()
            agent.wait(timeout=30)
            for sleeper in sleepers:
                sleeper.kill()
                sleeper.wait()
            time.sleep(0.5)
            for cgroup in cgroups:
                cgroup.rmdir()
            if cgroups:
                cgroups[0].parent.rmdir()


if __name__ == "__main__":
    main()
