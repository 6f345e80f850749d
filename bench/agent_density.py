"""The agent at its density (issue 49 item 4): a card carrying 64 reservations, and a node with
hundreds of claimed containers.

  status   the size of a GPU object's status with 1..64 reservations (each slice claim's
           reservation as the controller writes it: ElasticGPU, claimRef with uid, cores, memory,
           reservedAt), and what one status write costs at that size on the real local API server
           (PUT gpus/status with a resourceVersion precondition, as the controller commits):
           milliseconds per write (p50/p99) and the server's CPU per write;
  creates  CreateContainer through NRI on the test containerd 1.7 with the agent's NRI side as
           its own process (as bench/nri_hook.py): `--containers` pods, each with its own Bound
           slice claim of 1% of the cores, spread evenly over the node's `--cards` simulated
           cards (default 8: 512 containers are 64 slices a card), created one after the other
           and kept (the agent's view, ledger and the runtime fill up as on a dense node);
           p50/p99 of all, of the first and of the last tenth.

  usage    the agent's usage pass (`agent/usage.py` `UsageLoop.sample_once`: the processes on the
           cards, each attributed to its container through procfs and to its claim through the
           ledger, every sample recorded in the ledger, the claims' usage written when due) at
           `--containers` claimed containers on one node of `--cards` simulated cards, one GPU process
           each: CPU seconds per pass, while the first writes go out (20 claim writes a pass at
           most) and in the steady state (usage unchanged: nothing due). The agent's own code
           on a real SQLite ledger and the real local API server (the claims exist there); the
           processes are the simulated backend's and a procfs written for them (their cgroups
           name the containers the ledger holds).

The node's cards are the product's simulated backend's (`agent run --backend simulated`): its
stand-in device nodes, and for `creates` the CDI spec the agent's supervisor writes from them.

    python bench/agent_density.py                        # all three, 512 containers on 8 cards
    python bench/agent_density.py --only status          # no containerd needed
    python bench/agent_density.py --containers 64 --only creates
    python bench/agent_density.py --only usage           # no containerd needed
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from percentiles import percentile  # noqa: E402

from elasticgpu.api import names, timestamps  # noqa: E402


def _allocation(index: int) -> dict[str, Any]:
    uid = f"{index:08d}-7c1e-4b8e-9d1a-2f5c8e0b{index:04d}"
    return {"elasticGPU": f"egpu-{uid}", "claimRef": {"namespace": "team-research", "name": f"notebook-{index:03d}",
                                                      "uid": uid},
            "cores": 1, "memory": 1280, "reservedAt": timestamps.format_epoch(1_800_000_000 + index)}


def status_figures(counts: list[int], writes: int) -> list[dict[str, Any]]:
    from binding import _cpu_s, _server_pids
    from crd_server import test_server_with_crds

    from elasticgpu.controller.edge.kube import KubeApi

    rows = []
    with test_server_with_crds() as (cluster, _api):
        kube = KubeApi.from_kubeconfig(str(cluster.kubeconfig))
        name = "gpu-density-0"
        kube.create_gpu({"apiVersion": names.API_VERSION, "kind": names.KIND_GPU, "metadata": {"name": name},
                         "spec": {"index": 0, "uuid": name.upper(), "model": "DENSE", "memory": 81920,
                                  "nodeName": "dense-node"}})
        servers = _server_pids()
        for count in counts:
            times = []
            cpu = sum(_cpu_s(p) for p in servers)
            for turn in range(writes):
                body = kube.get_gpu(name)
                allocations = [_allocation(i) for i in range(count)]
                allocations[-1]["cores"] = 1 + turn % 2  # a change each time, as a commit makes
                body["status"] = {**(body.get("status") or {}), "allocations": allocations}
                began = time.perf_counter()
                kube.replace_gpu_status(body)
                times.append((time.perf_counter() - began) * 1000)
            server_ms = (sum(_cpu_s(p) for p in servers) - cpu) * 1000 / writes
            stored = kube.get_gpu(name)
            rows.append({"reservations": count,
                         "status_bytes": len(json.dumps(stored["status"], separators=(",", ":"))),
                         "object_bytes": len(json.dumps(stored, separators=(",", ":"))),
                         "write_p50_ms": round(percentile(times, 0.5), 1),
                         "write_p99_ms": round(percentile(times, 0.99), 1),
                         "server_cpu_ms_per_write": round(server_ms, 1)})
        kube.close()
    return rows


def _simulation_file(path: Path, cards: int) -> None:
    """The simulated backend's description of a node of `cards` A100s of 80 GiB (`agent run --simulation`)."""
    import yaml

    path.write_text(yaml.safe_dump({
        "driver": {"version": "550.54.15", "cuda": "12.4"},
        "cards": [{"model": "NVIDIA A100-SXM4-80GB", "memory": "80Gi", "numa": 0, "links": [], "count": cards}]}))


def _simulated_node(cards: int, directory: Path) -> tuple[list[Any], list[str]]:
    """`cards` simulated A100s (80 GiB) of the test node from the product's simulated backend, made
    as an agent on a GPU-less node makes them: their stand-in device nodes under `directory`; returns
    discovery's cards and the control devices' paths (the CDI spec's inputs)."""
    from elasticgpu.agent import discovery
    from tests.agent.cri.node import NODE

    _simulation_file(directory / "sim.yaml", cards)
    backend = discovery.open_backend("simulated", node_name=NODE, simulation_file=directory / "sim.yaml",
                                     device_dir=directory / "devices")
    try:
        return list(backend.snapshot().cards), backend.control_device_paths()
    finally:
        backend.close()


def create_figures(containers: int, cards: int) -> dict[str, Any]:
    import grpc
    from nri_hook import start, stop

    from elasticgpu.agent.cri import api
    from elasticgpu.agent.injecting import cdi
    from elasticgpu.agent.injecting.injection import CardInfo
    from tests.agent.cri.node import View, slice_claim
    from tests.agent.nri.conftest import plugin_binary
    from tests.containerd_runtime import container_config, running_containerd, sandbox_config

    pb = api.pb
    # 1% of the cores each (the smallest slice): at most 100 slices a card; the memory split to fit them all.
    per_card = -(-containers // cards)
    if per_card > 100:
        raise SystemExit(f"--containers {containers} --cards {cards}: {per_card} slices a card; a card holds at most"
                         f" 100 slices of 1% of the cores: give --cards {-(-containers // 100)} or more")
    plugin = plugin_binary()
    with contextlib.ExitStack() as stack:
        runtime = stack.enter_context(running_containerd(nri=True))
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="egdense-", dir="/tmp")))
        assert runtime.nri_socket is not None
        node_cards, control = _simulated_node(cards, tmp)
        # The CDI spec of the node's cards, as the agent's supervisor writes it from discovery.
        cdi.write_spec(runtime.cdi_dir, cdi.card_devices(node_cards), cdi.control_nodes(control))
        view = View()
        view.cards = {c.uuid.lower(): CardInfo(uuid=c.uuid, index=c.index, memory_mib=c.memory_mib)
                      for c in node_cards}
        memory_mib = min(1280, min(c.memory_mib for c in node_cards) // per_card)
        for i in range(containers):
            view.add(replace(slice_claim("dense", f"slice-{i:03d}", user=f"pod-{i:03d}"),
                             gpus=(node_cards[i % cards].uuid,), cores=1, memory_mib=memory_mib))
        (tmp / "view.json").write_text(view.to_json())
        direct = api.services.RuntimeServiceStub(stack.enter_context(grpc.insecure_channel(runtime.endpoint)))
        agent = start(["tests.agent.nri.agent_process", str(runtime.nri_socket), str(tmp / "nri-agent.sock"), plugin,
                       f"sqlite:///{tmp}/nri-ledger.db", f"{tmp}/view.json", str(runtime.cdi_dir)], "synchronized")
        stack.callback(stop, agent)
        times: list[float] = []
        created: list[str] = []
        began = time.monotonic()
        for i in range(containers):
            pod = sandbox_config(name=f"pod-{i:03d}", namespace="dense", uid=f"uid-{i}",
                                 annotations={"egpuc.elasticgpu.io/main": f"slice-{i:03d}"})
            pod_id = direct.RunPodSandbox(pb.RunPodSandboxRequest(config=pod), timeout=60).pod_sandbox_id
            request = pb.CreateContainerRequest(pod_sandbox_id=pod_id, sandbox_config=pod,
                                                config=container_config(name="main", image=runtime.image, sandbox=pod))
            at = time.perf_counter_ns()
            created.append(direct.CreateContainer(request, timeout=60).container_id)
            times.append((time.perf_counter_ns() - at) / 1e6)
        run_s = time.monotonic() - began
        # Every container must hold its own claim's card and no other (a create the agent did not
        # inject would be timed as a plain one): the card device nodes of each runtime spec.
        card_nodes = {f"/dev/nvidia{c.minor}" for c in node_cards}
        injected = 0
        for i, container_id in enumerate(created):
            status = direct.ContainerStatus(pb.ContainerStatusRequest(container_id=container_id, verbose=True),
                                            timeout=60)
            spec = json.loads(status.info["info"])["runtimeSpec"]
            held = {d["path"] for d in spec.get("linux", {}).get("devices") or []} & card_nodes
            injected += held == {f"/dev/nvidia{node_cards[i % cards].minor}"}
        tenth = max(1, containers // 10)
        return {"containers": containers, "cards": cards, "slices_per_card": per_card, "memory_mib": memory_mib,
                "run_s": round(run_s, 1), "injected": injected,
                "p50_ms": round(percentile(times, 0.5), 2), "p99_ms": round(percentile(times, 0.99), 2),
                "first_tenth_p50_ms": round(percentile(times[:tenth], 0.5), 2),
                "first_tenth_p99_ms": round(percentile(times[:tenth], 0.99), 2),
                "last_tenth_p50_ms": round(percentile(times[-tenth:], 0.5), 2),
                "last_tenth_p99_ms": round(percentile(times[-tenth:], 0.99), 2)}


def usage_figures(containers: int, passes: int, cards: int) -> dict[str, Any]:
    from concurrent.futures import ThreadPoolExecutor

    from crd_server import test_server_with_crds
    from kubernetes import client

    from elasticgpu.agent import discovery, kube, usage
    from elasticgpu.agent.discovery import simulated
    from elasticgpu.agent.ledger import store
    from elasticgpu.agent.settings import LedgerSettings, UsageSettings
    from elasticgpu.controller.edge.kube import KubeApi

    node, namespace = "dense-node", "dense"
    with test_server_with_crds() as (cluster, api), tempfile.TemporaryDirectory(prefix="egusage-") as directory:
        tmp = Path(directory)
        client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
        writer = KubeApi.from_kubeconfig(str(cluster.kubeconfig))
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: writer.create_claim({
                "apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM,
                "metadata": {"name": f"slice-{i:03d}", "namespace": namespace},
                "spec": {"resources": {"requests": {names.RESOURCE_CORE: 1, names.RESOURCE_MEMORY: "1280Mi"}}}}),
                range(containers)))
        writer.close()
        _simulation_file(tmp / "sim.yaml", cards)
        backend = discovery.open_backend("simulated", node_name=node, simulation_file=tmp / "sim.yaml",
                                         device_dir=tmp / "devices", inject_dir=tmp / "inject")
        ledger = store.LedgerStore.open(f"sqlite:///{tmp / 'ledger.db'}")
        clock = [1_800_000_000.0]
        loop = usage.UsageLoop(backend=backend, ledger=ledger,
                               kube=kube.AgentKube(api, node_name=node, field_manager="elasticgpu-agent"),
                               inventory=None, settings=UsageSettings(proc_root=str(tmp / "proc")),
                               ledger_settings=LedgerSettings(), clock=lambda: clock[0])
        entries = []
        for i in range(containers):
            pod, container, pid = f"{i:08d}-0000-4000-8000-{i:012d}", f"{i:064x}", 10_000 + i
            card = simulated.simulated_uuid(node, i % cards)
            row = ledger.record_started(pod_uid=pod, pod_namespace=namespace, pod_name=f"pod-{i:03d}",
                                        container_name="main", claim_namespace=namespace, claim_name=f"slice-{i:03d}",
                                        elastic_gpu=f"egpu-{i:03d}", gpu_uuids=[card], cores=1, memory_mib=1280)
            ledger.mark_created(row, container)
            folder = tmp / "proc" / str(pid)
            folder.mkdir(parents=True)
            (folder / "stat").write_text(f"{pid} (python3) S 1 {' '.join(['0'] * 17)} {1000 + i} 0 0\n")
            (folder / "cgroup").write_text(f"0::/kubepods/besteffort/pod{pod}/{container}\n")
            entries.append({"process": {"card": i % cards, "pid": pid, "memory": 1000, "sm": 1}})
        simulated.inject(tmp / "inject", entries)
        writing: list[float] = []
        steady: list[float] = []
        try:
            for _ in range(passes):
                writes = loop.claim_writes
                cpu = time.process_time()
                loop.sample_once()
                (writing if loop.claim_writes > writes else steady).append((time.process_time() - cpu) * 1000)
                clock[0] += UsageSettings().sample_interval_s
            attributed = sum(1 for c in loop.claims.values() if c.memory_mib)
        finally:
            ledger.close()
            backend.close()
    return {"containers": containers, "cards": cards, "passes": passes, "claims_attributed": attributed,
            "claim_writes": loop.claim_writes, "unattributed": len(loop.unattributed),
            "writing_passes": len(writing),
            "writing_cpu_ms_p50": round(percentile(writing, 0.5), 1) if writing else None,
            "steady_passes": len(steady), "steady_cpu_ms_p50": round(percentile(steady, 0.5), 1) if steady else None,
            "steady_cpu_ms_max": round(max(steady), 1) if steady else None,
            "sample_interval_s": UsageSettings().sample_interval_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--containers", type=int, default=512)
    parser.add_argument("--writes", type=int, default=30, help="status writes per size")
    parser.add_argument("--only", choices=["status", "creates", "usage"])
    parser.add_argument("--passes", type=int, default=60, help="usage passes")
    parser.add_argument("--cards", type=int, default=8, help="simulated cards of the node (creates, usage)")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    if args.only in (None, "status"):
        for row in status_figures([1, 8, 16, 32, 64], args.writes):
            print(json.dumps(row), flush=True)
    if args.only in (None, "usage"):
        print(json.dumps(usage_figures(args.containers, args.passes, args.cards)), flush=True)
    if args.only in (None, "creates"):
        print(json.dumps(create_figures(args.containers, args.cards)), flush=True)


if __name__ == "__main__":
    main()
