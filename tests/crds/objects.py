"""Create, read, replace and delete any elasticgpu object from a manifest, through the API server."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from elasticgpu.api import names
from elasticgpu.api.kinds import KINDS, KindInfo

BY_KIND: dict[str, KindInfo] = {info.kind: info for info in KINDS}


class Objects:
    """Thin CustomObjectsApi wrapper that picks plural and scope from the manifest's kind."""

    def __init__(self, api_client: client.ApiClient, namespace: str) -> None:
        self.api = client.CustomObjectsApi(api_client)
        self.namespace = namespace

    def _args(self, manifest: dict[str, Any]) -> tuple[KindInfo, dict[str, str]]:
        info = BY_KIND[manifest["kind"]]
        args = {"group": names.GROUP, "version": names.VERSION, "plural": info.plural}
        if info.namespaced:
            args["namespace"] = self.namespace
        return info, args

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        info, args = self._args(manifest)
        if info.namespaced:
            return self.api.create_namespaced_custom_object(body=manifest, **args)
        return self.api.create_cluster_custom_object(body=manifest, **args)

    def get(self, manifest: dict[str, Any]) -> dict[str, Any]:
        info, args = self._args(manifest)
        name = manifest["metadata"]["name"]
        if info.namespaced:
            return self.api.get_namespaced_custom_object(name=name, **args)
        return self.api.get_cluster_custom_object(name=name, **args)

    def replace(self, manifest: dict[str, Any]) -> dict[str, Any]:
        info, args = self._args(manifest)
        name = manifest["metadata"]["name"]
        if info.namespaced:
            return self.api.replace_namespaced_custom_object(name=name, body=manifest, **args)
        return self.api.replace_cluster_custom_object(name=name, body=manifest, **args)

    def patch(self, manifest: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        """JSON merge patch of the object (the way the controller writes specs)."""
        info, args = self._args(manifest)
        name = manifest["metadata"]["name"]
        if info.namespaced:
            return self.api.patch_namespaced_custom_object(name=name, body=body, **args)
        return self.api.patch_cluster_custom_object(name=name, body=body, **args)

    def patch_status(self, manifest: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        info, args = self._args(manifest)
        name = manifest["metadata"]["name"]
        body = {"status": status}
        if info.namespaced:
            return self.api.patch_namespaced_custom_object_status(name=name, body=body, **args)
        return self.api.patch_cluster_custom_object_status(name=name, body=body, **args)

    def delete(self, manifest: dict[str, Any]) -> None:
        """Delete if present; cluster-scoped objects outlive the test namespace."""
        info, args = self._args(manifest)
        name = manifest["metadata"]["name"]
        try:
            if info.namespaced:
                self.api.delete_namespaced_custom_object(name=name, **args)
            else:
                self.api.delete_cluster_custom_object(name=name, **args)
        except client.ApiException as err:
            if err.status != 404:
                raise
