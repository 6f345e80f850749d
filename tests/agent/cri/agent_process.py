"""The CRI proxy with claim hooks as its own process, for kill -9 tests.

    python -m tests.agent.cri.agent_process LISTEN UPSTREAM LEDGER_URL VIEW_JSON_FILE [CRASH_AT]

CRASH_AT `started`: SIGKILL itself right after the ledger row is written, before the runtime is
called; `created`: right after the runtime created the container, before the row is completed.
Prints `reconciled` once the start-up reconciliation is done; runs until SIGTERM.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from elasticgpu.agent.cri.proxy import CriProxy, ProxySettings
from elasticgpu.agent.injecting import claim_hooks, hooks
from elasticgpu.agent.ledger import store
from tests.agent.cri.node import View


class CrashingHooks(claim_hooks.ClaimHooks):
    def __init__(self, crash_at: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.crash_at = crash_at

    def prepare_create(self, request: Any) -> hooks.PreparedCreate:
        prepared = super().prepare_create(request)
        if self.crash_at == "started" and prepared.token is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return prepared

    def created(self, prepared: hooks.PreparedCreate, container_id: str) -> None:
        if self.crash_at == "created" and prepared.token is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        super().created(prepared, container_id)


def main(argv: list[str]) -> None:
    listen, upstream, ledger_url, view_file = argv[:4]
    crash_at = argv[4] if len(argv) > 4 else ""
    ledger = store.LedgerStore.open(ledger_url)
    agent_hooks = CrashingHooks(crash_at, view=View.from_json(Path(view_file).read_text()), ledger=ledger)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with CriProxy(ProxySettings(listen=Path(listen), upstream=upstream), container_hooks=agent_hooks) as proxy:
        proxy.reconciled.wait(30)
        print("reconciled", flush=True)
        stop.wait()
    agent_hooks.close()
    ledger.close()


if __name__ == "__main__":
    main(sys.argv[1:])
