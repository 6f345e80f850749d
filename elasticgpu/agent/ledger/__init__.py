"""The agent's ledger: allocations and usage samples in a database migrated by Alembic."""

from elasticgpu.agent.ledger.store import Allocation, LedgerStore, UsageSample

__all__ = ["Allocation", "LedgerStore", "UsageSample"]
