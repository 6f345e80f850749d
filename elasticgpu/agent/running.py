"""Start-up and shutdown of the agent: open discovery and the ledger, start the loops, stop on a signal."""

from __future__ import annotations

import logging
import signal
import threading

from elasticgpu.agent import discovery
from elasticgpu.agent.ledger.store import LedgerStore
from elasticgpu.agent.settings import AgentSettings

logger = logging.getLogger(__name__)


def main(settings: AgentSettings, *, log_level: str = "info") -> int:
    """Run the agent until SIGTERM or SIGINT; returns the exit code. Raises `AgentError` for what the operator fixes."""
    logging.basicConfig(
        level=getattr(logging, log_level.upper()),
        format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
    )
    node = settings.kube.node_name or "local"
    backend = discovery.open_backend(
        settings.discovery.backend, node_name=node, simulation_file=settings.discovery.simulation,
        device_dir=settings.discovery.device_dir, inject_dir=settings.discovery.inject_dir,
    )
    ledger = LedgerStore.open(settings.ledger.ledger_url)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        snapshot = backend.snapshot()
        logger.info("discovered %d card(s) with backend %s: %s", len(snapshot.cards), backend.name,
                    ", ".join(f"{c.index}:{c.uuid} {c.model} {c.memory_mib}MiB" for c in snapshot.cards))
        stop.wait()
    finally:
        ledger.close()
        backend.close()
    return 0
