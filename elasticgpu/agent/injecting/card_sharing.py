"""Whether a claim fits on its cards beside the claims whose containers run there: pure, no I/O.

The controller's reservations (`status.allocations`) keep a card within its capacity, but a
reservation can be freed while the containers that used it still run (a claim deleted with its
finalizer removed by hand, an ElasticGPU failed): the controller may then bind another claim to
the same card. The agent is the last one who can tell, from its ledger's open rows, so it checks
the card itself before it gives it to a container:

    a whole-card claim (cores 100)    -> nobody else may run on the card, and it may not join anyone
    a slice                           -> the cores and the memory of every distinct claim running on
                                         the card, plus the new one, fit the card (100 %, its MiB)

Who holds a card at all is one rule, `holds_card`, which the publisher of `status.runningClaims`
(agent/holders.py) applies too: only a container that can still run holds its card. A row whose
container the runtime reports exited (a finished Job's container, kept until its pod is deleted)
or no longer lists holds nothing; a row without a container yet (`started`: the runtime's create
is in flight), or one the runtime could not be asked about, holds it (refusing is safe).

Rows of the claim being created are not counted (its own containers share its reservation; the
claim-level check in injection.py keeps it to one pod). A refusal names each holder (claim and
pods) and says that kubelet retries once they have stopped.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from elasticgpu.agent.injecting import hooks, injection
from elasticgpu.api import names


def holds_card(container_id: str | None, exited: Mapping[str, bool] | None) -> bool:
    """Whether a ledger row holds its cards: its container can still run (see the module docstring).

    `exited`: the runtime's containers by id, True for those that ran and stopped (`ListContainers`,
    hooks.RuntimeContainer.exited), or None when the runtime was not (or could not be) asked."""
    if container_id is None or exited is None:
        return True  # being created, or nobody can tell: it holds
    stopped = exited.get(container_id)
    return stopped is not None and not stopped


@dataclass(frozen=True, kw_only=True)
class Holder:
    """A claim with live containers on this node (its open ledger rows, merged)."""

    namespace: str
    name: str
    pods: tuple[injection.PodRef, ...]
    gpus: tuple[str, ...]  # uuids
    cores: int  # percent of each card (100: whole cards)
    memory_mib: int  # MiB of each card (0 for whole cards)

    @property
    def whole(self) -> bool:
        """True when the claim holds its cards whole."""
        return self.cores >= names.CORES_PER_CARD

    def __str__(self) -> str:
        pods = ", ".join(f"pod {pod}" for pod in self.pods)
        return f"ElasticGPUClaim {self.namespace}/{self.name} ({pods})"


def check(
    *,
    pod: injection.PodRef,
    container: str,
    claim: injection.ClaimInfo,
    holders: Collection[Holder],
    cards: Mapping[str, injection.CardInfo],
) -> None:
    """Raise `hooks.Refused` when a card of `claim` cannot take it beside `holders`.

    `cards`: the claim's cards by lowercased uuid (their memory is the limit of the slices)."""
    subject = f"pod {pod}, container {container!r}: ElasticGPUClaim {claim.namespace}/{claim.name}"
    for uuid in claim.gpus:
        wanted = uuid.lower()
        others = sorted(
            (h for h in holders if (h.namespace, h.name) != (claim.namespace, claim.name)
             and wanted in {g.lower() for g in h.gpus}),
            key=lambda h: (h.namespace, h.name),
        )  # fmt: skip
        if not others:
            continue
        card = cards.get(wanted)
        where = f"card {uuid}" + (f" (index {card.index})" if card is not None else "")
        running = ", ".join(str(h) for h in others)
        retry = (
            "; kubelet retries once their containers on this node have stopped (delete those pods to free the card "
            "now). A card's reservation is freed while its containers still run only when their claim was deleted "
            "by hand (its finalizer elasticgpu.io/claim-protection removed) or its ElasticGPU failed"
        )
        if claim.whole_cards or any(h.whole for h in others):
            why = "it is held whole" if any(h.whole for h in others) else "this claim needs it whole"
            raise hooks.Refused(
                f"{subject} cannot use {where}: {running} still run there and {why}; a card held whole serves "
                f"one claim at a time{retry}"
            )
        cores = claim.cores + sum(h.cores for h in others)
        memory = claim.memory_mib + sum(h.memory_mib for h in others)
        limit = card.memory_mib if card is not None else None
        if cores > names.CORES_PER_CARD or (limit is not None and memory > limit):
            shares = ", ".join(f"{h} with {h.cores}% and {h.memory_mib} MiB" for h in others)
            raise hooks.Refused(
                f"{subject} ({claim.cores}% of the cores, {claim.memory_mib} MiB) does not fit on {where} beside "
                f"{shares}: together {cores}% of the cores (at most {names.CORES_PER_CARD}%) and {memory} MiB of "
                f"its {limit} MiB{retry}"
            )
