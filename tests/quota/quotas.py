"""Builders and readers of ElasticGPUQuota objects, through the Kubernetes client (as a user would)."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from elasticgpu.api import names


def quota(name: str, hard: dict[str, Any]) -> dict[str, Any]:
    """An ElasticGPUQuota."""
    return {"apiVersion": names.API_VERSION, "kind": names.KIND_QUOTA, "metadata": {"name": name},
            "spec": {"hard": hard}}


def create(api_client: client.ApiClient, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    """Create a quota; raises the client's ApiException when the server refuses it."""
    api = client.CustomObjectsApi(api_client)
    created: dict[str, Any] = api.create_namespaced_custom_object(
        names.GROUP, names.VERSION, namespace, names.PLURAL_QUOTA, body)
    return created


def get(api_client: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    """Read a quota."""
    api = client.CustomObjectsApi(api_client)
    got: dict[str, Any] = api.get_namespaced_custom_object(names.GROUP, names.VERSION, namespace,
                                                           names.PLURAL_QUOTA, name)
    return got


def set_hard(api_client: client.ApiClient, namespace: str, name: str, hard: dict[str, Any]) -> None:
    """Replace spec.hard (a merge patch)."""
    api = client.CustomObjectsApi(api_client)
    api.patch_namespaced_custom_object(names.GROUP, names.VERSION, namespace, names.PLURAL_QUOTA, name,
                                       {"spec": {"hard": hard}})
