"""What the node agent writes into a GPU's status, written by the tests in its place."""

from __future__ import annotations

import time
from typing import Any

from elasticgpu.controller import errors
from elasticgpu.controller.edge.kube import KubeApi


def write_gpu_status(kube: KubeApi, gpu_name: str, **fields: Any) -> None:
    """Write agent-owned status fields into the GPU, as the node's agent does (re-reading on a
    conflict with the controller, which writes the allocations)."""
    for _ in range(10):
        body = kube.get_gpu(gpu_name)
        body.setdefault("status", {}).update(fields)
        try:
            kube.replace_gpu_status(body)
            return
        except errors.Conflict:
            time.sleep(0.1)
    raise AssertionError(f"GPU {gpu_name}: status not written after 10 conflicts")
