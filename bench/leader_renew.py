"""Why a busy leader renewed its Lease late (issue 49 item 2), measured in one process.

Part 1, the GIL: a watchdog thread asks to wake every 1 ms and records how late it woke, while
the main thread does what the controller does with a 20,000-claim list: parse pages of 500
(orjson) and build each claim's model (pydantic, `compact.share_fields`), as the picture does;
then the same 20,000 claims parsed as one page (what a list without `limit` would cost). The
longest wake-up lateness is the longest the GIL was held in one piece: how long a renewal could
wait for it.

Part 2, the renewal itself, on the real local API server: `--attempts` renewal attempts of each
client, idle and then with the process busy (eight threads with requests in flight on the
binder's client, one parsing the 20,000-claim list over and over), alternating so both see the
same machine:
  old: `KubernetesLeases` on the kubernetes client (urllib3, its default retries), a read and
       a write per renewal (the code before this change);
  new: `TransportLeases` (a connection of its own on the controller's transport), one write of
       the Lease as last written.
Seconds per attempt: median and max.

Part 3, a slow server: a leader with the production periods (lease 10 s, renew deadline 7 s,
retry 2 s) renewing through a relay that holds every answer `--delays` seconds (a loaded
server); whether it kept the Lease for `--hold` seconds, or after how long it lost it. Run it on
the code before this change (`git checkout <old> -- elasticgpu`) for the old figures: that code
has no `leasing` module, and its own `KubernetesLeases.on` is used.

    python bench/leader_renew.py                 # 20,000 claims, 40 attempts each
    python bench/leader_renew.py --claims 2000 --attempts 10 --delays 1.5 --hold 10   # smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import orjson  # noqa: E402
import yaml  # noqa: E402

from elasticgpu.api.claim import ElasticGPUClaim  # noqa: E402
from elasticgpu.controller.picture import compact  # noqa: E402


def _claims(count: int) -> list[dict[str, Any]]:
    return [{"apiVersion": "elasticgpu.io/v1", "kind": "ElasticGPUClaim",
             "metadata": {"name": f"claim-{i:06d}", "namespace": "fleet", "resourceVersion": str(1000 + i),
                          "uid": f"{i:08d}-0000-4000-8000-000000000000", "generation": 1,
                          "creationTimestamp": "2026-12-07T03:00:00Z",
                          "managedFields": [{"manager": "bench", "operation": "Update",
                                             "apiVersion": "elasticgpu.io/v1", "time": "2026-12-07T03:00:00Z",
                                             "fieldsType": "FieldsV1",
                                             "fieldsV1": {"f:spec": {"f:elasticGPUClassName": {}}}}]},
             "spec": {"elasticGPUClassName": "fleet", "resources": {"requests": {"elasticgpu.io/gpu-core": 25,
                                                                                  "elasticgpu.io/gpu-memory": "10Gi"}}},
             "status": {"phase": "Bound"}} for i in range(count)]


def _pages(claims: list[dict[str, Any]], size: int) -> list[bytes]:
    return [orjson.dumps({"kind": "ElasticGPUClaimList", "metadata": {"resourceVersion": "1"},
                          "items": claims[start:start + size]}) for start in range(0, len(claims), size)]


class Watchdog:
    """A thread that sleeps 1 ms at a time and keeps its longest oversleep (the GIL held elsewhere)."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            asked = time.perf_counter()
            time.sleep(0.001)
            self.worst = max(self.worst, time.perf_counter() - asked - 0.001)

    def __enter__(self) -> Watchdog:
        self._thread.start()
        time.sleep(0.05)
        self.worst = 0.0
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _parse(pages: list[bytes], *, models: bool) -> int:
    count = 0
    for page in pages:
        for item in orjson.loads(page)["items"]:
            if models:
                compact.share_fields(ElasticGPUClaim.model_validate(item))
            count += 1
    return count


def part_gil(count: int) -> None:
    claims = _claims(count)
    paged, whole = _pages(claims, 500), _pages(claims, count)
    print(f"part 1: {count:,} claims, {len(paged)} pages of 500 ({sum(map(len, paged)) / 1e6:.1f} MB), one page of "
          f"{len(whole[0]) / 1e6:.1f} MB")
    for label, pages, models in (("idle (watchdog alone)", [], False),
                                 ("pages of 500: orjson + pydantic models", paged, True),
                                 ("pages of 500: orjson only", paged, False),
                                 ("one page of all: orjson only", whole, False)):
        with Watchdog() as dog:
            began = time.perf_counter()
            _parse(pages, models=models) if pages else time.sleep(1.0)
            took = time.perf_counter() - began
        print(f"  {label:42s} {took:6.2f} s   longest GIL hold (watchdog late) {dog.worst * 1000:7.1f} ms")


def _busy(kube: Any, pages: list[bytes], stop: threading.Event) -> list[threading.Thread]:
    def requests() -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):
                kube._call("GET", "/api/v1/namespaces/default", timeout_s=10.0)

    def parsing() -> None:
        while not stop.is_set():
            _parse(pages, models=True)

    threads = [threading.Thread(target=requests, daemon=True) for _ in range(8)]
    threads.append(threading.Thread(target=parsing, daemon=True))
    for thread in threads:
        thread.start()
    return threads


def part_renew(count: int, attempts: int) -> None:
    from crd_server import test_server_with_crds
    from kubernetes import client, config

    from elasticgpu.controller.edge.kube import KubeApi
    from elasticgpu.controller.edge.leader import KubernetesLeases, LeaderElector, LeaderSettings
    from elasticgpu.controller.edge.leasing import TransportLeases

    with test_server_with_crds() as (cluster, _api):
        configuration = client.Configuration()
        config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=configuration)
        # old: the code before (kubernetes client, urllib3's default retries, a read and a write
        # per renewal); new: one write of the Lease as last written, on a connection of its own.
        # Each renews a Lease of its own.
        old = LeaderElector(KubernetesLeases(client.ApiClient(configuration)),
                            LeaderSettings(namespace="default", name="bench-renew-old"), identity="old")
        new = LeaderElector(TransportLeases.on(configuration),
                            LeaderSettings(namespace="default", name="bench-renew-new"), identity="new")
        for elector in (old, new):
            assert elector.try_acquire_or_renew()
        new._set_leading(True)  # its renewals take the leader's path; old's stay a read and a write
        kube = KubeApi(client.ApiClient(configuration))
        pages = _pages(_claims(count), 500)
        print(f"part 2: renewal attempts on the local API server, {attempts} each, alternating; busy = 8 threads "
              f"with requests in flight + 1 parsing {count:,} claims")
        for load in ("idle", "busy"):
            stop = threading.Event()
            threads = _busy(kube, pages, stop) if load == "busy" else []
            took: dict[str, list[float]] = {"old": [], "new": []}
            try:
                for _ in range(attempts):
                    for name, elector in (("old", old), ("new", new)):
                        began = time.perf_counter()
                        assert elector.try_acquire_or_renew(deadline=time.monotonic() + 7.0)
                        took[name].append(time.perf_counter() - began)
                    time.sleep(0.05)
            finally:
                stop.set()
                for thread in threads:
                    thread.join(timeout=20)
            for name, values in took.items():
                print(f"  {load}: {name}: median {statistics.median(values) * 1000:7.1f} ms, "
                      f"max {max(values) * 1000:7.1f} ms")
            ratio = statistics.median(took["old"]) / statistics.median(took["new"])
            print(f"  {load}: old/new median ratio {ratio:.2f}")
        kube.close()


def part_slow_server(delays: list[float], hold_s: float) -> None:
    from crd_server import test_server_with_crds
    from kubernetes import client, config

    from elasticgpu.controller.edge import leader
    from tests.controller.slow_relay import SlowRelay

    try:
        from elasticgpu.controller.edge.leasing import own_leases
    except ImportError:  # the code before this change
        own_leases = leader.KubernetesLeases.on  # type: ignore[assignment]
    with test_server_with_crds() as (cluster, _api):
        kubeconfig = yaml.safe_load(cluster.kubeconfig.read_text())
        entry = kubeconfig["clusters"][0]["cluster"]
        url = urlsplit(entry["server"])
        relay = SlowRelay((url.hostname or "127.0.0.1", url.port or 443))
        entry["server"] = f"{url.scheme}://127.0.0.1:{relay.port}"
        entry.setdefault("tls-server-name", url.hostname)
        path = REPO / "bench" / "out" / "leader-renew-kubeconfig.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump(kubeconfig))
        print(f"part 3: a leader (10/7/2 s) renewing through a relay that answers late, {hold_s:g} s each")
        for delay in delays:
            configuration = client.Configuration()
            config.load_kube_config(config_file=str(path), client_configuration=configuration)
            elector = leader.LeaderElector(own_leases(configuration),
                                           leader.LeaderSettings(namespace="default", name=f"slow-{delay:g}"))
            stop, lost = threading.Event(), threading.Event()
            relay.delay_s = 0.0
            assert elector.acquire(stop)
            renewer = elector.keep(stop, on_lost=lost.set)
            relay.delay_s = delay
            began = time.monotonic()
            lost.wait(hold_s)
            verdict = f"LOST after {time.monotonic() - began:.1f} s" if lost.is_set() else "kept"
            print(f"  every answer {delay:.1f} s late: {verdict}", flush=True)
            stop.set()
            relay.delay_s = 0.0
            renewer.join(timeout=30)  # it releases the Lease on its way out
        relay.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--claims", type=int, default=20_000)
    parser.add_argument("--attempts", type=int, default=40)
    parser.add_argument("--delays", type=float, nargs="*", default=[1.0, 1.5, 2.5, 3.3])
    parser.add_argument("--hold", type=float, default=25.0)
    parser.add_argument("--only", choices=("gil", "renew", "slow"))
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f}, {os.cpu_count()} CPUs", flush=True)
    if args.only in (None, "gil"):
        part_gil(args.claims)
    if args.only in (None, "renew"):
        part_renew(args.claims, args.attempts)
    if args.only in (None, "slow"):
        part_slow_server(args.delays, args.hold)
    print(f"load average {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f}", flush=True)


if __name__ == "__main__":
    main()
