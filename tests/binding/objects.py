"""Builders of the objects binding tests use (plain dicts, the wire form)."""

from __future__ import annotations

import uuid
from typing import Any

from elasticgpu.api import names


def gpu(name: str, *, node: str = "node-1", memory: int = 81920, model: str = "A100-SXM4-80GB", index: int = 0,
        allocations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A GPU object named `name` (lowercase; its uuid is the upper-case form)."""
    body: dict[str, Any] = {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND_GPU,
        "metadata": {"name": name},
        "spec": {"index": index, "uuid": name.upper(), "model": model, "memory": memory, "nodeName": node},
    }
    if allocations is not None:
        body["status"] = {"allocations": allocations}
    return body


def klass(name: str, *, provisioner: str = names.PROVISIONER_GPUSHARE, default: bool = False,
          parameters: dict[str, str] | None = None, reclaim: str | None = None, mode: str | None = None
          ) -> dict[str, Any]:
    """An ElasticGPUClass."""
    body: dict[str, Any] = {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND_CLASS,
        "metadata": {"name": name, "annotations": {names.ANNOTATION_DEFAULT_CLASS: "true"} if default else {}},
        "provisioner": provisioner,
        "parameters": parameters or {},
    }
    if reclaim:
        body["reclaimPolicy"] = reclaim
    if mode:
        body["bindingMode"] = mode
    return body


def claim(name: str, namespace: str = "ns", *, cores: int | None = 30, memory: str | None = "10Gi",
          cards: int | None = None, class_name: str | None = None, egpu: str | None = None,
          selector: dict[str, Any] | None = None, uid: str | None = None) -> dict[str, Any]:
    """An ElasticGPUClaim (uid set as the server would)."""
    requests: dict[str, Any] = {}
    if cards is not None:
        requests[names.RESOURCE_NVIDIA_GPU] = cards
    else:
        if cores is not None:
            requests[names.RESOURCE_CORE] = cores
        if memory is not None:
            requests[names.RESOURCE_MEMORY] = memory
    spec: dict[str, Any] = {"resources": {"requests": requests}}
    if class_name:
        spec["elasticGPUClassName"] = class_name
    if egpu:
        spec["elasticGPUName"] = egpu
    if selector is not None:
        spec["selector"] = selector
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND_CLAIM,
        "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4())},
        "spec": spec,
    }


def share_egpu(name: str, gpu_name: str, *, cores: int = 50, memory: str = "20Gi", class_name: str | None = None,
               labels: dict[str, str] | None = None, claim_ref: dict[str, Any] | None = None,
               reclaim: str | None = None) -> dict[str, Any]:
    """An admin's ElasticGPU: a slice of one card."""
    spec: dict[str, Any] = {
        "capacity": {names.RESOURCE_CORE: cores, names.RESOURCE_MEMORY: memory},
        "gpuShare": {"gpuName": gpu_name},
    }
    if class_name:
        spec["elasticGPUClassName"] = class_name
    if claim_ref:
        spec["claimRef"] = claim_ref
    if reclaim:
        spec["reclaimPolicy"] = reclaim
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND_ELASTIC_GPU,
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
    }
