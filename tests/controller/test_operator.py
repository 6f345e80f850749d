"""The controller end to end, with either watch engine: `run_controller` binds a claim created
while it runs, then stops."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from elasticgpu.api import names
from elasticgpu.controller import ControllerSettings, WatchSettings, run_controller
from tests.binding import objects as o
from tests.binding.conftest import Cluster


def _wait_for(check: Any, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("timed out")


@pytest.mark.parametrize("engine", ["client", "kopf"])
def test_operator_binds_and_stops(cluster: Cluster, kube_cluster: Any, engine: str) -> None:
    model = f"T{cluster.prefix}"
    cluster.gpu(o.gpu(f"gpu-{cluster.prefix}-0", node=f"{cluster.prefix}-node", model=model))
    class_name = f"{cluster.prefix}-class"
    cluster.klass(o.klass(class_name, parameters={"gpuModel": model}))
    stop = threading.Event()
    thread = threading.Thread(
        target=run_controller,
        kwargs={"kubeconfig": str(kube_cluster.kubeconfig), "namespace": cluster.namespace,
                "settings": ControllerSettings(watch=WatchSettings(engine=engine)), "stop": stop},
        daemon=True,
    )
    thread.start()
    try:
        cluster.claim(o.claim("c", cores=25, memory="4Gi", class_name=class_name))
        claim = _wait_for(lambda: (c := cluster.get_claim("c")).get("status", {}).get("phase") == "Bound" and c)
        assert claim["spec"]["elasticGPUName"].startswith("egpu-")
        assert names.FINALIZER_CLAIM_PROTECTION in claim["metadata"]["finalizers"]
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
