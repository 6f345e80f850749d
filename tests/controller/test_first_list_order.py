"""The first list of a process queues its keys behind the events' keys (issue 49): a claim created
at a controller's start, or just after a standby took over, is served first, not after every
object of the cluster. At 8,000 cards the old order kept such a claim 12 s behind ~20,000 keys
(bench/README.md, `bench/fleet_controller.py`).

Against the test API server: the controller's own first list (`starting.first_list`) of a
namespace with Bound-looking and Pending claims, then the watch event of a new claim; the work
queue must hand that claim out first. The old code handed out every listed key before it."""

from __future__ import annotations

import threading
from typing import Any

from tests.binding import objects as o
from tests.binding.conftest import new_controller


def test_a_claim_after_the_first_list_is_served_before_the_listed_objects(cluster: Any, kube: Any) -> None:
    from elasticgpu.controller.process import starting

    model = f"T{cluster.prefix}"
    for i in range(4):
        cluster.gpu(o.gpu(f"gpu-{cluster.prefix}-{i}", node=f"{cluster.prefix}-n", index=i, model=model))
    class_name = f"{cluster.prefix}-class"
    cluster.klass(o.klass(class_name, parameters={"gpuModel": model}))
    for i in range(20):
        cluster.claim(o.claim(f"listed-{i:02d}", cores=10, memory="1Gi", class_name=class_name))
    controller = new_controller(kube, cluster.namespace)
    try:
        assert starting.first_list(controller, threading.Event()) is not None
        listed = len(controller.queue)
        assert listed >= 24, listed  # the GPUs and the claims, at least
        new = cluster.claim(o.claim("created-at-start", cores=10, memory="1Gi", class_name=class_name))
        controller.observe("claim", "ADDED", new)
        first = controller.queue.get(timeout_s=1.0)
        assert first == ("claim", cluster.namespace, "created-at-start"), (
            f"the first key served was {first}, not the claim created after the list ({listed} keys were listed)")
        # The listed keys are all still there, behind it.
        served = {first}
        while (key := controller.queue.get(timeout_s=0.2)) is not None:
            served.add(key)
        assert ("claim", cluster.namespace, "listed-00") in served and len(served) >= listed
    finally:
        controller.close()
