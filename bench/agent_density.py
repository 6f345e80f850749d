"""The agent at its density (issue 49 item 4): a card carrying 64 reservations, and a node with
hundreds of claimed containers.

  status   the size of a GPU object's status with 1..64 reservations (each slice claim's
           reservation as the controller writes it: ElasticGPU, claimRef with uid, cores, memory,
           reservedAt), and what one status write costs at that size on the real local API server
           (PUT gpus/status with a resourceVersion precondition, as the controller commits):
           milliseconds per write (p50/p99) and the server's CPU per write;
  creates  CreateContainer through NRI on the test containerd 1.7 with the agent's NRI side as
           its own process (as bench/nri_hook.py): `--containers` pods, each with its own Bound
           slice claim, created one after the other and kept (the agent's view, ledger and the
           runtime fill up as on a dense node); p50/p99 of the first and the last tenth.

The test node of tests/agent/cri/node.py has two stand-in cards, so the slices are spread over
those two (the agent's per-create work reads the claim's own cards and the view's claims, not
the other cards of the node).

    python bench/agent_density.py                        # both, 512 containers
    python bench/agent_density.py --only status          # no containerd needed
    python bench/agent_density.py --containers 64 --only creates
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


def create_figures(containers: int) -> dict[str, Any]:
    import grpc
    from nri_hook import start, stop

    from elasticgpu.agent.cri import api
    from tests.agent.cri.node import CARDS, View, publish_cards, slice_claim
    from tests.agent.nri.conftest import plugin_binary
    from tests.containerd_runtime import container_config, running_containerd, sandbox_config

    pb = api.pb
    plugin = plugin_binary()
    with contextlib.ExitStack() as stack:
        runtime = stack.enter_context(running_containerd(nri=True))
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="egdense-", dir="/tmp")))
        assert runtime.nri_socket is not None
        publish_cards(runtime.cdi_dir, runtime.directory / "dev")
        view = View()
        for i in range(containers):
            view.add(replace(slice_claim("dense", f"slice-{i:03d}", user=f"pod-{i:03d}"),
                             gpus=(CARDS[i % len(CARDS)].uuid,), cores=1, memory_mib=1280))
        (tmp / "view.json").write_text(view.to_json())
        direct = api.services.RuntimeServiceStub(stack.enter_context(grpc.insecure_channel(runtime.endpoint)))
        agent = start(["tests.agent.nri.agent_process", str(runtime.nri_socket), str(tmp / "nri-agent.sock"), plugin,
                       f"sqlite:///{tmp}/nri-ledger.db", f"{tmp}/view.json", str(runtime.cdi_dir)], "synchronized")
        stack.callback(stop, agent)
        times = []
        began = time.monotonic()
        for i in range(containers):
            pod = sandbox_config(name=f"pod-{i:03d}", namespace="dense", uid=f"uid-{i}",
                                 annotations={"egpuc.elasticgpu.io/main": f"slice-{i:03d}"})
            pod_id = direct.RunPodSandbox(pb.RunPodSandboxRequest(config=pod), timeout=60).pod_sandbox_id
            request = pb.CreateContainerRequest(pod_sandbox_id=pod_id, sandbox_config=pod,
                                                config=container_config(name="main", image=runtime.image, sandbox=pod))
            at = time.perf_counter_ns()
            direct.CreateContainer(request, timeout=60)
            times.append((time.perf_counter_ns() - at) / 1e6)
        tenth = max(1, containers // 10)
        return {"containers": containers, "cards": len(CARDS), "run_s": round(time.monotonic() - began, 1),
                "p50_ms": round(percentile(times, 0.5), 2), "p99_ms": round(percentile(times, 0.99), 2),
                "first_tenth_p50_ms": round(percentile(times[:tenth], 0.5), 2),
                "last_tenth_p50_ms": round(percentile(times[-tenth:], 0.5), 2),
                "last_tenth_p99_ms": round(percentile(times[-tenth:], 0.99), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--containers", type=int, default=512)
    parser.add_argument("--writes", type=int, default=30, help="status writes per size")
    parser.add_argument("--only", choices=["status", "creates"])
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    if args.only in (None, "status"):
        for row in status_figures([1, 8, 16, 32, 64], args.writes):
            print(json.dumps(row), flush=True)
    if args.only in (None, "creates"):
        print(json.dumps(create_figures(args.containers)), flush=True)


if __name__ == "__main__":
    main()
