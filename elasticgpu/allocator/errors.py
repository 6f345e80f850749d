"""Exceptions the allocator raises on purpose.

    ElasticGPUError (elasticgpu.api.errors)
    └── AllocatorError           base of the allocator's errors
        ├── UnknownObject        a node, card or reservation key the inventory does not hold
        ├── DuplicateObject      a node or card added twice with different records
        └── ReservationConflict  a reservation would oversubscribe a card, share a whole card,
                                 or reuse a claim key with another placement

A placement that does not fit is not an error: `Allocator.place` returns `Unplaceable` with an
explanation instead, because "nothing fits" is the normal answer for a Pending claim.
"""

from __future__ import annotations

from elasticgpu.api.errors import ElasticGPUError


class AllocatorError(ElasticGPUError):
    """Base of the allocator's errors."""


class UnknownObject(AllocatorError):
    """A node, card or reservation that the inventory does not hold."""

    def __init__(self, *, kind: str, name: str, fix: str = "") -> None:
        self.kind = kind
        self.name = name
        hint = f"; {fix}" if fix else ""
        super().__init__(f"{kind} {name} is not in the allocator's inventory{hint}")


class DuplicateObject(AllocatorError):
    """A node or card was added twice with a different record."""

    def __init__(self, *, kind: str, name: str) -> None:
        self.kind = kind
        self.name = name
        super().__init__(f"{kind} {name} is already in the inventory with another record; remove it first")


class ReservationConflict(AllocatorError):
    """A reservation cannot be recorded without breaking a capacity rule."""

    def __init__(self, *, key: str, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(f"reservation {key}: {reason}; nothing was reserved, re-plan the claim")
