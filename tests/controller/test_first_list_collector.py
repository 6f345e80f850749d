"""The first list runs with Python's cyclic garbage collector off (`garbage.paused`, issue 49):
the list builds the whole picture, every object a survivor, and each collection walked more of it
and freed nothing: half of the first list's CPU at 40,000 cards / 50,000 claims
(`bench/first_list.py --gc on|off`: 25.9 s against 13.0 s).

Against the test API server: the controller's own first list (`starting.first_list`) of a namespace
with a few hundred claims, with `gc.callbacks` counting the collections that ran during it. The old
code collected 15 times (300 claims); the collector is on again afterwards, as it was."""

from __future__ import annotations

import gc
import threading
from typing import Any

from tests.binding import objects as o
from tests.binding.conftest import new_controller

CLAIMS = 300


def test_the_first_list_runs_without_collections_and_the_collector_comes_back(cluster: Any, kube: Any) -> None:
    from elasticgpu.controller.process import starting

    model = f"T{cluster.prefix}"
    for i in range(8):
        cluster.gpu(o.gpu(f"gpu-{cluster.prefix}-{i}", node=f"{cluster.prefix}-n", index=i, model=model))
    class_name = f"{cluster.prefix}-class"
    cluster.klass(o.klass(class_name, parameters={"gpuModel": model}))
    for i in range(CLAIMS):
        cluster.claim(o.claim(f"listed-{i:03d}", cores=10, memory="1Gi", class_name=class_name))
    controller = new_controller(kube, cluster.namespace)
    listing = threading.Event()
    collections: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and listing.is_set():
            collections.append(info["generation"])

    gc.callbacks.append(count)
    try:
        assert gc.isenabled()
        listing.set()
        assert starting.first_list(controller, threading.Event()) is not None
        listing.clear()
        assert len(controller.queue) >= CLAIMS  # the list did fill the picture
        # At most the young collection the collector owes as soon as it is back on, and one just before
        # it went off; the old code collected 15 times here (generations 0 and 1).
        assert len(collections) <= 2, f"{len(collections)} collections ran during the first list (generations " \
                                      f"{sorted(set(collections))})"
        assert gc.isenabled(), "the collector stayed off after the first list"
    finally:
        gc.callbacks.remove(count)
        listing.clear()
        gc.enable()
        controller.close()
