"""What a watch that starts over leaves in the process (issue 49 item 2: RSS at rest <= 1 GiB at
40,000 cards / 50,000 claims).

After an API server restart every watch lists its kind again and takes the list in
(`Informer._start_over`), one thread per kind, all at once. The picture did not change, so the
process should hold what it held before: on the old code each GPU was kept again (a new model and
JSON, made while the lists were alive, in their arenas of Python's allocator) and every key queued
held a name of the list, and `bench/relist_rss.py` measured RSS 339 -> 583 MiB in-process at 8,000
cards / 10,000 claims after one round, for a picture of the same size.

On the list pages `bench/first_list.py` builds, through the controller's own `KubeApi` (only its
socket answers the pages) and `Informer`; tracemalloc started after the first list sees only what
the start-over allocated and still holds once the worker has taken the keys it queued.
"""

from __future__ import annotations

import gc
import threading
import time
import tracemalloc
from typing import Any

import pytest

from elasticgpu.controller.flow.machinery.informer import Informer
from elasticgpu.controller.flow.machinery.workqueue import WorkQueue
from elasticgpu.controller.picture.picture import Picture
from elasticgpu.controller.settings import ControllerSettings
from tests.bench.bench_module import load

pytestmark = pytest.mark.timeout(300)

CARDS, CLAIMS = 400, 1600
"""Every card holding 4 claims, 80% of them pods' inline claims: 1,280 pods."""

WATCHED = ("gpu", "class", "egpu", "claim", "pod")


def _listed() -> tuple[Any, Informer, WorkQueue, int]:
    """The first list taken in (`relist(start=True)`) and its keys taken by a worker: the
    KubeApi serving the pages, the informer, its queue and the number of objects."""
    fl = load("first_list", "first_list.py")
    objects = fl.build(CARDS, CLAIMS, 80)
    served = {fl.PLURALS[k]: fl.pages(v, fl.PLURALS[k]) for k, v in objects.items()}
    total = sum(len(v) for v in objects.values())
    objects.clear()
    kube = fl.PagedKube(served)
    queue = WorkQueue(ControllerSettings().retry)
    informer = Informer(kube=kube, picture=Picture(), queue=queue, namespace=None)
    informer.relist(start=True)
    _drain(queue)
    return kube, informer, queue, total


def _drain(queue: WorkQueue) -> int:
    """Take every queued key, as the worker does once it has synced them."""
    taken = 0
    deadline = time.monotonic() + 60
    while queue.get(0.0) is not None:
        taken += 1
        assert time.monotonic() < deadline, "the queue did not drain"
    return taken


def _start_over_on_threads(kube: Any, informer: Informer) -> None:
    """Every watched kind listed again and taken in on a thread of its own, as `watch_kind` does
    after an outage."""
    failed: list[BaseException] = []

    def start_over(kind: str) -> None:
        try:
            items, version = kube.list_collection(kube.collection_path(kind))
            informer._start_over(kind, items, version)
        except BaseException as err:  # the test's own thread: say it in the test
            failed.append(err)

    threads = [threading.Thread(target=start_over, args=(kind,), name=f"watch-{kind}") for kind in WATCHED]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
        assert not thread.is_alive(), f"{thread.name} did not finish"
    assert not failed, failed


def test_a_watch_starting_over_on_an_unchanged_cluster_keeps_nothing_new() -> None:
    kube, informer, queue, total = _listed()
    gpu_records = dict(informer.picture.ledger._gpus)
    # The ledger builds a GPU's model when read and keeps those built last (`gpu_records.Models`,
    # at most 256 unread after a list): read each once now, so the syncs below find them built
    # rather than counting the cache's filling as held by the start-over.
    for name in informer.picture.ledger.gpu_names():
        informer.picture.ledger.gpu(name)
    gc.collect()
    tracemalloc.start(1)
    try:
        _start_over_on_threads(kube, informer)
        queued = _drain(queue)
        gc.collect()
        # Not the queue's own table of queued keys: sized by the most keys waiting at once (one
        # allocation of 512 KiB here, an mmap of its own), made once.
        held = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, "*/elasticgpu/controller/flow/machinery/workqueue.py")])
        kept = sum(stat.size for stat in held.statistics("filename"))
    finally:
        tracemalloc.stop()
    # The old code: 663 B per object (every GPU's model and JSON made again, ~4.7 KB per GPU, and
    # the keys' names of the list); now ~19 (the pods' keys the queue's settled-keys table keeps).
    assert kept / total < 50, f"{kept} bytes made by the start-over still held, {kept / total:.0f} per object"
    assert queued >= CLAIMS, "the start-over queued every claim again (the worker looks at each)"
    # The GPUs listed at the version held are the records held, not copies.
    assert all(informer.picture.ledger._gpus[name] is record for name, record in gpu_records.items())


def test_the_keys_a_start_over_queues_hold_no_string_of_its_list() -> None:
    kube, informer, queue, total = _listed()
    gc.collect()
    tracemalloc.start(1)
    try:
        _start_over_on_threads(kube, informer)
        gc.collect()
        parsed = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(True, "*/elasticgpu/controller/edge/requesting.py")])
        kept = sum(stat.size for stat in parsed.statistics("filename"))
    finally:
        tracemalloc.stop()
    assert len(queue) >= CLAIMS
    # The old code: 63 B per object, the names in the queued keys (each pins its list's arena
    # until the worker takes it, and longer where a key is remembered).
    assert kept / total < 5, f"{kept} bytes of the parsed lists held by the queued keys, {kept / total:.1f} per object"
