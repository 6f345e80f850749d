"""The controller's RSS after its watches start over, in-process (issue 49 item 2).

`bench/fleet_controller.py --prebound` measured 741 MiB right after a start and 1,193 MiB at rest
at 40,000 cards / 50,000 claims; between the two, the process that ends as the leader was a
standby that took over and then lived through an API server restart, after which every watch
starts over with a list of its kind, on its own thread, all at once. This script repeats that
without an API server: the pages of `bench/first_list.py` (the same objects) served to the
controller's own `KubeApi` (only its socket replaced), `Informer.relist(start=True)` once, then
`--rounds` rounds of every watched kind's list taken in by `Informer._start_over` on one thread
per kind at the same time, as `watch_kind` does after an outage. RSS (and its anonymous part)
after the first list and after each round, once per variant, each in a process of its own:

  default   glibc's defaults (one arena per thread, up to 8 per core; a dynamic mmap threshold)
  tuned     `process/malloc_tuning.tune()` first, as the controller does at its start
  trimmed   tuned, and `malloc_tuning.trim()` after the first list and after each round

The keys each step queued are taken off the queue after it, as the worker would.

    python bench/relist_rss.py --cards 8000 --claims 10000 --rounds 3
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

VARIANTS = ("default", "tuned", "trimmed")
WATCHED = ("gpu", "class", "egpu", "claim", "pod")


def memory_mib() -> list[int]:
    """[RSS, its anonymous part] in MiB (/proc/self/status)."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon"):
            fields[key] = round(int(value.split()[0]) / 1024)
    return [fields.get("VmRSS", 0), fields.get("RssAnon", 0)]


def drain(queue: Any) -> int:
    """Take every queued key, as the worker does once it has synced them (the keys the lists
    queued are not what this measures)."""
    taken = 0
    while queue.get(0.0) is not None:
        taken += 1
    return taken


def run_variant(variant: str, cards: int, claims: int, rounds: int) -> dict[str, object]:
    """One variant in this process: the figures (see the module docstring)."""
    tuning = "default"
    if variant in ("tuned", "trimmed"):  # imported only here: the default runs on a tree without it
        from elasticgpu.controller.process import malloc_tuning

        tuning = str(malloc_tuning.tune())
    import first_list
    from first_list import PLURALS, PagedKube, build, pages

    from elasticgpu.controller.flow.machinery.informer import Informer
    from elasticgpu.controller.flow.machinery.workqueue import WorkQueue
    from elasticgpu.controller.picture.picture import Picture
    from elasticgpu.controller.settings import ControllerSettings

    objects = build(cards, claims, 80)
    served = {PLURALS[k]: pages(v, PLURALS[k]) for k, v in objects.items()}
    counts = {k: len(v) for k, v in objects.items()}
    objects.clear()
    gc.collect()
    figures: dict[str, object] = {"variant": variant, "tuning": tuning, "objects": sum(counts.values()),
                                  "served_mib": round(sum(len(p) for v in served.values() for p in v) / 2**20)}
    figures["before"] = memory_mib()
    kube = PagedKube(served)
    picture = Picture()
    queue = WorkQueue(ControllerSettings().retry)
    informer = Informer(kube=kube, picture=picture, queue=queue, namespace=None)
    informer.relist(start=True)
    figures["queued"] = drain(queue)
    gc.collect()
    if variant == "trimmed":
        malloc_tuning.trim()
    figures["listed"] = memory_mib()
    began = time.monotonic()
    for round_ in range(rounds):
        def start_over(kind: str) -> None:
            items, version = kube.list_collection(kube.collection_path(kind))
            informer._start_over(kind, items, version)

        threads = [threading.Thread(target=start_over, args=(kind,), name=f"watch-{kind}") for kind in WATCHED]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=600)
        figures["queued"] = drain(queue)
        gc.collect()
        if variant == "trimmed":
            malloc_tuning.trim()
        figures[f"round {round_ + 1}"] = memory_mib()
    figures["rounds_s"] = round(time.monotonic() - began, 1)
    del first_list
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cards", type=int, default=8000)
    parser.add_argument("--claims", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # the child process's own
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args.variant, args.cards, args.claims, args.rounds)))
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    for variant in args.variants.split(","):
        answer = subprocess.run([sys.executable, __file__, "--variant", variant, "--cards", str(args.cards),
                                 "--claims", str(args.claims), "--rounds", str(args.rounds)],
                                env=env, capture_output=True, text=True, timeout=1800, check=False)
        if answer.returncode != 0:
            print(f"{variant}: failed ({answer.returncode}): {answer.stderr[-2000:]}")
            continue
        print(answer.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
