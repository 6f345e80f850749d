"""The CRI-facing hook: a proxy between kubelet and the container runtime that injects claimed GPUs.

    proxy.py        CriProxy: the grpc server kubelet talks to; the only runtime-socket user
    hooks.py        what the proxy asks of the agent around CreateContainer/RemoveContainer
    claim_hooks.py  ClaimHooks: injection decisions recorded in the ledger in two phases
    injection.py    the pure decision for one container (AgentView: the agent's picture)
    cdi.py          the CDI spec of the node's cards, written atomically
    limits_file.py  per-claim limits files, mounted read-only into claim containers (a resize reaches them)
    driver.py       the driver's files (libraries, binaries, firmware) the spec mounts
    api.py          the CRI v1 messages and stubs, compiled from the vendored api.proto
    claim_view.py   ClaimView: the AgentView read from the API server by name, on demand
    supervising.py  CriHook: the CDI spec kept true and the proxy kept serving, in the agent

The agent (running.py) wires them: `ClaimView(kube=..., cards=...)`, then
`CriHook(settings=HookSettings(proxy=ProxySettings(listen=..., upstream=...)), view=..., ledger=...)`,
whose thread writes the CDI spec and runs `CriProxy(..., container_hooks=ClaimHooks(view=..., ledger=...))`.
"""

from elasticgpu.agent.cri.cdi import CardDevice, DeviceNode, write_spec
from elasticgpu.agent.cri.claim_hooks import ClaimHooks
from elasticgpu.agent.cri.claim_view import ClaimView
from elasticgpu.agent.cri.hooks import ContainerHooks, PassThrough, PreparedCreate, Refused
from elasticgpu.agent.cri.injection import (
    AgentView,
    CardInfo,
    CdiForm,
    ClaimInfo,
    ClaimUser,
    ContainerEdit,
    ContainerRequest,
    InjectionSettings,
    PodRef,
    decide,
)
from elasticgpu.agent.cri.proxy import CriProxy, ProxySettings
from elasticgpu.agent.cri.supervising import CriHook, HookSettings

__all__ = [
    "AgentView",
    "CardDevice",
    "CardInfo",
    "CdiForm",
    "ClaimHooks",
    "ClaimInfo",
    "ClaimUser",
    "ClaimView",
    "ContainerEdit",
    "ContainerHooks",
    "ContainerRequest",
    "CriHook",
    "CriProxy",
    "DeviceNode",
    "HookSettings",
    "InjectionSettings",
    "PassThrough",
    "PodRef",
    "PreparedCreate",
    "ProxySettings",
    "Refused",
    "decide",
    "write_spec",
]
