"""The agent's only user of the Kubernetes API: its own node's GPU objects, its Node, claims, Events.

Scale rule: 10,000 agents must not each list the cluster. Every list and watch here carries the
label selector `elasticgpu.io/node=<this node>` (GPU objects) or the field selector
`metadata.name=<this node>` (the Node); claims and ElasticGPUs are only read and written by name,
for the containers this node runs.

Every request notes whether the API server answered (`answered_at`, `last_failure`): the CRI
hook's readiness is "the API server answered recently", learnt from the calls the agent makes
anyway (heartbeats, watches), at no cost.

Writes:
- GPU spec and labels: server-side apply (field manager `elasticgpu-agent`, forced): the agent owns
  them entirely and an apply that changes nothing is a no-op on the server. Except `spec.owner`,
  the platform team's (docs/dra.md): never in an apply; a new card gets its Node's default
  (label `elasticgpu.io/gpu-owner`) through one create under the manager `elasticgpu-agent-create`.
- GPU and claim status: JSON merge patch with `metadata.resourceVersion` as precondition. The
  status' `conditions` is an atomic list shared with the controller; a read-modify-write with a
  precondition is the only way to replace our conditions without erasing the controller's.
  A 409 raises `KubeConflict`: the caller re-reads and recomputes.
- GPU `status.runningClaims` (the claims whose containers run on the card, from the ledger): a
  merge patch of that field alone, without precondition. Only the agent writes it and a merge
  patch replaces the list whole, so nothing of the controller's (`status.allocations`, its commit
  point) is touched; written only when it changed, so the controller meets few conflicts. The same
  for `status.preparedClaims` (the DRA claims the node holds on the card), in the same patch.
- Node labels: merge patch (never creates a Node, unlike an apply).

The kubernetes package gives configuration and credentials; requests go through its urllib3 pool
with our own timeouts, JSON in and out, and failures become `errors.KubeError` here.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from elasticgpu.agent import errors
from elasticgpu.api import names

logger = logging.getLogger(__name__)

GPUS_PATH = f"/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL_GPU}"
RESOURCE_SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"


@dataclass(frozen=True)
class WatchEvent:
    """One event of a watch: ADDED, MODIFIED, DELETED, BOOKMARK or ERROR, with its object."""

    type: str
    object: dict[str, Any]


def load_api_client(kubeconfig: str | None, context: str | None) -> Any:
    """A kubernetes.client.ApiClient: the kubeconfig when given, else in-cluster, else $KUBECONFIG / ~/.kube/config."""
    from kubernetes import client, config

    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig, context=context)  # type: ignore[no-untyped-call]
    try:
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return client.ApiClient(configuration)
    except config.ConfigException:
        return config.new_client_from_config(context=context)  # type: ignore[no-untyped-call]


class AgentKube:
    """API calls of one node's agent. Thread-safe (urllib3's pool is)."""

    def __init__(self, api_client: Any, *, node_name: str, field_manager: str, timeout_s: float = 10.0) -> None:
        self._api = api_client
        self.node_name = node_name
        self._field_manager = field_manager
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self.writes: dict[str, int] = {}
        """Writes per kind of write (`gpu_apply`, `gpu_status`, `gpu_running_claims`, `claim_status`, `node_labels`,
        `event`), for metrics."""
        self.answered_at: float | None = None
        """time.monotonic() of the API server's last answer (any HTTP status below 500); None: never yet."""
        self.last_failure: str | None = None
        """What the last request that got no usable answer met (no connection, timeout, HTTP 5xx); None after
        an answer."""

    def close(self) -> None:
        """Close the client's connections."""
        self._api.close()

    # Plumbing ---------------------------------------------------------------------------------

    def _headers(self, content_type: str | None) -> dict[str, str]:
        configuration = self._api.configuration
        headers = {"Accept": "application/json", **dict(self._api.default_headers)}
        if getattr(configuration, "refresh_api_key_hook", None) is not None:
            configuration.refresh_api_key_hook(configuration)
        # The kubernetes package keeps a kubeconfig's or the in-cluster token under "BearerToken"
        # (older releases: "authorization"); a Node-bound token kubeconfig depends on it.
        auth = configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
        if auth:
            headers["Authorization"] = auth
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def _answered(self, status: int, what: str) -> None:
        if status < 500:
            self.answered_at = time.monotonic()
            self.last_failure = None
        else:
            self.last_failure = f"{what}: HTTP {status}"

    def _unanswered(self, what: str, error: Exception) -> None:
        self.last_failure = f"{what}: {error}"

    def _url(self, path: str, query: dict[str, str] | None) -> str:
        url = self._api.configuration.host.rstrip("/") + path
        return str(url) + ("?" + urllib.parse.urlencode(query) if query else "")

    def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: dict[str, str] | None = None,
        content_type: str | None = None,
        what: str,
        write: str | None = None,
    ) -> dict[str, Any]:
        import urllib3

        data = None if body is None else json.dumps(body).encode()
        try:
            response = self._api.rest_client.pool_manager.request(
                method, self._url(path, query), body=data,
                headers=self._headers(content_type or ("application/json" if data else None)),
                timeout=urllib3.Timeout(total=self._timeout_s), retries=False, preload_content=True,
            )
        except urllib3.exceptions.HTTPError as e:
            self._unanswered(what, e)
            raise errors.KubeUnavailable(f"{what}: the API server did not answer ({e})") from None
        self._answered(response.status, what)
        if write is not None and response.status < 500:
            with self._lock:
                self.writes[write] = self.writes.get(write, 0) + 1
        if response.status < 300:
            return dict(json.loads(response.data)) if response.data else {}
        try:
            message = json.loads(response.data).get("message", "")
        except ValueError:
            message = response.data[:300].decode(errors="replace")
        text = f"{what}: HTTP {response.status}: {message}"
        if response.status == 404:
            raise errors.KubeNotFound(text, status=404)
        if response.status == 409:
            raise errors.KubeConflict(text, status=409)
        raise errors.KubeUnavailable(text, status=response.status)

    def probe(self) -> None:
        """Ask the API server for its version (the cheapest request there is): notes whether it answers."""
        self._request("GET", "/version", what="probe the API server")

    # GPU objects of this node ---------------------------------------------------------------------

    def node_selector(self) -> str:
        """The label selector of this node's GPU objects."""
        return f"{names.LABEL_NODE}={self.node_name}"

    def list_gpus(self) -> tuple[list[dict[str, Any]], str]:
        """This node's GPU objects and the list's resourceVersion."""
        answer = self._request("GET", GPUS_PATH, query={"labelSelector": self.node_selector()},
                               what=f"list GPUs of node {self.node_name}")
        return list(answer.get("items") or []), str(answer.get("metadata", {}).get("resourceVersion", ""))

    def watch_gpus(self, resource_version: str, *, timeout_s: int) -> Iterator[WatchEvent]:
        """Events of this node's GPU objects after `resource_version`, until the server ends the watch."""
        import urllib3

        query = {
            "labelSelector": self.node_selector(), "watch": "true", "resourceVersion": resource_version,
            "allowWatchBookmarks": "true", "timeoutSeconds": str(timeout_s),
        }
        try:
            response = self._api.rest_client.pool_manager.request(
                "GET", self._url(GPUS_PATH, query), headers=self._headers(None),
                timeout=urllib3.Timeout(connect=self._timeout_s, read=timeout_s + self._timeout_s),
                retries=False, preload_content=False,
            )
        except urllib3.exceptions.HTTPError as e:
            self._unanswered(f"watch GPUs of node {self.node_name}", e)
            raise errors.KubeUnavailable(f"watch GPUs of node {self.node_name}: no answer ({e})") from None
        self._answered(response.status, f"watch GPUs of node {self.node_name}")
        try:
            if response.status == 410:
                raise errors.KubeConflict(f"watch GPUs of node {self.node_name}: 410 Gone", status=410)
            if response.status >= 300:
                raise errors.KubeUnavailable(
                    f"watch GPUs of node {self.node_name}: HTTP {response.status}", status=response.status
                )
            buffer = b""
            for chunk in response.stream(65536, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        event = json.loads(line)
                        if event.get("type") == "ERROR" and event.get("object", {}).get("code") == 410:
                            raise errors.KubeConflict(f"watch GPUs of node {self.node_name}: 410 Gone", status=410)
                        self.answered_at = time.monotonic()  # a live watch is an answering server
                        yield WatchEvent(str(event.get("type")), dict(event.get("object") or {}))
        except (urllib3.exceptions.HTTPError, ValueError) as e:
            raise errors.KubeUnavailable(f"watch GPUs of node {self.node_name}: broken ({e})") from None
        finally:
            response.release_conn()

    def read_gpu(self, name: str) -> dict[str, Any]:
        """One GPU object; raises `KubeNotFound`."""
        return self._request("GET", f"{GPUS_PATH}/{name}", what=f"read GPU {name}")

    def apply_gpu(self, name: str, *, labels: dict[str, str], spec: dict[str, Any],
                  owner: dict[str, Any] | None = None) -> dict[str, Any]:
        """Server-side apply of the GPU's labels, spec and `owner` reference (creates the object when absent)."""
        metadata: dict[str, Any] = {"name": name, "labels": labels}
        if owner is not None:
            metadata["ownerReferences"] = [owner]
        body = {"apiVersion": names.API_VERSION, "kind": names.KIND_GPU, "metadata": metadata, "spec": spec}
        return self._request(
            "PATCH", f"{GPUS_PATH}/{name}", body=body, content_type="application/apply-patch+yaml",
            query={"fieldManager": self._field_manager, "force": "true"}, what=f"apply GPU {name}", write="gpu_apply",
        )

    def create_gpu(self, name: str, *, labels: dict[str, str], spec: dict[str, Any],
                   owner: dict[str, Any] | None = None) -> dict[str, Any]:
        """Create the GPU object (POST; raises `KubeConflict` when it exists). Used only to give a new card the
        node's default spec.owner: under its own field manager, so the agent's applies (which never carry
        spec.owner) neither own nor remove it, and the platform team's later patch of it stands."""
        metadata: dict[str, Any] = {"name": name, "labels": labels}
        if owner is not None:
            metadata["ownerReferences"] = [owner]
        body = {"apiVersion": names.API_VERSION, "kind": names.KIND_GPU, "metadata": metadata, "spec": spec}
        return self._request(
            "POST", GPUS_PATH, body=body, query={"fieldManager": f"{self._field_manager}-create"},
            what=f"create GPU {name}", write="gpu_create",
        )

    def patch_gpu_status(self, name: str, *, resource_version: str, status: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch fields of the GPU's status, only if the object is still at `resource_version`."""
        body = {"metadata": {"resourceVersion": resource_version}, "status": status}
        return self._request(
            "PATCH", f"{GPUS_PATH}/{name}/status", body=body, content_type="application/merge-patch+json",
            query={"fieldManager": self._field_manager}, what=f"write status of GPU {name}", write="gpu_status",
        )

    def patch_gpu_holders(self, name: str, fields: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
        """Replace the GPU's `status.runningClaims` and/or `status.preparedClaims` (the keys of `fields`; a
        merge patch of those fields alone, no precondition)."""
        return self._request(
            "PATCH", f"{GPUS_PATH}/{name}/status", body={"status": fields},
            content_type="application/merge-patch+json", query={"fieldManager": self._field_manager},
            what=f"write status.{' and status.'.join(sorted(fields))} of GPU {name}", write="gpu_running_claims",
        )

    # Claims (read and written by name only) --------------------------------------------------------------

    def _claim_path(self, namespace: str, name: str) -> str:
        return f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{namespace}/{names.PLURAL_CLAIM}/{name}"

    def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """One claim; raises `KubeNotFound`."""
        return self._request("GET", self._claim_path(namespace, name), what=f"read claim {namespace}/{name}")

    def read_elastic_gpu(self, name: str) -> dict[str, Any]:
        """One ElasticGPU (cluster scoped); raises `KubeNotFound`."""
        return self._request("GET", f"/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL_ELASTIC_GPU}/{name}",
                             what=f"read ElasticGPU {name}")

    def patch_claim_status(
        self, namespace: str, name: str, *, resource_version: str, status: dict[str, Any]
    ) -> dict[str, Any]:
        """Merge-patch fields of a claim's status, only if the claim is still at `resource_version`."""
        body = {"metadata": {"resourceVersion": resource_version}, "status": status}
        return self._request(
            "PATCH", self._claim_path(namespace, name) + "/status", body=body,
            content_type="application/merge-patch+json", query={"fieldManager": self._field_manager},
            what=f"write status of claim {namespace}/{name}", write="claim_status",
        )

    def create_event(
        self, *, namespace: str, involved: dict[str, Any], type_: str, reason: str, message: str, now: str
    ) -> None:
        """A core/v1 Event about `involved` (apiVersion, kind, name, namespace, uid)."""
        name = f"{involved.get('name', 'object')}.{uuid.uuid4().hex[:16]}"  # unique, as client-go's recorder
        body = {
            "apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": namespace},
            "involvedObject": involved, "type": type_, "reason": reason, "message": message,
            "source": {"component": self._field_manager, "host": self.node_name},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            "reportingComponent": self._field_manager, "reportingInstance": self.node_name,
        }
        self._request("POST", f"/api/v1/namespaces/{namespace}/events", body=body,
                      what=f"create Event {reason} about {involved.get('kind')} {involved.get('name')}", write="event")

    # Namespaces (read by name only) ----------------------------------------------------------------------

    def read_namespace(self, name: str) -> dict[str, Any]:
        """One Namespace (its labels say whether its pods may use the node's GPUs); raises `KubeNotFound`."""
        return self._request("GET", f"/api/v1/namespaces/{name}", what=f"read Namespace {name}")

    # The Node ---------------------------------------------------------------------------------------------

    def read_node(self) -> dict[str, Any]:
        """This node's Node object; raises `KubeNotFound`."""
        return self._request("GET", f"/api/v1/nodes/{self.node_name}", what=f"read Node {self.node_name}")

    def patch_node_labels(self, labels: dict[str, str | None]) -> None:
        """Set (or, with None, remove) labels of this node's Node."""
        self._request(
            "PATCH", f"/api/v1/nodes/{self.node_name}", body={"metadata": {"labels": labels}},
            content_type="application/merge-patch+json", query={"fieldManager": self._field_manager},
            what=f"label Node {self.node_name}", write="node_labels",
        )

    # DRA: this node's ResourceSlice (by name; the admission policy checks spec.nodeName), claims by name -----

    def read_resource_slice(self, name: str) -> dict[str, Any]:
        """One ResourceSlice; raises `KubeNotFound`."""
        return self._request("GET", f"{RESOURCE_SLICES_PATH}/{name}", what=f"read ResourceSlice {name}")

    def apply_resource_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply of a whole ResourceSlice (creates it when absent)."""
        name = body["metadata"]["name"]
        return self._request(
            "PATCH", f"{RESOURCE_SLICES_PATH}/{name}", body=body, content_type="application/apply-patch+yaml",
            query={"fieldManager": self._field_manager, "force": "true"}, what=f"apply ResourceSlice {name}",
            write="resource_slice",
        )

    def delete_resource_slice(self, name: str) -> None:
        """Delete a ResourceSlice; raises `KubeNotFound` when it is gone already."""
        self._request("DELETE", f"{RESOURCE_SLICES_PATH}/{name}", what=f"delete ResourceSlice {name}",
                      write="resource_slice")

    def read_resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """One resource.k8s.io/v1 ResourceClaim (kubelet names it in NodePrepareResources); raises `KubeNotFound`."""
        return self._request("GET", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}",
                             what=f"read ResourceClaim {namespace}/{name}")
