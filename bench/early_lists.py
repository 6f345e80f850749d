"""The early start's lists, in-process on the real local API server (issue 49 item 2, item 3 of
the waitclaims task): does anything beat listing the cards and then the waiting claims one after
the other, on a 2-core box where the API server serializes on the other core?

Creates `--cards` GPU objects (8 per node, no Node objects) and `--waiting` claims of a class
that does not exist (they stay Pending: no controller runs), then times, in rounds that rotate
the variants (the box is noisy: compare the ratios of one run):

  seq         `Informer.list_cards()` then `WaitingClaims.list_waiting()`, as `early_start` does;
  concurrent  the waiting claims' pages fetched on a second thread (its own connection) while
              `list_cards` runs, taken in after it (their bind order reads the classes);
  pipelined   the GPU pages fetched on a second thread one page ahead while this one takes the
              previous page into the picture (`Ledger.observe_gpu` per GPU, as `merge_cards`
              does), against fetching every page and then taking them in.

    python bench/early_lists.py --cards 12000 --waiting 3000 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from crd_server import test_server_with_crds  # noqa: E402

from elasticgpu.api import names  # noqa: E402

NAMESPACE = "early"


def _gpu(index: int) -> dict[str, Any]:
    name = f"gpu-early-{index:06d}"
    return {"apiVersion": names.API_VERSION, "kind": names.KIND_GPU, "metadata": {"name": name},
            "spec": {"index": index % 8, "uuid": name.upper(), "model": "EARLY", "memory": 81920,
                     "nodeName": f"early-node-{index // 8:05d}"}}


def _claim(index: int) -> dict[str, Any]:
    return {"apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM,
            "metadata": {"name": f"waiting-{index:06d}", "namespace": NAMESPACE},
            "spec": {"elasticGPUClassName": "no-such-class",
                     "resources": {"requests": {names.RESOURCE_CORE: 25, names.RESOURCE_MEMORY: "10Gi"}}}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cards", type=int, default=12_000)
    parser.add_argument("--waiting", type=int, default=3_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from kubernetes import client

    from elasticgpu.controller.edge.kube import KubeApi
    from elasticgpu.controller.flow.machinery.waiting_claims import PAGE_SIZE, SELECTOR, WaitingClaims
    from elasticgpu.controller.process.reconciling import Controller
    from elasticgpu.controller.settings import ControllerSettings

    figures: dict[str, Any] = {"cards": args.cards, "waiting": args.waiting}
    with test_server_with_crds() as (cluster, api):
        client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
        kubeconfig = str(cluster.kubeconfig)
        kube = KubeApi.from_kubeconfig(kubeconfig)
        began = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: kube.create_gpu(_gpu(i)), range(args.cards)))
            list(pool.map(lambda i: kube.create_claim(_claim(i)), range(args.waiting)))
        figures["setup_s"] = round(time.monotonic() - began, 1)

        def fresh() -> Controller:
            return Controller(KubeApi.from_kubeconfig(kubeconfig), ControllerSettings(), namespace=NAMESPACE)

        def waiting_of(controller: Controller) -> WaitingClaims:
            informer = controller.informer
            return WaitingClaims(kube=informer.kube, picture=controller.picture, queue=controller.queue,
                                 namespace=NAMESPACE)

        def seq() -> float:
            controller = fresh()
            try:
                at = time.monotonic()
                controller.informer.list_cards()
                waiting_of(controller).list_waiting()
                return time.monotonic() - at
            finally:
                controller.close()

        def concurrent() -> float:
            controller = fresh()
            try:
                at = time.monotonic()
                pages: list[Any] = []

                def fetch() -> None:
                    token = ""
                    path = controller.informer.kube.collection_path("claim", NAMESPACE)
                    while True:
                        items, _version, token = controller.informer.kube.list_page(
                            path, field_selector=SELECTOR, limit=PAGE_SIZE, token=token)
                        pages.extend(items)
                        if not token:
                            return

                thread = threading.Thread(target=fetch)
                thread.start()
                controller.informer.list_cards()
                thread.join()
                for body in pages:
                    controller.picture.put_claim(body)
                for key in controller.picture.pending_claim_keys():
                    controller.queue.add(key)
                return time.monotonic() - at
            finally:
                controller.close()

        def gpus(pipelined: bool) -> float:
            controller = fresh()
            kube_of = controller.informer.kube
            path = kube_of.collection_path("gpu")
            picture = controller.picture
            try:
                at = time.monotonic()
                pages: queue.Queue[list[Any] | None] = queue.Queue(maxsize=2)

                def fetch() -> None:
                    token = ""
                    while True:
                        items, _version, token = kube_of.list_page(path, token=token)
                        pages.put(items)
                        if not token:
                            pages.put(None)
                            return

                if pipelined:
                    thread = threading.Thread(target=fetch)
                    thread.start()
                    while (page := pages.get()) is not None:
                        with picture.lock:
                            for body in page:
                                picture.ledger.observe_gpu(body)
                    thread.join()
                else:
                    items, _version = kube_of.list_collection(path)
                    with picture.lock:
                        for body in items:
                            picture.ledger.observe_gpu(body)
                return time.monotonic() - at
            finally:
                controller.close()

        variants = {"seq": seq, "concurrent": concurrent, "gpus_then_take_in": lambda: gpus(False),
                    "gpus_pipelined": lambda: gpus(True)}
        times: dict[str, list[float]] = {name: [] for name in variants}
        seq()  # warm the server's caches and this process's imports
        for _ in range(args.rounds):
            for name, variant in variants.items():
                times[name].append(round(variant(), 2))
        figures["times_s"] = times
        figures["median_s"] = {name: statistics.median(values) for name, values in times.items()}
        median = figures["median_s"]
        figures["concurrent_over_seq"] = round(median["concurrent"] / median["seq"], 3)
        figures["pipelined_over_then"] = round(median["gpus_pipelined"] / median["gpus_then_take_in"], 3)
        kube.close()
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
