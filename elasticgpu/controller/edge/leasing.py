"""The leader's Lease client on a connection of its own (`leader.LeaseClient` over `transport`).

Why not `leader.KubernetesLeases` (kubernetes.client's CoordinationV1Api over urllib3) for the
controller (issue 49 item 2, leases lost during a 16,000-card fill):

- urllib3 retries a read that timed out, up to three times, each with the whole timeout again:
  a renewal cut to the 0.4 s left before the renew deadline ran on past it, and a 4 s timeout
  became 16 s. Here a timeout is one timeout; the renew loop decides what comes next.
- the client's per-call work (parameter checks, sanitising the body, urllib3's pool and header
  handling) is Python bytecode that, in a process whose binder and informers keep the GIL
  busy, waits for the GIL again at every step. The lean `transport.Transport` does one
  `sendall` and reads the answer in blocks: fewer steps, each one a wait at most.

Own `Transport` instance, so its own keep-alive connection: a renewal never waits behind the
binder's requests, as client-go gives leader election a client of its own.
"""

from __future__ import annotations

import http.client
import threading
from typing import Any

import orjson

from elasticgpu.controller import errors
from elasticgpu.controller.edge.leader import KubernetesLeases, LeaseClient
from elasticgpu.controller.edge.transport import Transport

__all__ = ["TransportLeases", "own_leases"]

Body = dict[str, Any]

_PATH = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"


class TransportLeases:
    """`leader.LeaseClient` over a `Transport` of its own (dicts in, dicts out)."""

    def __init__(self, transport: Transport) -> None:
        """`transport`: one connection shared by the threads (`per_thread=False`); requests are
        serialised here."""
        self._transport = transport
        self._lock = threading.Lock()

    @classmethod
    def on(cls, configuration: Any) -> TransportLeases:
        """Leases through their own connection on `configuration` (a kubernetes.client.Configuration,
        the controller's: same server, TLS and token). Not for a configuration with a proxy
        (`Transport` does not speak to proxies): `leader.KubernetesLeases.on` serves that."""
        return cls(Transport(configuration, per_thread=False))

    def _call(self, what: str, method: str, path: str, body: Body | None, *, timeout_s: float) -> tuple[int, bytes]:
        payload = None if body is None else orjson.dumps(body)
        try:
            with self._lock:
                status, data = self._transport.request(method, path, body=payload, content_type="application/json",
                                                       timeout_s=timeout_s)
        except (OSError, http.client.HTTPException) as err:
            raise errors.ApiUnavailable(f"{what}: no answer ({err!r}; timeout {timeout_s:.1f}s); is the API server "
                                        "up, and not overloaded?") from None
        if status == 409:
            raise errors.Conflict(f"{what}: HTTP 409: {_message(data)}", status=409)
        if not 200 <= status < 300 and status != 404:
            raise errors.ApiUnavailable(f"{what}: HTTP {status}: {_message(data)}", status=status)
        return status, data

    def get(self, namespace: str, name: str, *, timeout_s: float = 4.0) -> Body | None:
        """The Lease `namespace/name`, or None when it does not exist."""
        what = f"get Lease {namespace}/{name}"
        status, data = self._call(what, "GET", f"{_PATH.format(namespace=namespace)}/{name}", None,
                                  timeout_s=timeout_s)
        if status == 404:
            return None
        return _body(data)

    def create(self, namespace: str, body: Body, *, timeout_s: float = 4.0) -> Body:
        """Create the Lease; `errors.Conflict` when it exists."""
        what = f"create Lease {namespace}/{body['metadata']['name']}"
        status, data = self._call(what, "POST", _PATH.format(namespace=namespace), body, timeout_s=timeout_s)
        if status == 404:
            raise _missing(what, data)
        return _body(data)

    def replace(self, namespace: str, name: str, body: Body, *, timeout_s: float = 4.0) -> Body:
        """PUT the Lease (resourceVersion precondition in the body)."""
        what = f"update Lease {namespace}/{name}"
        status, data = self._call(what, "PUT", f"{_PATH.format(namespace=namespace)}/{name}", body,
                                  timeout_s=timeout_s)
        if status == 404:
            raise _missing(what, data)
        return _body(data)

    def close(self) -> None:
        """Close the connection."""
        self._transport.close()


def _body(data: bytes) -> Body:
    body: Body = orjson.loads(data)
    return body


def _message(data: bytes) -> str:
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        return data[:300].decode(errors="replace")
    return str(payload.get("message") if isinstance(payload, dict) else payload)[:300]


def _missing(what: str, data: bytes) -> errors.ApiUnavailable:
    """A 404 on a write: the Lease API or the namespace is missing (the elector says which, and the fix)."""
    return errors.ApiUnavailable(f"{what}: HTTP 404: {_message(data)}", status=404)


def own_leases(configuration: Any) -> LeaseClient:
    """The controller's Lease client on `configuration`: a `TransportLeases` of its own, or where
    the configuration names an HTTP proxy (which `Transport` does not speak to), the kubernetes
    client's (`KubernetesLeases.on`, without urllib3's retries)."""
    if getattr(configuration, "proxy", None):
        return KubernetesLeases.on(configuration)
    return TransportLeases.on(configuration)
