"""The demo's only user of the Kubernetes API: plain JSON over the kubernetes client's connection.

Every call has a timeout; a failed one raises `processes.DemoError` naming the object and the
HTTP status and message, which is what the demo prints as its one-line reason.
"""

from __future__ import annotations

import contextlib
import json
import urllib.parse
from typing import Any

from elasticgpu.api import names
from elasticgpu.testbed.processes import DemoError

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
"""Accept header asking the server for its own table (the CRDs' printer columns): what kubectl prints."""
CUSTOM = f"/apis/{names.GROUP}/{names.VERSION}"


class NotFound(DemoError):
    """The object does not exist (HTTP 404)."""


class DemoKube:
    """API calls of the demo, against the cluster of one kubeconfig."""

    def __init__(self, kubeconfig: str, *, context: str | None = None, timeout_s: float = 15.0) -> None:
        from kubernetes import config

        self._api: Any = config.new_client_from_config(config_file=kubeconfig, context=context)  # type: ignore[no-untyped-call]
        self._timeout_s = timeout_s

    def close(self) -> None:
        """Close the connections."""
        self._api.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: dict[str, str] | None = None,
        accept: str = "application/json",
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """One call; the decoded answer, or DemoError (NotFound for 404)."""
        data = self.raw(method, path, body=body, query=query, accept=accept, content_type=content_type)
        return dict(json.loads(data)) if data else {}

    def raw(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: dict[str, str] | None = None,
        accept: str = "application/json",
        content_type: str = "application/json",
    ) -> bytes:
        """One call; the answer's bytes as sent (a container's log is text, not JSON), or DemoError."""
        import urllib3

        configuration = self._api.configuration
        headers = {"Accept": accept, **dict(self._api.default_headers)}
        if getattr(configuration, "refresh_api_key_hook", None) is not None:
            configuration.refresh_api_key_hook(configuration)
        auth = configuration.get_api_key_with_prefix("authorization")
        if auth:
            headers["Authorization"] = auth
        data = None if body is None else json.dumps(body).encode()
        if data is not None:
            headers["Content-Type"] = content_type
        url = str(configuration.host).rstrip("/") + path + ("?" + urllib.parse.urlencode(query) if query else "")
        try:
            response = self._api.rest_client.pool_manager.request(
                method,
                url,
                body=data,
                headers=headers,
                timeout=urllib3.Timeout(total=self._timeout_s),
                retries=False,
                preload_content=True,
            )
        except urllib3.exceptions.HTTPError as error:
            raise DemoError(
                f"{method} {path}: the API server at {configuration.host} did not answer ({error})"
            ) from None
        if response.status < 300:
            return bytes(response.data or b"")
        try:
            message = json.loads(response.data).get("message", "")
        except ValueError:
            message = response.data[:300].decode(errors="replace")
        text = f"{method} {path}: HTTP {response.status}: {message}"
        raise NotFound(text) if response.status == 404 else DemoError(text)

    # Objects ------------------------------------------------------------------------------------------

    def create(self, path: str, body: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        """POST `body` to the collection at `path`."""
        return self.request("POST", path, body=body, query={"dryRun": "All"} if dry_run else None)

    def get(self, path: str) -> dict[str, Any]:
        """GET one object or list."""
        return self.request("GET", path)

    def delete(self, path: str, *, grace_period_s: int | None = None) -> None:
        """DELETE, foreground-free; absent is fine. `grace_period_s=0` for a pod: what its kubelet
        confirms once the containers are gone (a real API server keeps a bound pod until then)."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if grace_period_s is not None:
            body["gracePeriodSeconds"] = grace_period_s
        with contextlib.suppress(NotFound):
            self.request("DELETE", path, body=body)

    def patch_status(self, path: str, status: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch the status subresource (a Node's allocatable, as kubelet writes it)."""
        return self.request(
            "PATCH", f"{path}/status", body={"status": status}, content_type="application/merge-patch+json"
        )

    def table(self, path: str) -> dict[str, Any]:
        """The server's Table of a list (its printer columns), as kubectl get shows it."""
        return self.request("GET", path, accept=TABLE)

    def claim(self, namespace: str, name: str) -> dict[str, Any]:
        """One ElasticGPUClaim."""
        return self.get(f"{CUSTOM}/namespaces/{namespace}/{names.PLURAL_CLAIM}/{name}")

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        """One pod."""
        return self.get(f"/api/v1/namespaces/{namespace}/pods/{name}")

    def gpus(self, label_selector: str) -> list[dict[str, Any]]:
        """GPU objects with these labels."""
        answer = self.request("GET", f"{CUSTOM}/{names.PLURAL_GPU}", query={"labelSelector": label_selector})
        return list(answer.get("items") or [])

    def events(self, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
        """Events about one object, oldest first."""
        selector = f"involvedObject.kind={kind},involvedObject.name={name}"
        answer = self.request("GET", f"/api/v1/namespaces/{namespace}/events", query={"fieldSelector": selector})
        return sorted(answer.get("items") or [], key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))

    def logs(self, namespace: str, pod: str, container: str) -> str:
        """A container's log, through the API server and its node's kubelet (what `kubectl logs` shows)."""
        data = self.raw("GET", f"/api/v1/namespaces/{namespace}/pods/{pod}/log", query={"container": container},
                        accept="*/*")  # fmt: skip  # the server refuses text/plain; it sends text anyway
        return data.decode(errors="replace")
