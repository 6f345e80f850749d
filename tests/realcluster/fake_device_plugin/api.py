"""The device plugin API v1beta1 messages and stubs, compiled at import from the vendored `api.proto` with
grpcio-tools, as elasticgpu/agent/cri/api.py does for CRI (no PyPI package carries this proto)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import grpc

API_VERSION = "v1beta1"


def _load() -> tuple[Any, Any]:
    # grpc finds the proto through sys.path and names the generated modules after its path.
    root = str(Path(__file__).resolve().parents[3])
    if root not in sys.path:
        sys.path.append(root)
    protos, stubs = grpc.protos_and_services("tests/realcluster/fake_device_plugin/api.proto")
    return protos, stubs


pb, services = _load()
