"""The cost of one periodic relist, full lists against lists of metadata (issue 49: the relist every
`relist_interval_s` was the largest cost of a fleet at rest).

Fills the local test API server with the bound state the controller's own code writes
(`bench/fleet_controller.py --prebound`'s writers: GPU objects with their reservations, Bound
claims, their ElasticGPUs, `--pods-percent` of the claims pods' inline claims with their pods),
builds a controller in this process from one start-up list (no watches, no worker: nothing
changes), then times `Repair.resync(relist=True)` `--rounds` times each way, alternating:

  full      `ResyncSettings.relist_by_metadata` False: full lists of every kind, as before;
  metadata  lists of metadata, whole objects read only where the picture differs (none here).

For each: wall seconds, this process's CPU seconds (the controller's side: parse and take in),
the API server's and etcd's CPU seconds (/proc/<pid>/stat), and the bytes the answers carried.

    flock /tmp/heavy.lock nice python bench/relist_cost.py --cards 8000 --claims 10000
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from binding import _cpu_s, _server_pids  # noqa: E402
from crd_server import test_server_with_crds  # noqa: E402
from fleet_controller import CLASS, MODEL, NAMESPACE, _prebind_all  # noqa: E402

from elasticgpu.api import names  # noqa: E402
from elasticgpu.controller.edge.kube import KubeApi  # noqa: E402


class MeteredKube(KubeApi):
    """A KubeApi that adds up the bytes of the answers it reads."""

    received = 0

    def _send(self, method: str, path: str, **kwargs: Any) -> tuple[int, bytes]:
        status, data = super()._send(method, path, **kwargs)
        self.received += len(data)
        return status, data


def _self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cards", type=int, default=8000)
    parser.add_argument("--claims", type=int, default=10000)
    parser.add_argument("--pods-percent", type=int, default=80)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="relists timed each way")
    parser.add_argument("--profile", action="store_true", help="a cProfile top-25 of one more relist each way")
    args = parser.parse_args()

    from dataclasses import replace

    from kubernetes import client

    from elasticgpu.controller.process.reconciling import Controller
    from elasticgpu.controller.settings import ControllerSettings

    with test_server_with_crds() as (cluster, api):
        kube = MeteredKube.from_kubeconfig(str(cluster.kubeconfig))
        assert isinstance(kube, MeteredKube)
        client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
        kube.create_class({"apiVersion": names.API_VERSION, "kind": names.KIND_CLASS, "metadata": {"name": CLASS},
                           "provisioner": names.PROVISIONER_GPUSHARE, "parameters": {"gpuModel": MODEL}})
        filled = _prebind_all(cluster.kubeconfig, cards=args.cards, claims=args.claims,
                              pods_percent=args.pods_percent, writers=args.writers, threads=args.threads)
        print(f"filled: {json.dumps(filled)}", flush=True)
        settings = ControllerSettings()
        controllers = {
            "full": Controller(kube, replace(settings, resync=replace(settings.resync, relist_by_metadata=False))),
            "metadata": Controller(kube, replace(settings, resync=replace(settings.resync, relist_by_metadata=True))),
        }
        for controller in controllers.values():
            controller.rebuild(start=True)
        servers = _server_pids()
        figures: dict[str, list[dict[str, float]]] = {mode: [] for mode in controllers}
        for round_ in range(args.rounds):
            for mode, controller in controllers.items():
                received, cpu, server = kube.received, _self_cpu_s(), sum(_cpu_s(pid) for pid in servers)
                began = time.monotonic()
                controller.resync(relist=True)
                figure = {"wall_s": time.monotonic() - began, "controller_cpu_s": _self_cpu_s() - cpu,
                          "server_cpu_s": sum(_cpu_s(pid) for pid in servers) - server,
                          "mib": (kube.received - received) / 2**20}
                figures[mode].append(figure)
                if mode == "metadata":
                    print(f"  {controller.repair.metadata_relist.last}", flush=True)
                print(f"round {round_ + 1} {mode}: " + ", ".join(f"{k} {v:.2f}" for k, v in figure.items()),
                      flush=True)
        medians = {mode: {k: statistics.median(f[k] for f in runs) for k in runs[0]} for mode, runs in figures.items()}
        for mode, median in medians.items():
            print(f"median {mode}: " + ", ".join(f"{k} {v:.2f}" for k, v in median.items()))
        if args.profile:
            for mode, controller in controllers.items():
                profile = cProfile.Profile(time.process_time)  # CPU, not wall: the machine is shared
                profile.runcall(controller.resync, relist=True)
                print(f"profile {mode}:")
                pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        full, meta = medians["full"], medians["metadata"]
        print("metadata / full: " + ", ".join(f"{k} {meta[k] / full[k]:.3f}" for k in full if full[k]))
        print(f"load average: {os.getloadavg()}")
        kube.close()


if __name__ == "__main__":
    main()
