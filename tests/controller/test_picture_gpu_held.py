"""What the controller holds per GPU object after its first list, on the test API server (issue 49
item 2: 40,000 cards within the 1 GiB the controller may hold at rest).

The ledger kept each GPU's full model (~7 KB), its JSON and a dict of its allocation models; now a
small record and the JSON, the model built when read with a bounded cache of those built last
(`picture.gpu_records`). The cache is set far below the fleet here (as 2,048 is far below 40,000
cards), so the figure is what every card past the cache costs."""

from __future__ import annotations

import gc
import threading
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from elasticgpu.api import names
from elasticgpu.controller.picture import gpu_records
from tests.binding import objects as o
from tests.binding.conftest import new_controller

pytestmark = pytest.mark.timeout(300)

CARDS = 240
CACHE = 8
STAMP = "2026-12-07T00:00:00Z"


def _card(cluster: Any, kube: Any, index: int) -> None:
    """A card as its agent creates it, with four reservations the controller wrote in its status."""
    name = f"gpu-{cluster.prefix}-{index:04d}"
    created = cluster.gpu(o.gpu(name, node=f"{cluster.prefix}-n{index // 8}", index=index % 8))
    created["status"] = {
        "capacity": {names.RESOURCE_CORE: 100, names.RESOURCE_MEMORY: 81920},
        "allocatable": {names.RESOURCE_CORE: 0, names.RESOURCE_MEMORY: 40960},
        "health": "Healthy",
        "conditions": [{"type": "Ready", "status": "True", "reason": "Healthy", "message": "",
                        "lastTransitionTime": STAMP}],
        "allocations": [{"elasticGPU": f"egpu-{cluster.prefix}-{index:04d}-{k}",
                         "claimRef": {"kind": names.KIND_CLAIM, "namespace": cluster.namespace,
                                      "name": f"claim-{index:04d}-{k}", "uid": f"uid-{index:04d}-{k}"},
                         "cores": 25, "memory": 10240, "reservedAt": STAMP} for k in range(4)]}
    kube.replace_gpu_status(created)


def test_the_first_list_holds_a_few_kib_per_gpu(cluster: Any, kube: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from elasticgpu.controller.process import starting

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: _card(cluster, kube, i), range(CARDS)))
    monkeypatch.setattr(gpu_records, "CACHE_SIZE", CACHE, raising=False)  # the old code has none: no-op there
    controller = new_controller(kube, cluster.namespace)
    try:
        gc.collect()
        tracemalloc.start(40)
        try:
            assert starting.first_list(controller, threading.Event()) is not None
            gc.collect()
            # What the GPU picture made and holds (the ledger, its records and models, the
            # allocator's inventory), not the queue's keys nor the other kinds' fixed costs.
            snapshot = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(True, "*/elasticgpu/controller/picture/*", all_frames=True),
                 tracemalloc.Filter(True, "*/elasticgpu/allocator/*", all_frames=True)])
        finally:
            tracemalloc.stop()
        stats = snapshot.statistics("filename")  # by the innermost frame
        held = sum(stat.size for stat in stats)
        ours = [n for n in controller.ledger.gpu_names() if n.startswith(f"gpu-{cluster.prefix}-")]
        assert len(ours) == CARDS
        listed = len(controller.ledger.gpu_names())
        per_gpu = held / listed
        print(f"held after the first list: {held} bytes for {listed} GPUs, {per_gpu:.0f} per GPU;",
              ", ".join(f"{stat.traceback[0].filename.rsplit('/', 1)[-1]} {stat.size}" for stat in stats[:8]))
        # The old code: 11,980 B per GPU here (its model ~6.9 KB, its JSON, its allocations' dict, the
        # inventory); now ~5,900 (the record, the JSON, the inventory, the cache's 8 models).
        assert per_gpu < 8000, f"{per_gpu:.0f} bytes held per GPU after the first list"
        model = controller.ledger.gpu(ours[0])
        assert model is not None and len(model.status.allocations) == 4
    finally:
        controller.close()
