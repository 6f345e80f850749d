"""The controller runs without automatic full garbage collections and freezes what survives
(`operator.take_over_full_collections`, `collect_and_freeze`). That is only safe while binding
leaves no reference cycles behind: a cycle never collected is a leak. This test binds claims
against the API server with the collector off and counts the cyclic garbage left over."""

from __future__ import annotations

import gc
from collections import Counter

from elasticgpu.controller.kube import KubeApi
from tests.binding import objects as o
from tests.binding.conftest import Cluster, new_controller, settle


def test_binding_leaves_no_cyclic_garbage(cluster: Cluster, kube: KubeApi) -> None:
    model = f"T{cluster.prefix}"
    for index in range(4):
        cluster.gpu(o.gpu(f"gpu-{cluster.prefix}-{index}", node=f"{cluster.prefix}-node", index=index, model=model))
    class_name = f"{cluster.prefix}-class"
    cluster.klass(o.klass(class_name, parameters={"gpuModel": model}))
    controller = new_controller(kube, cluster.namespace)
    settle(controller, rounds=1)  # warm up: imports, connections, caches
    for index in range(30):
        cluster.claim(o.claim(f"c{index}", cores=10, memory="1Gi", class_name=class_name))

    gc.collect()
    gc.disable()
    debug = gc.get_debug()
    try:
        settle(controller)  # binds all 30 (workers, Events, resync-like rebuilds)
        controller.close()
        gc.set_debug(gc.DEBUG_SAVEALL)
        found = gc.collect()
        kinds = Counter(type(obj).__name__ for obj in gc.garbage)
    finally:
        gc.set_debug(debug)
        gc.garbage.clear()
        gc.enable()
    assert all(cluster.get_claim(f"c{index}")["status"]["phase"] == "Bound" for index in range(30))
    assert found == 0, f"binding left {found} objects in reference cycles: {kinds.most_common(8)}"
