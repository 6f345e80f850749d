"""The kubelet plugin protocols of a DRA driver, compiled at import from the vendored protos.

Pinned to k8s.io/kubelet v0.36.3 (the protos are byte-for-byte its files, under a header line):
- `pluginregistration_v1.proto`: kubelet's plugin watcher calls `GetInfo` on the registration
  socket the driver puts under `<kubelet root>/plugins_registry/`, then `NotifyRegistrationStatus`.
- `dra_v1.proto` (`k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`): what kubelet 1.34, 1.35 and 1.36
  prefer; `dra_v1beta1.proto` (`...dra.v1beta1.DRAPlugin`): what 1.32 and 1.33 speak and 1.34-1.36
  still accept. The messages are the same but for v1's `Device.share_id` (consumable capacity),
  so one servicer serves both; the registration lists v1 first (kubelet picks the first it knows).

Compiled with the project's grpcio-tools, as the CRI proto is (elasticgpu/agent/cri/api.py says why).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import grpc

DRA_PLUGIN_TYPE = "DRAPlugin"
"""`PluginInfo.type` of a DRA driver (k8s.io/kubelet/pkg/apis/pluginregistration/v1 constants.go)."""
DRA_V1_SERVICE = "v1.DRAPlugin"
DRA_V1BETA1_SERVICE = "v1beta1.DRAPlugin"
SUPPORTED_SERVICES = (DRA_V1_SERVICE, DRA_V1BETA1_SERVICE)
"""`PluginInfo.supported_versions`: the services served, newest first, under kubelet's short labels
(`DRAPluginService` in k8s.io/kubelet's dra/v1 and v1beta1 types.go), not their gRPC names: kubelet
1.36 refuses `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin` ("none of services supported by the plugin
are supported by the kubelet"). The calls still go to the gRPC paths of the protos' packages."""


def _load(name: str) -> tuple[Any, Any]:
    root = str(Path(__file__).resolve().parents[3])
    if root not in sys.path:
        sys.path.append(root)
    protos, stubs = grpc.protos_and_services(f"elasticgpu/agent/dra/{name}.proto")
    return protos, stubs


registration_pb, registration_services = _load("pluginregistration_v1")
dra_v1_pb, dra_v1_services = _load("dra_v1")
dra_v1beta1_pb, dra_v1beta1_services = _load("dra_v1beta1")
