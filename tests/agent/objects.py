"""Objects and reads shared by the agent's tests against the API server."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from elasticgpu.api import names
from tests.kube_cluster import kube_request

DESCRIPTION = {
    "driver": {"version": "550.54.15", "cuda": "12.4"},
    "cards": [{"model": "NVIDIA A100-SXM4-80GB", "memory": "80Gi", "numa": 0, "links": [1], "count": 2}],
}
GPUS = f"/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL_GPU}"


def node_gpus(api: client.ApiClient, node: str) -> dict[str, dict[str, Any]]:
    answer = kube_request(api, "GET", GPUS, query=[("labelSelector", f"{names.LABEL_NODE}={node}")])
    assert answer.status == 200, answer.body
    return {item["metadata"]["name"]: item for item in answer.json()["items"]}


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)
