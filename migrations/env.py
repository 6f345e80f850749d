"""Alembic environment of the agent's ledger.

The agent runs migrations itself (`LedgerStore.open`, `elasticgpu agent db upgrade`): it passes
an open connection in `config.attributes["connection"]`. Run by hand (`alembic -x url=...`), the
URL comes from `-x url=` or the config's `sqlalchemy.url`.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from elasticgpu.agent.ledger.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    # render_as_batch: SQLite cannot ALTER most things; batch mode copies the table instead.
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Migrate through the connection the agent gave, or one made from the URL."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("no database URL: pass -x url=sqlite:////path/to/ledger.db")
    engine = create_engine(url)
    with engine.begin() as connection:
        _run(connection)
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported for the ledger; run them against the database")
run_migrations_online()
