"""Who owns a card, read from its GPU object: `spec.owner` (what the platform team wants) and
`status.owner` (what the controller made effective), `ElasticGPU` or `DRA`.

Read from the raw object, defensively: an object written before the fields existed, or by a
controller that does not know them, has neither, and a card nobody handed to DRA is ours. Anything
but the exact value `DRA` counts as ours too, so a typo never hands a card to two allocators.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DRA = "DRA"
ELASTIC_GPU = "ElasticGPU"


@dataclass(frozen=True, kw_only=True)
class CardOwner:
    """The two owner fields of one GPU object."""

    desired: str
    effective: str

    @property
    def publishable(self) -> bool:
        """True when DRA may offer the card: handed over and the move complete. The moment the
        platform team asks it back (desired no longer DRA) it is not, even before the controller
        flips the effective owner, so no new ResourceClaim is allocated on it meanwhile."""
        return self.desired == DRA and self.effective == DRA

    @property
    def preparable(self) -> bool:
        """True when a claim DRA allocated on the card may be prepared: the effective owner is DRA
        (a claim allocated before a move back started still runs until it is gone)."""
        return self.effective == DRA


def _field(gpu: dict[str, Any], part: str) -> str:
    section = gpu.get(part)
    value = section.get("owner") if isinstance(section, dict) else None
    return DRA if value == DRA else ELASTIC_GPU


def owner_of(gpu: dict[str, Any]) -> CardOwner:
    """The owner fields of the GPU object `gpu` (a dict as the API server returns it)."""
    return CardOwner(desired=_field(gpu, "spec"), effective=_field(gpu, "status"))
