"""The CRI v1 messages and stubs, compiled at import from the vendored `api.proto`.

Why compiled here and not taken from PyPI's `container-runtime-interface-api`: that package
pins `protobuf~=6.31` and `grpcio~=1.73`, while the project's `grpcio-tools` (1.85) needs
protobuf 7; installing it would drag both back a major version. Compiling the published proto
with the `grpcio-tools` we already depend on gives code that always matches the installed
protobuf runtime, from a CRI version we choose (k8s.io/cri-api v0.36.4, which has `CDIDevice`
and every RPC kubelet 1.36 calls). It costs about 50 ms, once per process.

`pb` holds the messages (`pb.CreateContainerRequest`, ...), `services` the stubs and servicers
(`services.RuntimeServiceStub`, ...). Both are generated modules, so they are typed `Any`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

PROTO_PACKAGE = "runtime.v1"
RUNTIME_SERVICE = f"{PROTO_PACKAGE}.RuntimeService"
IMAGE_SERVICE = f"{PROTO_PACKAGE}.ImageService"


def _load() -> tuple[Any, Any]:
    # grpc finds the proto through sys.path and names the modules after its path, so the
    # generated modules become elasticgpu.agent.cri.api_pb2 / api_pb2_grpc (no clash with any
    # other package's api_pb2). The folder holding `elasticgpu/` is on sys.path for a normal
    # install; an editable install reaches the package through a finder, so add it then.
    root = str(Path(__file__).resolve().parents[3])
    if root not in sys.path:
        sys.path.append(root)
    protos, stubs = grpc.protos_and_services("elasticgpu/agent/cri/api.proto")
    return protos, stubs


pb, services = _load()


def method_path(service: str, method: str) -> str:
    """The gRPC path of a CRI method, e.g. `/runtime.v1.RuntimeService/Version`."""
    return f"/{service}/{method}"


def server_streaming_methods() -> frozenset[str]:
    """Paths of the CRI methods that answer with a stream to one request (GetContainerEvents, ...)."""
    return _methods(lambda m: m.server_streaming and not m.client_streaming)


def unary_methods() -> frozenset[str]:
    """Paths of the CRI methods with one request and one answer (all but the streams)."""
    return _methods(lambda m: not m.server_streaming and not m.client_streaming)


def known_methods() -> frozenset[str]:
    """Paths of every method of RuntimeService and ImageService in the vendored proto."""
    return _methods(lambda m: True)


def _methods(keep: Callable[[Any], bool]) -> frozenset[str]:
    return frozenset(
        method_path(service.full_name, method.name)
        for service in pb.DESCRIPTOR.services_by_name.values()
        for method in service.methods
        if keep(method)
    )
