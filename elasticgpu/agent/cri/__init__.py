"""The CRI front: a proxy between kubelet and the container runtime, over the injection core.

    proxy.py        CriProxy: the grpc server kubelet talks to; the only runtime-socket user
    front.py        nginx on kubelet's socket, sending only the proxy's three methods to the proxy
    translating.py  CRI protobuf <-> the core's plain values (request in, one edit out)
    api.py          the CRI v1 messages and stubs, compiled from the vendored api.proto
    supervising.py  CriHook: the CDI spec kept true and the proxy kept serving, in the agent

The decisions live in the injection core (elasticgpu/agent/injecting), which the NRI front
(elasticgpu/agent/nri) shares; this room never imports that one (an import contract says so).

The agent (running.py) wires them: `ClaimView(kube=..., cards=...)`, then
`CriHook(settings=HookSettings(proxy=ProxySettings(listen=..., upstream=...)), view=..., ledger=...)`,
whose thread writes the CDI spec and runs `CriProxy(..., container_hooks=GatedHooks(...))`.
"""

from elasticgpu.agent.cri.proxy import CriProxy, ProxySettings
from elasticgpu.agent.cri.supervising import CriHook, HookSettings

__all__ = [
    "CriHook",
    "CriProxy",
    "HookSettings",
    "ProxySettings",
]
