"""The injection core: one pass from a container as the runtime describes it to its one edit.

Both node hooks are fronts over it (DESIGN.md, "The node hook: NRI beside the CRI proxy"): the
CRI proxy (elasticgpu/agent/cri) and the NRI plugin (elasticgpu/agent/nri) translate their wire
format into `ContainerRequest`, call the hooks, and write the `ContainerEdit` they get back (env,
CDI devices and the device nodes they stand for, mounts, annotations) into their own answer; a
`Refused` fails the creation with the same words in both. Nothing here knows either front.

    injection.py      the pure decision for one container (AgentView: the agent's picture)
    hooks.py          ContainerHooks: what a front asks around create/remove, in plain values
    refused.py        Refused: how the core says no to a container (hooks passes it on)
    claim_hooks.py    ClaimHooks: injection decisions recorded in the ledger in two phases
    gated.py          GatedView/GatedHooks: the hooks while the agent's parts are opening; ledger rebuild
    dra_containers.py containers of ResourceClaims our DRA driver prepared: their claim, isolation, marker
    card_sharing.py   whether a claim fits on its cards beside the claims running there
    cdi.py            the CDI spec of the node's cards, written atomically; and read back (`resolve`)
    limits_file.py    per-claim limits files, mounted read-only into claim containers
    driver.py         the driver's files (libraries, binaries, firmware) the spec mounts
    claim_view.py     ClaimView: the AgentView read from the API server by name, on demand
    mig_annotation.py the container annotation naming its MIG instance
    atomic_file.py    files replaced atomically
"""

from elasticgpu.agent.injecting.cdi import CardDevice, DeviceNode, write_spec
from elasticgpu.agent.injecting.claim_hooks import ClaimHooks
from elasticgpu.agent.injecting.claim_view import ClaimView
from elasticgpu.agent.injecting.gated import GatedHooks, GatedView
from elasticgpu.agent.injecting.hooks import ContainerHooks, PassThrough, PreparedCreate, Refused, RuntimeContainer
from elasticgpu.agent.injecting.injection import (
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
    "DeviceNode",
    "GatedHooks",
    "GatedView",
    "InjectionSettings",
    "PassThrough",
    "PodRef",
    "PreparedCreate",
    "Refused",
    "RuntimeContainer",
    "decide",
    "write_spec",
]
