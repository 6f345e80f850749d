"""The controller's connection to the Kubernetes API: requests, lists and watches.

`KubeRequests` is the plumbing `kube.KubeApi` (the calls per kind) stands on. Requests go over
`transport.Transport` (per-thread keep-alive connections set up from the kubernetes client's
`Configuration`: kubeconfig, TLS, token), and so do watches, each on a connection of its own;
where the configuration asks for an HTTP proxy, everything goes through the client's urllib3
pool instead. JSON is read and written with orjson:
parsing watch events and answers is the controller's most frequent work.
Every failure becomes an exception of `elasticgpu.controller.errors` here: 404 -> NotFound,
409 -> Conflict / AlreadyExists, 400/422 -> Rejected, anything else -> ApiUnavailable.
Whether the server answers at all is tracked in `reachability` (one WARNING when it stops, one
INFO when it is back).
"""

from __future__ import annotations

import functools
import http.client
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import orjson
import urllib3
from kubernetes import client

from elasticgpu.api import names
from elasticgpu.controller import errors
from elasticgpu.controller.edge.reachability import Reachability
from elasticgpu.controller.edge.transport import Transport
from elasticgpu.controller.settings import ApiSettings

if TYPE_CHECKING:
    from elasticgpu.controller.metrics import ControllerMetrics

Body = dict[str, Any]

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
_JSON = "application/json"
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
"""Asks a list for each object's metadata only (kind PartialObjectMetadata), as client-go's
metadata informers do: the periodic relist compares resourceVersions and uids, not bodies."""

_BASE = f"/apis/{names.GROUP}/{names.VERSION}"
WATCH_READ_MARGIN_S = 15.0
"""Seconds a watch may stay silent beyond its server-side timeout before the client gives up
on it: a half-open connection (a node or load balancer that vanished) ends within that, instead
of stalling its kind until the next relist."""


POD_SELECTOR = f"{names.LABEL_USES_CLAIMS}=true"
"""The pods the controller lists and watches: those the admission webhook labelled as using
claims, never every pod of the cluster."""

_writes = threading.local()


def writes_on_this_thread() -> int:
    """Write requests (any method but GET) this thread has sent: a sync that sent none left its
    objects as it found them (`settled.SettledKeys`: the resync may leave it alone)."""
    return int(getattr(_writes, "count", 0))


def _selector_of(collection: str) -> str | None:
    """The label selector of a watched collection: pods are watched through `POD_SELECTOR`."""
    return POD_SELECTOR if collection.endswith("/pods") else None


@functools.lru_cache(maxsize=256)
def _query_string(items: tuple[tuple[str, str], ...]) -> str:
    """`urlencode(items)`, remembered: most calls send one of a few queries (the write query:
    `fieldManager`), and encoding one cost as much as framing the answer."""
    return urlencode(items)


_VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def _verb(method: str) -> str:
    """The RBAC verb of an HTTP method (the label of the API error counter)."""
    return _VERBS.get(method.upper(), method.lower())


def _resource_of(path: str) -> str:
    """The plural resource a REST path names ("gpus", "elasticgpuclaims", ...), subresource dropped."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    for index, part in enumerate(parts):
        if part == "namespaces" and index + 2 < len(parts):
            return parts[index + 2]
    plural = parts[3] if parts[:1] == ["apis"] and len(parts) > 3 else parts[2] if len(parts) > 2 else ""
    return plural


def _kind_of(path: str) -> tuple[str, str]:
    """(kind, name) of a REST path, for error messages."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    kinds = {
        names.PLURAL_GPU: names.KIND_GPU,
        names.PLURAL_ELASTIC_GPU: names.KIND_ELASTIC_GPU,
        names.PLURAL_CLAIM: names.KIND_CLAIM,
        names.PLURAL_CLASS: names.KIND_CLASS,
        "pods": "Pod",
        "events": "Event",
        "nodes": "Node",
    }
    for index, part in enumerate(parts):
        if part in kinds:
            name = parts[index + 1] if index + 1 < len(parts) else ""
            return kinds[part], name
    return "object", path


class KubeRequests:
    """One connection to the API server: requests, paged lists and watches, with every failure
    translated into `controller.errors` and counted. `kube.KubeApi` adds the calls per kind."""

    def __init__(self, api_client: client.ApiClient, *, settings: ApiSettings | None = None) -> None:
        self._api = api_client
        self.settings = settings or ApiSettings()
        configuration = api_client.configuration
        self._transport = None if configuration.proxy else Transport(configuration)
        self.reachability = Reachability(str(configuration.host))
        self.metrics: ControllerMetrics | None = None
        """Counts API errors and conflicts when set (`Operability` sets it)."""

    @property
    def configuration(self) -> client.Configuration:
        """The kubernetes client's configuration (server, TLS, token): kopf logs in with it."""
        configuration: client.Configuration = self._api.configuration
        return configuration

    def end_watches(self, readers: Iterable[threading.Thread]) -> None:
        """End the watches the threads `readers` read at once (`Transport.end_watches`; a watch
        through a proxy ends at its timeout)."""
        if self._transport is not None:
            self._transport.end_watches(readers)

    def close(self) -> None:
        """Release the HTTP connections."""
        if self._transport is not None:
            self._transport.close()
        self._api.close()  # type: ignore[no-untyped-call]

    # -- plumbing ------------------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        *,
        body: object = None,
        query: Mapping[str, str] | None = None,
        content_type: str = _JSON,
        timeout_s: float | None = None,
        accept: str = _JSON,
    ) -> Body:
        if method != "GET":
            _writes.count = getattr(_writes, "count", 0) + 1
        try:
            status, data = self._send(method, path, body=body, query=query, content_type=content_type,
                                      timeout_s=timeout_s, accept=accept)
        except errors.ApiUnavailable as err:
            self.reachability.failed(err)
            if self.metrics is not None:
                self.metrics.api_error(code=None, verb=_verb(method))
            raise
        self.reachability.answered()
        if 200 <= status < 300:
            return orjson.loads(data) if data else {}
        if self.metrics is not None:
            self.metrics.api_error(code=status, verb=_verb(method))
            if status == 409:
                self.metrics.conflict(resource=_resource_of(path))
        self._raise(status, method, path, data)
        raise AssertionError("unreachable")  # pragma: no cover

    def _send(
        self,
        method: str,
        path: str,
        *,
        body: object,
        query: Mapping[str, str] | None,
        content_type: str,
        timeout_s: float | None,
        accept: str = _JSON,
    ) -> tuple[int, bytes]:
        """The HTTP status and body of one request; ApiUnavailable when no answer came back."""
        if self._transport is None:
            return self._call_via_client(method, path, body=body, query=query, content_type=content_type,
                                         timeout_s=timeout_s, accept=accept)
        target = f"{path}?{_query_string(tuple(query.items()))}" if query else path
        try:
            return self._transport.request(
                method, target, body=None if body is None else orjson.dumps(body), content_type=content_type,
                timeout_s=timeout_s or self.settings.request_timeout_s, accept=accept)
        except (OSError, http.client.HTTPException) as err:
            raise errors.ApiUnavailable(f"{method} {path}: {err!r}; is the API server up?", status=0) from err

    def _call_via_client(
        self,
        method: str,
        path: str,
        *,
        body: object,
        query: Mapping[str, str] | None,
        content_type: str,
        timeout_s: float | None,
        accept: str = _JSON,
    ) -> tuple[int, bytes]:
        """The same request through the kubernetes client's urllib3 pool (which knows proxies)."""
        query_params = list((query or {}).items())
        headers = {"Accept": accept}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            _method, url, header_params, serialized, _post = self._api.param_serialize(
                method=method,
                resource_path=path,
                query_params=query_params,
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self._api.call_api(
                method,
                url,
                header_params=header_params,
                body=serialized,
                _request_timeout=timeout_s or self.settings.request_timeout_s,
            )
            data = response.read()  # type: ignore[no-untyped-call]
        except client.ApiException as err:
            raise errors.ApiUnavailable(f"{method} {path}: {err.reason}; is the API server up?", status=0) from err
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise errors.ApiUnavailable(f"{method} {path}: {err}; is the API server up?", status=0) from err
        return int(response.status), data

    @staticmethod
    def _raise(status: int, method: str, path: str, data: bytes | None) -> None:
        try:
            payload = orjson.loads(data or b"{}")
        except orjson.JSONDecodeError:
            payload = None
        if not isinstance(payload, dict):
            payload = {"message": (data or b"").decode(errors="replace")}
        message = str(payload.get("message") or f"HTTP {status}")
        reason = str(payload.get("reason") or "")
        kind, name = _kind_of(path)
        if status == 404:
            raise errors.NotFound(kind=kind, name=name, fix="it was deleted or never created")
        if status == 409 and reason == "AlreadyExists":
            raise errors.AlreadyExists(f"{kind} {name} already exists: {message}", status=status)
        if status == 409:
            raise errors.Conflict(f"{kind} {name} changed since it was read: {message}; re-read it", status=status)
        if status in (400, 422):
            raise errors.Rejected(f"{kind} {name}: the API server refused {method}: {message}", status=status)
        raise errors.ApiUnavailable(f"{method} {path}: HTTP {status}: {message}", status=status)

    def _list(self, path: str, *, label_selector: str | None = None, field_selector: str | None = None,
              timeout_s: float = 60.0, accept: str = _JSON) -> tuple[list[Body], str]:
        """Every item of a collection (pages of 500) and the list's resourceVersion; each page
        waits at most `timeout_s` (60 s by default: a page of 500 large objects on a busy server).
        `accept`: `METADATA_LIST` for each item's metadata only."""
        items: list[Body] = []
        token = ""
        while True:
            page, resource_version, token = self.list_page(path, label_selector=label_selector,
                                                           field_selector=field_selector, token=token,
                                                           timeout_s=timeout_s, accept=accept)
            items.extend(page)
            if not token:
                return items, resource_version

    def list_page(self, path: str, *, label_selector: str | None = None, field_selector: str | None = None,
                  limit: int = 500, token: str = "", timeout_s: float = 60.0,
                  accept: str = _JSON) -> tuple[list[Body], str, str]:
        """One page of a paged list (the first, or the one `token` continues to): its items, the
        list's resourceVersion and the token of the next page ("" after the last). A caller that
        retries a failed page with the same token resumes the list where it broke."""
        query: dict[str, str] = {"limit": str(limit)}
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        if token:
            query["continue"] = token
        page = self._call("GET", path, query=query, timeout_s=timeout_s, accept=accept)
        meta = page.get("metadata") or {}
        return list(page.get("items") or []), str(meta.get("resourceVersion") or ""), str(meta.get("continue") or "")

    @staticmethod
    def _cluster(plural: str, name: str = "", *, status: bool = False) -> str:
        path = f"{_BASE}/{plural}"
        if name:
            path += f"/{name}"
        return path + ("/status" if status else "")

    @staticmethod
    def _claims(namespace: str | None, name: str = "", *, status: bool = False) -> str:
        path = f"{_BASE}/namespaces/{namespace}/{names.PLURAL_CLAIM}" if namespace else f"{_BASE}/{names.PLURAL_CLAIM}"
        if name:
            path += f"/{name}"
        return path + ("/status" if status else "")

    def _write_query(self) -> dict[str, str]:
        return {"fieldManager": self.settings.field_manager}

    # -- watching ------------------------------------------------------------------------------

    def collection_path(self, kind: str, namespace: str | None = None) -> str:
        """REST path of the collection the controller watches for `kind` (claim, egpu, gpu,
        class, pod, node, namespace, quota); `namespace` limits claims, pods and quotas to one namespace (nodes
        and namespaces are cluster-scoped: always the whole collection)."""
        if kind == "claim":
            return self._claims(namespace)
        if kind == "pod":
            return f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
        if kind == "node":
            return "/api/v1/nodes"
        if kind == "namespace":
            return "/api/v1/namespaces"
        if kind == "quota":
            where = f"/namespaces/{namespace}" if namespace else ""
            return f"/apis/{names.GROUP}/{names.VERSION}{where}/{names.PLURAL_QUOTA}"
        plural = {"egpu": names.PLURAL_ELASTIC_GPU, "gpu": names.PLURAL_GPU, "class": names.PLURAL_CLASS}[kind]
        return self._cluster(plural)

    def list_collection(self, path: str, *, accept: str = _JSON) -> tuple[list[Body], str]:
        """Every object of a collection and the resourceVersion to watch it from (pods: only
        those that use claims, `POD_SELECTOR`); `accept` `METADATA_LIST`: each one's metadata only."""
        return self._list(path, label_selector=_selector_of(path), accept=accept)

    def watch(self, path: str, *, resource_version: str, timeout_s: int = 300,
              read_timeout_s: float | None = None) -> Iterator[Body]:
        """Watch events (`{"type", "object"}`) of a collection from `resource_version`. The server
        ends the watch after `timeout_s`; the client gives up on a connection silent for
        `read_timeout_s` (default `timeout_s + WATCH_READ_MARGIN_S`) with ApiUnavailable."""
        read_timeout = read_timeout_s if read_timeout_s is not None else timeout_s + WATCH_READ_MARGIN_S
        query = {"watch": "true", "resourceVersion": resource_version, "timeoutSeconds": str(timeout_s),
                 "allowWatchBookmarks": "true"}
        selector = _selector_of(path)
        if selector:
            query["labelSelector"] = selector
        if self._transport is None:
            yield from self._watch_via_client(path, query, read_timeout)
            return
        try:
            stream = self._transport.stream(f"{path}?{urlencode(query)}", connect_timeout_s=10.0,
                                            read_timeout_s=read_timeout)
        except (OSError, http.client.HTTPException) as err:
            unavailable = errors.ApiUnavailable(f"watch {path}: {err!r}")
            self.reachability.failed(unavailable)
            raise unavailable from err
        self.reachability.answered()
        try:
            if stream.status != 200:
                self._raise(stream.status, "WATCH", path, stream.read())
            for line in stream.lines():
                yield orjson.loads(line)
        except (OSError, http.client.HTTPException) as err:
            raise errors.ApiUnavailable(f"watch {path}: {err!r}") from err
        finally:
            stream.close()

    def _watch_via_client(self, path: str, query: dict[str, str], read_timeout: float) -> Iterator[Body]:
        """The same watch through the kubernetes client's urllib3 pool (which knows proxies)."""
        _method, url, headers, _body, _post = self._api.param_serialize(
            method="GET", resource_path=path, query_params=list(query.items()), header_params={"Accept": _JSON},
            auth_settings=["BearerToken"])
        try:
            response = self._api.rest_client.pool_manager.request(
                "GET", url, headers=headers, preload_content=False, retries=False,  # the informer retries
                timeout=urllib3.Timeout(connect=10, read=read_timeout))
        except (urllib3.exceptions.HTTPError, OSError) as err:
            unavailable = errors.ApiUnavailable(f"watch {path}: {err}")
            self.reachability.failed(unavailable)
            raise unavailable from err
        self.reachability.answered()
        try:
            if response.status != 200:
                self._raise(response.status, "WATCH", path, response.read())
            buffer = b""
            for chunk in response.stream(65536, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield orjson.loads(line)
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise errors.ApiUnavailable(f"watch {path}: {err}") from err
        finally:
            response.release_conn()
