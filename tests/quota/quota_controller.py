"""An in-process controller for the quota tests, and the loop that works it until a check holds."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.process.reconciling import Controller
from elasticgpu.controller.settings import ControllerSettings, QuotaSettings, ResyncSettings
from tests.binding.conftest import Cluster


def quota_controller(kube: KubeApi, namespace: str) -> Controller:
    """A controller of `namespace` that rechecks quotas every 1 s (above settle's quiet time) and
    caches no "no quota here": the tests wait seconds, not the production minute."""
    settings = ControllerSettings(resync=ResyncSettings(orphan_grace_s=60.0),
                                  quota=QuotaSettings(recheck_s=1.0, refresh_s=0.0))
    return Controller(kube, settings, namespace=namespace)


def work_until(controller: Controller, check: Callable[[], bool], *, deadline_s: float = 30.0) -> None:
    """Work the controller (its rechecks come due) until `check()` holds; fails at the deadline."""
    deadline = time.monotonic() + deadline_s
    while not check():
        assert time.monotonic() < deadline, "not reached before the deadline"
        controller.drain()
        time.sleep(0.05)


def claim_status(cluster: Cluster, name: str) -> dict[str, Any]:
    """The claim's status as the server has it ({} before the controller wrote one)."""
    return cluster.get_claim(name).get("status") or {}
