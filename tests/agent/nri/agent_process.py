"""The agent's NRI side as a process of its own, for the kill -9 tests: the NRI front on the core's
hooks, its plugin as a child. `crash_at=started` kills the process with SIGKILL right after the
core recorded a claim container's ledger row `started`, before the plugin gets its answer.

    python -m tests.agent.nri.agent_process <nri socket> <agent socket> <plugin> <ledger url> <view file>
        <cdi dir> [crash_at]
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

from elasticgpu.agent.injecting import claim_hooks, hooks, injection
from elasticgpu.agent.ledger import store
from elasticgpu.agent.nri import FrontServer, NriFront, PluginProcess, PluginSettings
from tests.agent.cri.node import View


class CrashingHooks(claim_hooks.ClaimHooks):
    def __init__(self, crash_at: str, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.crash_at = crash_at

    def prepare_create(self, request: injection.ContainerRequest) -> hooks.PreparedCreate:
        prepared = super().prepare_create(request)
        if self.crash_at == "started" and prepared.token is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return prepared


def main(argv: list[str]) -> None:
    nri_socket, agent_socket, plugin, ledger_url, view_file, cdi_dir = argv[:6]
    crash_at = argv[6] if len(argv) > 6 else ""
    ledger = store.LedgerStore.open(ledger_url)
    view = View.from_json(Path(view_file).read_text())
    core = CrashingHooks(crash_at, view=view, ledger=ledger)
    front = NriFront(hooks=core, view=view, cdi_dir=Path(cdi_dir))
    server = FrontServer(front, Path(agent_socket)).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    process = PluginProcess(PluginSettings(binary=plugin, nri_socket=Path(nri_socket), agent_socket=Path(agent_socket)))
    thread = threading.Thread(target=process.run, args=(stop,), daemon=True)
    thread.start()
    if front.synchronized.wait(30):
        print("synchronized", flush=True)
    stop.wait()
    thread.join(10)
    server.close()
    core.close()
    ledger.close()


if __name__ == "__main__":
    main(sys.argv[1:])
