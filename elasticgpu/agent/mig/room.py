"""Whether the agent's claim hooks carve MIG instances: the one place it is decided.

The running agent builds one `MigRoom` (running.py) and hands it to the CRI hook, as it hands
the isolation rooms; the CRI hook's gate (`cri.gated.GatedHooks`) asks it, once the ledger is
open, to wrap the claim hooks it made. The answer depends only on the device backend:

    not open yet            None: the gate waits (claims are refused, retryable, until the
                            backend is open anyway), so a MIG claim never slips past the wrap
    without `MigControl`    `MigUnsupported` around them (NVML has no MIG calls yet): a MIG
                            claim's container is refused with why, never given the whole card
    with `MigControl`       `MigHooks` around them (the simulated backend): MIG claims get
                            their instance; its start-up reconciliation converges the instances

Nothing in agent/cri branches on MIG: it only calls the wrap it was given.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from elasticgpu.agent.discovery.mig import MigControl
from elasticgpu.agent.discovery.models import Card
from elasticgpu.agent.injecting import claim_hooks, hooks, injection
from elasticgpu.agent.ledger.store import LedgerStore
from elasticgpu.agent.mig.hooks import MigHooks
from elasticgpu.agent.mig.instances import MigInstances
from elasticgpu.agent.mig.unsupported import MigUnsupported


class MigRoom:
    """The agent's MIG seam: wraps the claim hooks in `MigHooks` where the backend can carve cards."""

    def __init__(self, *, backend: Callable[[], object | None], cards: Callable[[], Sequence[Card] | None],
                 cdi_dir: Path) -> None:
        """`backend`: the device backend once open, else None; `cards`: discovery's cards (None before
        its first snapshot); `cdi_dir`: where the runtime reads CDI specs."""
        self._backend = backend
        self._cards = cards
        self._cdi_dir = cdi_dir

    def wrap(self, inner: claim_hooks.ClaimHooks, view: injection.AgentView,
             ledger: LedgerStore) -> hooks.ContainerHooks | None:
        """The hooks the proxy calls for `inner` (see the module docstring); None while the backend is not open."""
        backend = self._backend()
        if backend is None:
            return None
        if not isinstance(backend, MigControl):
            return MigUnsupported(inner=inner, view=view, backend=str(getattr(backend, "name", type(backend).__name__)))
        return MigHooks(inner=inner, view=view, instances=MigInstances(store=ledger, backend=backend),
                        cards=lambda: self._cards() or (), cdi_dir=self._cdi_dir)
